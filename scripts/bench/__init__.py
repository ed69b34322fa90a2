"""Benchmarks: each prints its numbers and ratios (``python -m scripts.bench.<name> --help``); none is a test."""
