"""Does the policy learner rank grow with the variety of sequence lengths? A memory benchmark.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.learner_memory [--workload varied|fixed]
        [--updates 24] [--seqs 8] [--onednn-cache N] [--config configs/soak_train_cpu.yaml] [--out FILE.json]

One one-rank policy `LearnerGroup`, started as training starts it (the learner settings of `--config`:
by default the training soak's, that is the main job's Gemma 3 270M, bf16, micro-batch 1, gradient
checkpointing), takes `--updates` GRPO updates of `--seqs` sequences of corpus text:
- `varied`: every update new lengths, prompts of 300-1,400 tokens and responses of 4-24 (seeded), as
  the s3 searcher's episodes, whose prompts hold the question's top-3 passages;
- `fixed`: the same batch every update.

`--onednn-cache N` starts the rank with both caches of oneDNN primitives at N: oneDNN's own
(`ONEDNN_PRIMITIVE_CACHE_CAPACITY`) and ideep's, torch's wrapper of oneDNN (`LRU_CACHE_CAPACITY`); 1024 is the
default of both. Without it the rank starts as training starts it (`actors.learner.group.rank_runtime_env`: 64).
After every update the rank reports its RSS. Ends with one line: `learner_memory: workload=...
onednn_cache=... updates=... ms_per_token_first=... ms_per_token_last=... rank_rss_first_mb=...
rank_rss_last_mb=... growth_mb=...`: RSS from after update 2 (the first builds the optimizer state) to the
end; ms per sequence token, the median over updates 2-6 and over the last 5. Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

FIRST = 1  # index of update 2: update 1 allocates AdamW's state


def batch_lengths(workload: str, seqs: int, seed: int = 0):
    """Endless lists of `seqs` (prompt tokens, response tokens) per update; see the module docstring.
    Raises ValueError for another workload."""
    rng = random.Random(seed)
    if workload == "fixed":
        fixed = [(rng.randint(300, 1400), rng.randint(4, 24)) for _ in range(seqs)]
        while True:
            yield fixed
    if workload != "varied":
        raise ValueError(f"--workload must be 'varied' or 'fixed', got {workload!r}")
    while True:
        yield [(rng.randint(300, 1400), rng.randint(4, 24)) for _ in range(seqs)]


def trajectories(lengths: list[tuple[int, int]], token_pool: list[int], update: int) -> list[dict]:
    """GRPO trajectories of these lengths cut from `token_pool` (real text), groups of 4 sequences."""
    out = []
    for i, (p, r) in enumerate(lengths):
        start = (update * 7919 + i * 104729) % max(1, len(token_pool) - p - r)
        ids = token_pool[start:start + p + r]
        out.append({"prompt_ids": ids[:p], "response_ids": ids[p:], "loss_mask": [1] * r, "logprobs": [0.0] * r,
                    "group_id": f"u{update}-g{i // 4}"})
    return out


def summarize(rows: list[dict], workload: str, onednn_cache: str) -> dict:
    """The figures from per-update rows `{"rss_mb", "update_s", "sequence_tokens"}` (at least 2)."""
    ms = [1000 * r["update_s"] / r["sequence_tokens"] for r in rows]
    first, last = rows[FIRST], rows[-1]
    return {"workload": workload, "onednn_cache": onednn_cache, "updates": len(rows),
            "ms_per_token_first": statistics.median(ms[FIRST:FIRST + 5]),
            "ms_per_token_last": statistics.median(ms[-5:]),
            "rank_rss_first_mb": first["rss_mb"], "rank_rss_last_mb": last["rss_mb"],
            "growth_mb": last["rss_mb"] - first["rss_mb"], "rows": rows}


def line(s: dict) -> str:
    return (f"learner_memory: workload={s['workload']} onednn_cache={s['onednn_cache']} updates={s['updates']} "
            f"ms_per_token_first={s['ms_per_token_first']:.2f} ms_per_token_last={s['ms_per_token_last']:.2f} "
            f"rank_rss_first_mb={s['rank_rss_first_mb']:.0f} rank_rss_last_mb={s['rank_rss_last_mb']:.0f} "
            f"growth_mb={s['growth_mb']:.0f}")


def _rss_mb(_learner) -> float:
    """The calling process's RSS (MiB); runs inside the rank through `__ray_call__`."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def run(args, cfg) -> dict:
    import ray
    import torch
    from transformers import AutoTokenizer

    from actors.engines.models import resolve_model
    from actors.learner.batch import make_train_batch
    from actors.learner.group import LearnerGroup
    from algorithms import AlgorithmConfig, grpo_advantages
    from cluster.ray_init import init_ray
    from pipelines.data import iter_corpus, pack_file

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.learner.model))
    text = " ".join(p.text for p in iter_corpus(pack_file(cfg.data.corpus, cfg.data.dir), limit=3000))
    pool = tokenizer.encode(text, add_special_tokens=False)
    learner = cfg.learner.model_copy(update={"num_ranks": 1, "mini_batch_size": args.seqs})
    started = init_ray(cfg.ray)
    group = None
    rows: list[dict] = []
    try:
        group = LearnerGroup("policy", learner)
        lengths = batch_lengths(args.workload, args.seqs, args.seed)
        for u in range(args.updates):
            batch = make_train_batch(trajectories(next(lengths), pool, u), tokenizer.pad_token_id or 0)
            rewards = torch.tensor([float((u + i) % 3 == 0) for i in range(batch.size)])
            batch = batch.with_fields(old_logprobs=None, advantages=grpo_advantages(rewards, batch.group_ids,
                                                                                      batch.loss_mask))
            m = group.update(batch, AlgorithmConfig(kl_coef=0.0))
            rss = ray.get(group.actors[0].__ray_call__.remote(_rss_mb))
            rows.append({"rss_mb": rss, "update_s": m["update_s"], "sequence_tokens": m["sequence_tokens"]})
            print(f"update {u + 1}: {m['update_s']:.1f} s, {m['sequence_tokens']:.0f} sequence tokens, "
                  f"rank RSS {rss:.0f} MiB", flush=True)
    finally:
        if group is not None:
            group.shutdown()
        if started:
            ray.shutdown()
    return summarize(rows, args.workload, args.onednn_cache or "as-training")


def main(argv: list[str] | None = None) -> int:
    from scripts.cli import parse_config, user_errors

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("varied", "fixed"), default="varied")
    ap.add_argument("--updates", type=int, default=24)
    ap.add_argument("--seqs", type=int, default=8, help="sequences per update (one optimizer step)")
    ap.add_argument("--onednn-cache", help="size of the rank's oneDNN primitive caches (default: as training)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    default = str(Path(__file__).resolve().parents[2] / "configs" / "soak_train_cpu.yaml")
    args, cfg = parse_config(ap, argv, default_config=default)
    if args.updates < FIRST + 2:
        ap.error(f"--updates must be at least {FIRST + 2}, got {args.updates}")
    if args.onednn_cache is not None:
        if not args.onednn_cache.isdigit():
            ap.error(f"--onednn-cache must be a non-negative integer, got {args.onednn_cache!r}")
        from actors.learner.group import LEARNER_CACHE_VARS

        for var in LEARNER_CACHE_VARS:  # the ranks keep what the user set
            os.environ[var] = args.onednn_cache
    with user_errors():
        summary = run(args, cfg)
    print(line(summary))
    if args.out:  # the per-update series
        args.out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
