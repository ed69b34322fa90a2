"""Benchmark the DeepSpeed policy learner: update tokens/s, peak memory per rank, weight-sync seconds.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.learner [--seqs 8] [--ranks 1,2] [key=value ...]

The batch is made of real text: Search-R1 prompts of dev questions, and responses that alternate
policy text with retrieved passages (loss mask 0) from the pack's corpus, tokenized by the policy's
tokenizer. For each rank count, a `LearnerGroup` (ZeRO stage and dtype from `learner.*` in the config,
Gemma 3 270M by default) takes `--steps` GRPO steps; the first is a warm-up and is not timed.
Weight sync is timed into one vLLM RolloutWorker. MFU: the update's model FLOPs
(`actors.learner.flops`) per second of a whole learner step over this machine's measured matmul
peak in the training dtype. Each step is measured both ways, in the same run: before (`recompute`:
a separate forward pass for the old log-probs, then the update) and after (`one_pass`: a one-step
update reads them from its own forward pass, as training now does). Writes JSON (--out) and ends
with one line: `learner (<model>): tokens_per_s_1rank=… tokens_per_s_2rank=… sync_s=… mfu_1rank=…
mfu_2rank=… mfu_before_1rank=… mfu_before_2rank=… ratio_1rank=… ratio_2rank=…` (ratio = after / before).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from scripts.bench.text import real_text_trajectories  # noqa: F401 - re-exported (scripts.ops.gpu_check, tests)
from scripts.cli import parse_config, user_errors


def model_flops(model: str, batch) -> float:
    """Model FLOPs of one update over `batch` (`actors.learner.flops.update_flops`: decoder on every
    non-pad token, LM head on policy tokens); the model is built on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from actors.engines.models import resolve_model
    from actors.learner.flops import decoder_param_count, update_flops

    config = AutoConfig.from_pretrained(resolve_model(model))
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    head = lm.get_output_embeddings().weight
    return update_flops(decoder_param_count(lm), head.shape[1], head.shape[0], int(batch.attention_mask.sum()),
                        batch.num_policy_tokens())


def bench_ranks(cfg, ranks: int, batch, steps: int, rollout_worker) -> dict:
    """Time `steps` GRPO updates of a `ranks`-rank policy `LearnerGroup` on `batch` (the first is a
    warm-up, untimed unless it is the only one), then one weight sync into `rollout_worker` (None: none).

    Returns:
        {"ranks", "torch_threads", "update_s" (seconds per update), "policy_tokens", "tokens_per_s",
        "peak_memory_bytes_per_rank", "sync" ({} without a worker), "steps" (every step's metrics)}.
    """
    import ray
    import torch

    from actors.learner.group import LearnerGroup
    from algorithms import AlgorithmConfig, grpo_advantages

    update = {"num_ranks": ranks, "mini_batch_size": batch.size}
    if cfg.learner.torch_threads is None and cfg.learner.gpus_per_rank == 0:  # share the machine's cores
        update["torch_threads"] = max(1, (os.cpu_count() or 1) // ranks)
    learner = cfg.learner.model_copy(update=update)
    group = LearnerGroup("policy", learner)
    try:
        rewards = torch.tensor([float(i % 2) for i in range(batch.size)])
        advantages = grpo_advantages(rewards, batch.group_ids, batch.loss_mask)
        runs = {"recompute": [], "one_pass": []}
        for step in range(steps):
            for mode in runs:  # before: a separate old-log-prob pass; after: the update's own forward
                t0 = time.perf_counter()
                old = group.compute_logprobs(batch)[0] if mode == "recompute" else None
                m = group.update(batch.with_fields(old_logprobs=old, advantages=advantages), AlgorithmConfig(kl_coef=0.0))
                m["step_s"] = time.perf_counter() - t0
                print(f"{ranks} rank(s), step {step}, {mode}: {m['step_s']:.1f} s, {m['tokens']:.0f} policy tokens, "
                      f"loss {m['policy_loss']:.4f}", flush=True)
                runs[mode].append(m)
        step_s = {mode: _mean([m["step_s"] for m in (r[1:] or r)]) for mode, r in runs.items()}
        tokens = runs["one_pass"][0]["tokens"]
        peak = ray.get([a.peak_memory_bytes.remote() for a in group.actors])
        sync = group.sync_weights([rollout_worker], version=ranks) if rollout_worker is not None else {}
        flops = model_flops(cfg.learner.model, batch)
        return {"ranks": ranks, "torch_threads": learner.torch_threads, "step_s": step_s, "policy_tokens": tokens,
                "tokens_per_s": {mode: tokens / s for mode, s in step_s.items()}, "model_flops_per_update": flops,
                "model_flops_per_s": {mode: flops / s for mode, s in step_s.items()},
                "peak_memory_bytes_per_rank": peak, "sync": sync, "steps": runs}
    finally:
        group.shutdown()


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def main(argv: list[str] | None = None) -> None:
    """Entry point: benchmark the policy learner (update tokens/s, peak memory per rank, weight-sync seconds).

    Usage: SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.learner [--seqs 8] [--ranks 1,2] [key=value ...]
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, default=8, help="sequences per update (one mini-batch)")
    parser.add_argument("--response-tokens", type=int, default=256, help="response length (tokens)")
    parser.add_argument("--ranks", default="1,2", help="rank counts to measure")
    parser.add_argument("--steps", type=int, default=2, help="update steps per rank count (first = warm-up)")
    parser.add_argument("--no-sync", action="store_true", help="skip the vLLM weight-sync measurement")
    parser.add_argument("--out", default=None, help="JSON summary (default runs/bench_learner[_local].json)")
    local = parser.add_argument_group("--local: one PolicyLearner in this process, no Ray (scripts.bench.learner_local)")
    local.add_argument("--local", action="store_true", help="no Ray, no engine: what a bare GPU machine can run")
    local.add_argument("--shape", choices=("main", "multi_turn", "random"), default="main",
                       help="main: the main job's s3 select-only episodes; multi_turn: Search-R1 turns of "
                            "--response-tokens; random: random ids, --prompt-tokens + --response-tokens (no "
                            "tokenizer or data)")
    local.add_argument("--prompt-tokens", type=int, default=512, help="--shape random: prompt length (tokens)")
    local.add_argument("--memory-gib", type=float, default=None,
                       help="cap the CUDA allocator at this many GiB (does the shape fit a smaller GPU?)")
    local.add_argument("--profile", default=None, metavar="DIR",
                       help="one more update per setting under torch.profiler; its top operators to DIR/<setting>.txt")
    local.add_argument("--questions", type=int, default=8, help="questions (GRPO groups) per update")
    local.add_argument("--group", type=int, default=4, help="samples per question (sharing its prompt)")
    local.add_argument("--setting", action="append", default=[], metavar="learner.K=V,...",
                       help="learner keys of one setting to measure (repeat: one measurement each, in order)")
    local.add_argument("--random-init", action="store_true", help="the model's architecture with random weights")
    local.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=True,
                       help="train on the GPU when CUDA is present (default on)")
    local.add_argument("--peak-tflops", type=float, default=989.0,
                       help="the GPU's dense bf16 peak for MFU (H100 SXM: 989)")
    # train_cpu.yaml: the learner settings of the CPU training configs, and a local cluster with enough
    # logical CPUs for 2 ranks beside the rollout worker (the retrieval default would leave them pending).
    args, cfg = parse_config(parser, argv, default_config=str(Path(__file__).resolve().parents[2] / "configs" / "train_cpu.yaml"))
    if args.local:
        from scripts.bench.learner_local import run_local

        args.out = args.out or "runs/bench_learner_local.json"
        with user_errors():
            run_local(args, cfg)
        return
    args.out = args.out or "runs/bench_learner.json"
    import ray
    from transformers import AutoTokenizer

    from actors.engines.models import resolve_model
    from actors.engines.spec import EngineSpec
    from actors.learner.batch import make_train_batch
    from actors.lifecycle import ActorSet
    from actors.rollout.worker import RolloutWorker
    from cluster.ray_init import init_ray

    with user_errors():
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.learner.model))
        batch = make_train_batch(real_text_trajectories(cfg, tokenizer, args.seqs, args.response_tokens),
                                 tokenizer.pad_token_id or 0)
        started = init_ray(cfg.ray)
        actors, worker = ActorSet(), None
        try:
            if not args.no_sync:
                worker = actors.start(RolloutWorker, EngineSpec(backend="vllm", model=cfg.learner.model, max_model_len=2048),
                                      None, num_cpus=0.5)
                actors.wait_ready([worker], what="the rollout worker")
            results = [bench_ranks(cfg, int(r), batch, args.steps, worker) for r in args.ranks.split(",")]
        finally:
            actors.stop()
            if started:
                ray.shutdown()
    from actors.learner.flops import matmul_peak_flops

    peak_flops = {d: matmul_peak_flops(d, threads=os.cpu_count()) for d in ("fp32", "bf16")}
    for r in results:  # MFU against the whole machine's peak in the training dtype (all ranks share it)
        r["mfu"] = {mode: f / peak_flops[cfg.learner.dtype] for mode, f in r["model_flops_per_s"].items()}
    by_ranks = {r["ranks"]: r for r in results}
    sync_s = [r["sync"]["sync_s"] for r in results if r["sync"]]
    summary = {
        "model": cfg.learner.model, "zero_stage": cfg.learner.zero_stage, "dtype": cfg.learner.dtype,
        "torch_threads_per_rank": {r["ranks"]: r["torch_threads"] for r in results},
        "seqs": batch.size, "prompt_tokens_padded": batch.prompt_len, "response_tokens": batch.response_len,
        "results": results, "sync_s": sum(sync_s) / len(sync_s) if sync_s else None,
        "matmul_peak_flops": peak_flops,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    peak_g = peak_flops[cfg.learner.dtype] / 1e9
    for r in results:
        peak = ", ".join(f"{b / 2**30:.2f}" for b in r["peak_memory_bytes_per_rank"])
        for mode in ("recompute", "one_pass"):
            print(f"{r['ranks']} rank(s), {mode}: {r['tokens_per_s'][mode]:.1f} policy tokens/s, "
                  f"{r['step_s'][mode]:.1f} s per step, {r['model_flops_per_s'][mode] / 1e9:.1f} GFLOP/s = MFU "
                  f"{r['mfu'][mode]:.3f} of the {cfg.learner.dtype} matmul peak ({peak_g:.0f} GFLOP/s)")
        print(f"{r['ranks']} rank(s): peak GiB per rank [{peak}], sync {r['sync'].get('sync_s', float('nan')):.1f} s")

    def fmt(x):
        """`x` with 4 significant digits; "nan" for None."""
        return "nan" if x is None else f"{x:.4g}"

    def get(ranks: int, key: str, mode: str = "one_pass"):
        return by_ranks.get(ranks, {}).get(key, {}).get(mode)

    ratio = {n: (get(n, "mfu") / get(n, "mfu", "recompute")) if get(n, "mfu") else None for n in (1, 2)}
    print(f"learner ({cfg.learner.model}): tokens_per_s_1rank={fmt(get(1, 'tokens_per_s'))} "
          f"tokens_per_s_2rank={fmt(get(2, 'tokens_per_s'))} sync_s={fmt(summary['sync_s'])} "
          f"mfu_1rank={fmt(get(1, 'mfu'))} mfu_2rank={fmt(get(2, 'mfu'))} "
          f"mfu_before_1rank={fmt(get(1, 'mfu', 'recompute'))} mfu_before_2rank={fmt(get(2, 'mfu', 'recompute'))} "
          f"ratio_1rank={fmt(ratio[1])} ratio_2rank={fmt(ratio[2])}")


if __name__ == "__main__":
    main()
