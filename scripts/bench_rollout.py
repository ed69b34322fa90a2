"""Benchmark the async agent loop against the seed papers' turn-synchronous loop.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench_rollout [--questions 16] [--recipe search_r1] [key=value ...]

Same engine (vLLM; the CPU build here), model (Gemma 3 270M base), questions (the pack's dev
split) and retrieval pool (the built index of the config), measured in one run:
- async: every episode on its own coroutine (generate → search → generate …), no barrier;
- sync: all active episodes generate, then all search, then all generate (a barrier per turn).
Runs go sync, async, async, sync (ABBA against drift), each with its own sampling seed.
Both stop every turn at its closing tag; `tokens_after_stop` counts tokens generated after the
token that completed a stop string in the async run (0 = nothing wasted; the papers' code
generated a full turn budget and cut afterwards). Writes JSON (--out) and ends with one line:
`rollout: async_eps_per_s=<x> sync_eps_per_s=<y> speedup=<x/y> tokens_after_stop=<n>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

from scripts.cli import parse_config, user_errors


def tokens_after_stop(tokenizer, traj, stops: tuple[str, ...]) -> int:
    """Generated tokens that follow the token completing a stop string, summed over turns."""
    extra, pos = 0, 0
    policy = [i for i, m in enumerate(traj["loss_mask"]) if m == 1]
    for turn in traj["turns"]:
        ids = [traj["response_ids"][i] for i in policy[pos : pos + turn["generated_tokens"]]]
        pos += turn["generated_tokens"]
        for cut in range(1, len(ids) + 1):  # first prefix whose text holds a stop string
            if any(s in tokenizer.decode(ids[:cut], skip_special_tokens=True) for s in stops):
                extra += len(ids) - cut
                break
    return extra


async def measure(loop, examples, turn_sync: bool, seed: int) -> tuple[float, list]:
    # A fresh seed per run: identical samples would let vLLM's prefix cache serve the later run.
    loop.sampling = replace(loop.sampling, seed=seed)
    t = time.perf_counter()
    trajs = await (loop.run_batch_turn_sync(examples) if turn_sync else loop.run_batch(examples))
    return time.perf_counter() - t, trajs


async def bench(cfg, args) -> dict:
    from actors.agent_loop import AgentLoop, RolloutLimits, pool_searcher
    from actors.engine import Sampling
    from actors.engine_factory import make_engine
    from actors.retrieval import start_retrieval_pool
    from pipelines.data import iter_qa, pack_file
    from recipes import get_recipe

    examples = list(iter_qa(pack_file(cfg.data.dev, cfg.data.dir), limit=args.questions))
    pool = start_retrieval_pool(cfg.index.dir, cfg.retrieval)
    engine = make_engine(args.backend, args.model, max_model_len=4096)
    try:
        recipe = get_recipe(args.recipe, max_turns=args.max_turns)
        limits = RolloutLimits(max_new_tokens_per_turn=args.max_new_tokens, max_total_tokens=4096)
        loop = AgentLoop(engine, recipe, pool_searcher(pool), Sampling(temperature=1.0, seed=11), limits,
                         chat=False, compute_reward=False)
        await loop.run_batch(examples[:2])  # warm up engine and pool
        results = {}
        runs = (("sync", True), ("async", False), ("async_repeat", False), ("sync_repeat", True))
        for seed, (name, sync) in enumerate(runs, 100):
            seconds, trajs = await measure(loop, examples, sync, seed)
            results[name] = {
                "seconds": seconds,
                "episodes_per_s": len(trajs) / seconds,
                "generated_tokens": sum(sum(t.loss_mask) for t in trajs),
                "turns_per_episode": sum(len(t.turns) for t in trajs) / len(trajs),
                "trajectories": [t.to_json() for t in trajs],
            }
            print(f"{name}: {seconds:.1f} s, {results[name]['episodes_per_s']:.3f} episodes/s, "
                  f"{results[name]['turns_per_episode']:.2f} turns/episode", flush=True)
        extra = sum(tokens_after_stop(engine.tokenizer, t, recipe.stop_strings) for t in results["async"]["trajectories"])
    finally:
        await engine.shutdown()
    async_eps = (results["async"]["episodes_per_s"] + results["async_repeat"]["episodes_per_s"]) / 2
    sync_eps = (results["sync"]["episodes_per_s"] + results["sync_repeat"]["episodes_per_s"]) / 2
    return {"async_eps_per_s": async_eps, "sync_eps_per_s": sync_eps, "speedup": async_eps / sync_eps,
            "tokens_after_stop": extra, "questions": len(examples), "recipe": args.recipe,
            "runs": {k: {kk: vv for kk, vv in v.items() if kk != "trajectories"} for k, v in results.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=16, help="dev questions (count)")
    parser.add_argument("--recipe", default="search_r1")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per turn at most")
    parser.add_argument("--out", default="runs/bench_rollout.json")
    args, cfg = parse_config(parser, argv)
    from cluster.ray_init import init_ray

    with user_errors():
        started = init_ray(cfg.ray)
        try:
            result = asyncio.run(bench(cfg, args))
        finally:
            if started:
                import ray

                ray.shutdown()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"rollout: async_eps_per_s={result['async_eps_per_s']:.4f} sync_eps_per_s={result['sync_eps_per_s']:.4f} "
          f"speedup={result['speedup']:.2f} tokens_after_stop={result['tokens_after_stop']}")


if __name__ == "__main__":
    main()
