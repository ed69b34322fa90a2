"""Inference engines: one token-in/token-out interface for the policy, the frozen LLMs and serving.

- `base`: the `Engine` protocol, `Sampling`, `Generation`, prompt checks.
- `spec`: `EngineSpec`, `engine_spec(cfg, role)` (the one place a config becomes an engine),
  `make_engine`, `EngineHolder`.
- `vllm_engine`: `VLLMEngine` (vLLM v1 AsyncLLM; CUDA or the CPU build).
- `hf_engine`: `HFEngine` (transformers fallback).
- `models`: `resolve_model` (names, directories, the PyPI Gemma 3 270M), `make_tiny_model`.
"""
