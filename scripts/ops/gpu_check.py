"""Exercise each GPU path on this machine's GPU(s) and print timings.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.ops.gpu_check [--only faiss,vllm,learner,nccl]
        [--vectors 500000] [--dim 768] [--out runs/gpu_check.json]

Run it on a GPU node with the GPU requirement set (`SEARCHRL_VARIANT=gpu bash scripts/setup.sh`).
Each check runs on its own; one failing does not stop the others:
- faiss: a flat inner-product index of `--vectors` random unit vectors, searched with 1,024 queries
  (top-10) on CPU (all cores) and on the GPU through the shard's own path
  (`actors.retrieval.gpu_index`: `gpu_plan`, `to_gpu`, float16 storage); qps of both, the speed-up and
  the top-10 agreement of the GPU's ids with the CPU's.
- vllm: the policy engine (`VLLMEngine`, CUDA) on the embedded Gemma 3 270M: 64 prompts x 128 new
  tokens sampled at once; startup seconds and generated tokens/s.
- learner: a 1-rank `LearnerGroup` with ZeRO-3 and bf16 on one GPU (`scripts.bench.learner`'s real-text
  batch, 2 GRPO steps), then the object-store weight sync into a vLLM `RolloutWorker` sharing the GPU;
  seconds per update, policy tokens/s, peak GPU memory, sync seconds.
- nccl: `learner.weight_sync: nccl` (`actors.learner.nccl_sync`): rank 0 on GPU 0 broadcasts to a
  vLLM worker on GPU 1; needs 2 GPUs (NCCL cannot put two ranks on one device), else "skipped".
Ends with `gpu_check: faiss=<ok|FAILED|skipped> vllm=… learner=… nccl=… gpu=<name>` and writes every
number to JSON. Exit status: 0 when nothing FAILED, 1 otherwise, 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from pathlib import Path

from scripts.cli import parse_config, user_errors

CHECKS = ("faiss", "vllm", "learner", "nccl")


def check_faiss(vectors: int, dim: int, queries: int = 1024, k: int = 10) -> dict:
    """CPU vs GPU search of one flat shard; returns {cpu_qps, gpu_qps, speedup, agree_at_k, plan}."""
    import faiss
    import numpy as np

    from actors.retrieval.gpu_index import gpu_plan, to_gpu

    rng = np.random.default_rng(0)
    xb = rng.standard_normal((vectors, dim), dtype=np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq = xb[rng.choice(vectors, queries, replace=False)] + 0.05 * rng.standard_normal((queries, dim), dtype=np.float32)
    index = faiss.IndexFlatIP(dim)
    index.add(xb)
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    _, cpu_ids = index.search(xq, k)
    cpu_s = time.perf_counter() - t0
    plan = gpu_plan(index, {}, topk=k)
    gpu_index = to_gpu(index, plan)
    gpu_index.search(xq[:8], k)  # warm-up: kernels and temporary memory
    t0 = time.perf_counter()
    _, gpu_ids = gpu_index.search(xq, k)
    gpu_s = time.perf_counter() - t0
    agree = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(cpu_ids, gpu_ids, strict=True)]))
    return {"vectors": vectors, "dim": dim, "queries": queries, "k": k, "cpu_qps": queries / cpu_s,
            "gpu_qps": queries / gpu_s, "speedup": cpu_s / gpu_s, "agree_at_k": agree, "plan": plan.reason}


def check_vllm(prompts: int = 64, new_tokens: int = 128) -> dict:
    """Startup seconds and sampled tokens/s of the CUDA policy engine on Gemma 3 270M."""
    from transformers import AutoTokenizer

    from actors.engines.base import Sampling
    from actors.engines.models import resolve_model
    from actors.engines.spec import EngineSpec, make_engine

    prompt = AutoTokenizer.from_pretrained(resolve_model("gemma3-270m")).encode("The capital of France is")

    async def run() -> dict:
        t0 = time.perf_counter()
        engine = make_engine(EngineSpec(backend="vllm", model="gemma3-270m", max_model_len=2048,
                                        gpu_memory_utilization=0.3))
        startup = time.perf_counter() - t0
        try:
            sampling = Sampling(max_tokens=new_tokens, temperature=1.0, seed=0)
            t0 = time.perf_counter()
            outs = await asyncio.gather(*(engine.generate(prompt, sampling) for _ in range(prompts)))
            seconds = time.perf_counter() - t0
            tokens = sum(len(g.token_ids) for out in outs for g in out)
        finally:
            await engine.shutdown()
        return {"startup_s": startup, "prompts": prompts, "tokens": tokens, "seconds": seconds,
                "tokens_per_s": tokens / seconds}

    return asyncio.run(run())


def check_learner(cfg) -> dict:
    """ZeRO-3 + bf16 GRPO updates on one GPU, then the object-store sync into a vLLM worker."""
    from transformers import AutoTokenizer

    from actors.engines.models import resolve_model
    from actors.engines.spec import EngineSpec
    from actors.learner.batch import make_train_batch
    from actors.lifecycle import ActorSet
    from actors.rollout.worker import RolloutWorker
    from scripts.bench.learner import bench_ranks, real_text_trajectories

    learner = cfg.learner.model_copy(update={"zero_stage": 3, "dtype": "bf16", "gpus_per_rank": 0.5,
                                             "num_ranks": 1, "torch_threads": None})
    cfg = cfg.model_copy(update={"learner": learner})
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(learner.model))
    batch = make_train_batch(real_text_trajectories(cfg, tokenizer, 8, 512), tokenizer.pad_token_id or 0)
    actors = ActorSet()
    try:
        worker = actors.start(RolloutWorker, EngineSpec(backend="vllm", model=learner.model, max_model_len=2048,
                                                        gpu_memory_utilization=0.25), None, num_cpus=1, num_gpus=0.5)
        actors.wait_ready([worker], what="the rollout worker")
        result = bench_ranks(cfg, 1, batch, 2, worker)
    finally:
        actors.stop()
    return {"model": learner.model, "update_s": result["step_s"]["one_pass"],
            "tokens_per_s": result["tokens_per_s"]["one_pass"], "peak_gpu_bytes": result["peak_memory_bytes_per_rank"],
            "sync_s": result["sync"].get("sync_s")}


def check_nccl(cfg) -> dict:
    """`learner.weight_sync: nccl` from rank 0 (GPU 0) into a vLLM worker (GPU 1): seconds per sync."""
    import torch

    if torch.cuda.device_count() < 2:
        return {"skipped": f"needs 2 GPUs (NCCL cannot put two ranks on one device); this node has "
                           f"{torch.cuda.device_count()}"}
    from actors.engines.spec import engine_spec
    from actors.learner.group import LearnerGroup
    from actors.lifecycle import ActorSet
    from actors.rollout.worker import RolloutWorker

    learner = cfg.learner.model_copy(update={"weight_sync": "nccl", "gpus_per_rank": 1.0, "num_ranks": 1,
                                             "dtype": "bf16", "torch_threads": None})
    rollout = cfg.rollout.model_copy(update={"backend": "vllm", "gpus_per_worker": 1.0})
    cfg = cfg.model_copy(update={"learner": learner, "rollout": rollout})
    actors, group = ActorSet(), LearnerGroup("policy", learner)
    try:
        worker = actors.start(RolloutWorker, engine_spec(cfg, "policy"), None, num_cpus=1, num_gpus=1.0)
        actors.wait_ready([worker], what="the rollout worker")
        times = [group.sync_weights([worker], version=v) for v in (1, 2)]  # the first also forms the group
    finally:
        group.shutdown()
        actors.stop()
    return {"first_sync_s": times[0]["sync_s"], "sync_s": times[1]["sync_s"], "sync_bytes": times[1].get("sync_bytes")}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.ops.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks (default: all)")
    parser.add_argument("--vectors", type=int, default=500_000, help="vectors in the faiss check's index")
    parser.add_argument("--dim", type=int, default=768, help="their dimension (E5-base: 768)")
    parser.add_argument("--out", default="runs/gpu_check.json")
    args, cfg = parse_config(parser, argv, default_config=str(Path(__file__).resolve().parents[2] / "configs"
                                                               / "train_cpu.yaml"))
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here; run it on a GPU node (the checks need one)", file=sys.stderr)
        return 2
    unknown = set(args.only.split(",")) - set(CHECKS)
    if unknown:
        parser.exit(2, f"error: --only: unknown checks {sorted(unknown)}; choose from {', '.join(CHECKS)}\n")
    import ray

    from cluster.ray_init import init_ray

    report: dict = {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count()}
    status: dict[str, str] = {}
    with user_errors():
        started = init_ray(cfg.ray.model_copy(update={"num_cpus": None}))
        try:
            runs = {"faiss": lambda: check_faiss(args.vectors, args.dim), "vllm": check_vllm,
                    "learner": lambda: check_learner(cfg), "nccl": lambda: check_nccl(cfg)}
            for name in CHECKS:
                if name not in args.only.split(","):
                    continue
                print(f"gpu_check: {name} ...", flush=True)
                try:
                    report[name] = runs[name]()
                    status[name] = "skipped" if "skipped" in report[name] else "ok"
                except Exception as e:  # noqa: BLE001 - report it and go on with the next check
                    report[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
                    status[name] = "FAILED"
                print(f"gpu_check: {name} {status[name]}: {json.dumps(report[name], default=str)[:800]}", flush=True)
        finally:
            if started:
                ray.shutdown()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print("gpu_check: " + " ".join(f"{k}={v}" for k, v in status.items()) + f" gpu={report['gpu']!r}")
    return 1 if "FAILED" in status.values() else 0


if __name__ == "__main__":
    sys.exit(main())
