"""Does the vLLM CPU engine's worker grow with the variety of batch shapes? A memory benchmark.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.engine_memory [--workload varied|fixed]
        [--minutes 6] [--onednn-cache off|on] [--model gemma3-270m] [--out FILE.json]

One `VLLMEngine` (as the rollout workers and frozen generators start it) answers batches of corpus
passages for `--minutes`:
- `varied`: 1-16 prompts a batch, each 60-1,800 tokens, 4-32 new tokens (seeded): new batch shapes all
  the time, as in training, where every step's prompts differ;
- `fixed`: the same 8 prompts and 16 new tokens every batch.

`--onednn-cache on` starts the engine with oneDNN's global primitive cache at its default size (1,024),
`off` (the engine's default, `actors.engines.cpu_env.ENGINE_ONEDNN_CACHE`) without it. Every 20 s it
samples the RSS of the engine's `VLLM::Worker` processes. Ends with one line:
`engine_memory: workload=... onednn_cache=... minutes=... requests=... requests_per_min=...
worker_rss_first_mb=... worker_rss_last_mb=... growth_mb=...`; `requests_per_min` counts from minute 2,
after the engine's warm-up. Not run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

ONEDNN_DEFAULT_CAPACITY = "1024"  # oneDNN's own default size of its global primitive cache
SAMPLE_EVERY_S = 20.0
RATE_FROM_S = 120.0


def batches(workload: str, passages: list[str], encode, seed: int = 0):
    """Endless (prompt token ids, max new tokens) batches of `workload` ("varied" or "fixed"); see the
    module docstring. Raises ValueError for another workload."""
    rng = random.Random(seed)
    if workload == "fixed":
        fixed = [encode(" ".join(passages[i:i + 1 + i % 6]))[:1800] for i in range(8)]
        while True:
            yield [(p, 16) for p in fixed]
    if workload != "varied":
        raise ValueError(f"--workload must be 'varied' or 'fixed', got {workload!r}")
    while True:
        yield [(encode(" ".join(rng.sample(passages, rng.randint(1, 8))))[:rng.randint(60, 1800)], rng.randint(4, 32))
               for _ in range(rng.randint(1, 16))]


def worker_rss_mb() -> float:
    """Summed RSS (MiB) of this process's `VLLM::Worker` descendants."""
    import psutil

    total = 0
    for p in psutil.Process().children(recursive=True):
        try:
            if "VLLM::Worker" in " ".join(p.cmdline()) or p.name().startswith("VLLM::Worker"):
                total += p.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def summarize(samples: list[tuple[float, int, float]], workload: str, onednn_cache: str) -> dict:
    """The benchmark's figures from `(seconds, requests so far, worker RSS MiB)` samples."""
    t_end, n_end, rss_end = samples[-1]
    later = [s for s in samples if s[0] >= RATE_FROM_S] or samples
    t0, n0, _ = later[0]
    rate = (n_end - n0) / ((t_end - t0) / 60) if t_end > t0 else float("nan")
    return {"workload": workload, "onednn_cache": onednn_cache, "minutes": t_end / 60, "requests": n_end,
            "requests_per_min": rate, "worker_rss_first_mb": samples[0][2], "worker_rss_last_mb": rss_end,
            "growth_mb": rss_end - samples[0][2], "samples": samples}


def line(s: dict) -> str:
    return (f"engine_memory: workload={s['workload']} onednn_cache={s['onednn_cache']} minutes={s['minutes']:.1f} "
            f"requests={s['requests']} requests_per_min={s['requests_per_min']:.1f} "
            f"worker_rss_first_mb={s['worker_rss_first_mb']:.0f} worker_rss_last_mb={s['worker_rss_last_mb']:.0f} "
            f"growth_mb={s['growth_mb']:.0f}")


async def run(args) -> dict:
    from actors.engines.base import Sampling
    from actors.engines.models import resolve_model
    from actors.engines.vllm_engine import VLLMEngine
    from pipelines.data import CORPUS_FILE, iter_corpus, resolve_data_dir

    passages = [p.text for p in iter_corpus(resolve_data_dir() / CORPUS_FILE, limit=3000)]
    engine = VLLMEngine(resolve_model(args.model), max_model_len=2048, cpu_kv_cache_gib=0.25)
    rng = random.Random(args.seed + 1)
    samples: list[tuple[float, int, float]] = []
    t0, n = time.monotonic(), 0
    try:
        for batch in batches(args.workload, passages, engine.tokenizer.encode, args.seed):
            await asyncio.gather(*[engine.generate(p, Sampling(max_tokens=new, temperature=0.8,
                                                               seed=rng.randrange(2**31))) for p, new in batch])
            n += len(batch)
            elapsed = time.monotonic() - t0
            if not samples or elapsed - samples[-1][0] >= SAMPLE_EVERY_S:
                samples.append((elapsed, n, worker_rss_mb()))
                print(f"{elapsed / 60:5.1f} min  requests={n}  worker_rss_mb={samples[-1][2]:.0f}", flush=True)
            if elapsed >= args.minutes * 60:
                break
    finally:
        await engine.shutdown()
    return summarize(samples, args.workload, args.onednn_cache)


def main(argv: list[str] | None = None) -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("varied", "fixed"), default="varied")
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--onednn-cache", choices=("off", "on"), default="off")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.minutes <= 0:
        ap.error(f"--minutes must be > 0, got {args.minutes}")
    if args.onednn_cache == "on":  # the engine keeps a value the user set (engine_onednn_cache)
        os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = ONEDNN_DEFAULT_CAPACITY
    from scripts.cli import user_errors

    with user_errors():
        summary = asyncio.run(run(args))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    print(line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
