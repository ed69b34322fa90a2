"""Run every recipe's episodes with a policy on real questions against the real retrieval pool.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.probes.rollout_demo [--questions 16] [--recipes s3,search_r1] ray.num_cpus=8 [key=value ...]

Starts the RetrievalPool over the config's index, one RolloutWorker actor (policy on vLLM) and one
FrozenLLM actor (s3 generator / judge, R-Search verifier: the same base model, frozen), runs
`--questions` dev questions per recipe, writes the trajectories to `<out>/<recipe>.jsonl` and
prints a summary per recipe: turns, valid-action rate, searches, finish reasons, tokens, reward.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from scripts.cli import parse_config, user_errors


def summarize(trajs: list[dict]) -> dict:
    """Per-recipe statistics of trajectories (dicts from `Trajectory.to_json`)."""
    turns = [t["turns"] for t in trajs]
    n_turns = sum(len(ts) for ts in turns)
    return {
        "episodes": len(trajs),
        "turns_per_episode": n_turns / max(1, len(trajs)),
        "valid_action_rate": sum(r["action"] != "Invalid" for ts in turns for r in ts) / max(1, n_turns),
        "searches_per_episode": sum(r["query"] is not None for ts in turns for r in ts) / max(1, len(trajs)),
        "finish_reasons": dict(Counter(t["finish_reason"] for t in trajs)),
        "tokens_per_episode": sum(len(t["response_ids"]) for t in trajs) / max(1, len(trajs)),
        "policy_tokens_per_episode": sum(sum(t["loss_mask"]) for t in trajs) / max(1, len(trajs)),
        "mean_reward": sum(t["reward"] or 0.0 for t in trajs) / max(1, len(trajs)),
    }


def main(argv: list[str] | None = None) -> None:
    """Entry point: run each recipe's episodes on dev questions against the retrieval pool; write and summarize them.

    Usage: SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.probes.rollout_demo [--questions 16] [--recipes s3,search_r1] ray.num_cpus=8 [key=value ...]
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--recipes", default="search_r1,s3,r1_searcher,r_search,eval_rar,naive_rag,direct")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per turn at most")
    parser.add_argument("--out", default="runs/rollouts")
    args, cfg = parse_config(parser, argv)
    import ray

    from actors.engines.spec import EngineSpec
    from actors.frozen.worker import FrozenLLMWorker
    from actors.lifecycle import ActorSet
    from actors.retrieval.pool import start_retrieval_pool
    from actors.rollout.worker import RolloutWorker
    from cluster.ray_init import init_ray
    from pipelines.build_index import ensure_index
    from pipelines.data import iter_qa, pack_file

    with user_errors():
        examples = [asdict(e) for e in iter_qa(pack_file(cfg.data.dev, cfg.data.dir), limit=args.questions)]
        started = init_ray(cfg.ray)
        actors = ActorSet()
        try:
            r = cfg.retrieval
            need = r.pool_cpus + cfg.index.num_shards * r.shard_cpus + r.query_encoders * r.encoder_cpus + 1.0
            have = ray.cluster_resources().get("CPU", 0)
            if need > have:  # the actors would wait for CPUs forever
                raise SystemExit(f"error: the demo's actors need {need:g} logical CPUs, the Ray cluster has {have:g}; "
                                 f"start a bigger local cluster with ray.num_cpus=8 (they share the cores)")
            ensure_index(cfg)  # built (resuming) when missing
            pool = actors.adopt(start_retrieval_pool(cfg.index.dir, cfg.retrieval))
            spec = EngineSpec(backend=args.backend, model=args.model, max_model_len=4096)
            frozen = actors.start(FrozenLLMWorker, spec, chat=False, num_cpus=0.5)
            worker = actors.start(RolloutWorker, spec, pool, frozen, num_cpus=0.5)
            actors.wait_ready([worker, frozen], what="the demo's engines")
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            limits = {"max_new_tokens_per_turn": args.max_new_tokens, "max_total_tokens": 4096}
            for name in args.recipes.split(","):
                trajs = ray.get(worker.run.remote(examples, name, sampling={"temperature": 1.0, "seed": 5},
                                                  limits=limits, chat=False))
                with open(out / f"{name}.jsonl", "w") as f:
                    for t in trajs:
                        f.write(json.dumps(t) + "\n")
                print(f"{name}: {json.dumps(summarize(trajs))}", flush=True)
        finally:
            actors.stop()
            if started:
                ray.shutdown()

if __name__ == "__main__":
    main()
