"""`scripts.bench.engine_memory`: its workloads and its summary line (the benchmark itself is not run in CI)."""

from __future__ import annotations

import itertools

import pytest

from scripts.bench.engine_memory import batches, line, summarize

PASSAGES = [" ".join(f"w{i}-{j}" for j in range(400)) for i in range(50)]


def encode(text: str) -> list[int]:
    return [hash(w) % 1000 for w in text.split()]


def test_varied_batches_change_shape_and_fixed_ones_repeat():
    varied = list(itertools.islice(batches("varied", PASSAGES, encode), 30))
    shapes = {tuple(len(p) for p, _ in b) for b in varied}
    assert len(shapes) == 30 and all(1 <= len(b) <= 16 for b in varied)
    assert all(60 <= len(p) <= 1800 and 4 <= new <= 32 for b in varied for p, new in b)
    assert varied == list(itertools.islice(batches("varied", PASSAGES, encode), 30))  # seeded
    fixed = list(itertools.islice(batches("fixed", PASSAGES, encode), 3))
    assert fixed[0] == fixed[1] == fixed[2] and len(fixed[0]) == 8


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="--workload"):
        next(batches("mixed", PASSAGES, encode))


def test_summary_rate_counts_from_minute_2_and_growth_from_the_first_sample():
    samples = [(20.0, 10, 2300.0), (120.0, 100, 2800.0), (240.0, 300, 3400.0), (360.0, 500, 3450.0)]
    s = summarize(samples, "varied", "on")
    assert s["requests_per_min"] == pytest.approx(100.0) and s["growth_mb"] == pytest.approx(1150.0)
    assert line(s) == ("engine_memory: workload=varied onednn_cache=on minutes=6.0 requests=500 "
                       "requests_per_min=100.0 worker_rss_first_mb=2300 worker_rss_last_mb=3450 growth_mb=1150")
