"""Benchmark the async agent loop against the seed papers' turn-synchronous loop.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.rollout [--questions 16] [--recipe search_r1]
        [--dtypes bf16,fp32] [key=value ...]

Same engine (vLLM; the CPU build here), model (Gemma 3 270M base), questions (the pack's dev
split) and retrieval pool (the config's index, built first when missing), measured in one run:
- async: every episode on its own coroutine (generate → search → generate …), no barrier, and the
  engine stops each turn at its closing tag;
- sync (the seed papers' loop, the baseline of `speedup`): all active episodes generate, then all
  search, then all generate (a barrier per turn), and each turn generates its whole token budget
  and is cut after the closing tag afterwards (Search-R1's `_postprocess_responses`);
- sync_barrier (reported beside it): the barrier alone, with the engine's stop strings; the
  speedup over it is what asynchrony alone buys.
Runs go in ABCCBA order against drift. Sampling is seeded per (question, sample, turn), so every
run samples the same tokens (same work: only the scheduling differs; `same_trajectories` reports
whether the runs' responses were identical) and the prefix cache is emptied before each run. `tokens_after_stop` counts tokens the async run generated after
the token that completed a stop string (0 = nothing wasted). Each engine dtype of `--dtypes` (default bf16 then fp32: bf16 is emulated on CPUs without bf16
instructions, `configs.cpu_features`) is measured this way with an engine of its own. Writes JSON
(--out) and ends with one line per dtype,
`rollout: dtype=<d> cpu=<instruction sets> async_eps_per_s=<x> sync_eps_per_s=<y> speedup=<x/y> tokens_after_stop=<n>`,
and with two dtypes `rollout dtypes: <first>/<second> async episodes/s ratio=<r>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from scripts.cli import parse_config, user_errors


def tokens_after_stop(tokenizer, traj, stops: tuple[str, ...]) -> int:
    """Generated tokens that follow the token completing a stop string, summed over turns."""
    from actors.rollout.agent_loop import stop_prefix_length

    def decode(ids):
        """Text of token ids, special tokens skipped."""
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    extra, pos = 0, 0
    policy = [i for i, m in enumerate(traj["loss_mask"]) if m == 1]
    for turn in traj["turns"]:
        ids = [traj["response_ids"][i] for i in policy[pos : pos + turn["generated_tokens"]]]
        pos += turn["generated_tokens"]
        keep = stop_prefix_length(decode, ids, stops)
        extra += 0 if keep is None else len(ids) - keep
    return extra


async def measure(loop, examples, mode: str) -> tuple[float, list]:
    """Run `examples` once in `mode` ("async", "sync" or "sync_barrier") after emptying the engine's
    prefix cache. Returns (seconds, trajectories)."""
    # Same seed in every run (sampling is seeded per question, sample and turn), so every mode samples
    # the same tokens and does the same work; the prefix cache is emptied so no run is served from
    # an earlier one.
    if hasattr(loop.engine, "reset_prefix_cache"):
        await loop.engine.reset_prefix_cache()
    t = time.perf_counter()
    if mode == "async":
        trajs = await loop.run_batch(examples)
    else:
        trajs = await loop.run_batch_turn_sync(examples, engine_stops=mode == "sync_barrier")
    return time.perf_counter() - t, trajs


async def bench(cfg, args, dtype: str) -> dict:
    """Start the pool and an engine in `dtype` ("bf16", "fp32" or "checkpoint"), warm up, run the modes in ABCCBA
    order and return the result: episodes/s per mode, `speedup` (async / sync), `speedup_over_barrier`,
    `tokens_after_stop`, `same_trajectories`, runs."""
    from actors.engines.base import Sampling
    from actors.engines.spec import EngineSpec, make_engine
    from actors.retrieval.pool import start_retrieval_pool
    from configs.dtype_choice import ENGINE_DTYPES
    from actors.rollout.agent_loop import AgentLoop, RolloutLimits, pool_searcher
    from pipelines.data import iter_qa, pack_file
    from recipes import get_recipe

    examples = list(iter_qa(pack_file(cfg.data.dev, cfg.data.dir), limit=args.questions))
    pool = start_retrieval_pool(cfg.index.dir, cfg.retrieval)
    engine = make_engine(EngineSpec(backend=args.backend, model=args.model, max_model_len=4096,
                                    dtype=ENGINE_DTYPES[dtype]))
    try:
        recipe = get_recipe(args.recipe, max_turns=args.max_turns)
        limits = RolloutLimits(max_new_tokens_per_turn=args.max_new_tokens, max_total_tokens=4096)
        loop = AgentLoop(engine, recipe, pool_searcher(pool), Sampling(temperature=1.0, seed=11), limits,
                         chat=False, compute_reward=False)
        await loop.run_batch(examples[:2])  # warm up engine and pool
        order = ("sync", "sync_barrier", "async", "async", "sync_barrier", "sync")
        runs: dict[str, list[dict]] = {}
        for mode in order:
            seconds, trajs = await measure(loop, examples, mode)
            run = {
                "seconds": seconds,
                "episodes_per_s": len(trajs) / seconds,
                "kept_tokens": sum(sum(t.loss_mask) for t in trajs),
                "wasted_tokens": sum(int(t.timings.get("wasted_tokens", 0)) for t in trajs),
                "turns_per_episode": sum(len(t.turns) for t in trajs) / len(trajs),
                "turn_tokens": [tr.generated_tokens for t in trajs for tr in t.turns],
                "responses": [t.response_ids for t in trajs],
            }
            if mode == "async":
                run["tokens_after_stop"] = sum(
                    tokens_after_stop(engine.tokenizer, t.to_json(), recipe.stop_strings) for t in trajs
                )
            runs.setdefault(mode, []).append(run)
            print(f"{dtype} {mode}: {seconds:.1f} s, {run['episodes_per_s']:.3f} episodes/s, "
                  f"{run['turns_per_episode']:.2f} turns/episode, {run['kept_tokens']} kept + "
                  f"{run['wasted_tokens']} cut tokens", flush=True)
    finally:
        await engine.shutdown()
    eps = {mode: sum(r["episodes_per_s"] for r in rs) / len(rs) for mode, rs in runs.items()}
    responses = {json.dumps(r["responses"]) for rs in runs.values() for r in rs}
    for rs in runs.values():
        for r in rs:
            del r["responses"]
    return {"async_eps_per_s": eps["async"], "sync_eps_per_s": eps["sync"], "speedup": eps["async"] / eps["sync"],
            "sync_barrier_eps_per_s": eps["sync_barrier"], "speedup_over_barrier": eps["async"] / eps["sync_barrier"],
            "tokens_after_stop": sum(r["tokens_after_stop"] for r in runs["async"]),
            "same_trajectories": len(responses) == 1,
            "dtype": dtype, "questions": len(examples), "recipe": args.recipe, "max_new_tokens": args.max_new_tokens, "runs": runs}


def main(argv: list[str] | None = None) -> None:
    """Entry point: benchmark the async agent loop against the seed papers' turn-synchronous loop.

    Usage: SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.rollout [--questions 16] [--recipe search_r1] [key=value ...]
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=16, help="dev questions (count)")
    parser.add_argument("--recipe", default="search_r1")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="tokens per turn at most (Search-R1: 500)")
    parser.add_argument("--dtypes", default="bf16,fp32",
                        help="engine dtypes to measure, in order (bf16, fp32, checkpoint; default: %(default)s)")
    parser.add_argument("--out", default="runs/bench_rollout.json")
    args, cfg = parse_config(parser, argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or any(d not in ("bf16", "fp32", "checkpoint") for d in dtypes):
        parser.error(f"--dtypes {args.dtypes!r}: a comma-separated list of bf16, fp32, checkpoint")
    from configs.cpu_features import host_cpu
    from cluster.ray_init import init_ray
    from pipelines.build_index import ensure_index

    with user_errors():
        started = init_ray(cfg.ray)
        try:
            ensure_index(cfg)  # built (resuming) when missing
            results = {d: asyncio.run(bench(cfg, args, d)) for d in dtypes}
        finally:
            if started:
                import ray

                ray.shutdown()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    cpu = host_cpu()
    isas = "+".join(cpu.isa_names()) + ("" if cpu.native_bf16 else "(bf16-emulated)")
    Path(args.out).write_text(json.dumps({"cpu": cpu.describe(), "dtypes": results}, indent=2))
    for dtype, result in results.items():
        print(f"{dtype}: async vs barrier only (stop strings in both): {result['speedup_over_barrier']:.2f}x; "
              f"identical trajectories in every run: {result['same_trajectories']}")
    for dtype, result in results.items():
        print(f"rollout: dtype={dtype} cpu={isas} async_eps_per_s={result['async_eps_per_s']:.4f} "
              f"sync_eps_per_s={result['sync_eps_per_s']:.4f} speedup={result['speedup']:.2f} "
              f"tokens_after_stop={result['tokens_after_stop']}")
    if len(results) == 2:
        (a, ra), (b, rb) = results.items()
        print(f"rollout dtypes: {a}/{b} async episodes/s ratio={ra['async_eps_per_s'] / rb['async_eps_per_s']:.2f}")


if __name__ == "__main__":
    main()
