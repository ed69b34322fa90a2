"""Benchmark the sharded RetrievalPool against the seed papers' retrieval server design.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.retrieval [--config ...] [key=value ...]

Reads the config's flat index (built first when missing, resuming). Measures, in one run:
- baseline: one process, one unsharded flat index over the same vectors, requests served one after
  another, encode + search + passage lookup per request with one query each (independent
  trajectories calling the seeds' server);
- baseline_batched (reference): the same server given 64 queries in one request (how the seeds'
  turn-synchronous loops call it);
- pool: RetrievalPool (query encoding + micro-batching + fan-out to the shard actors + merge) with
  1, 16 and 64 concurrent callers of one query each: throughput (queries/s), p50/p99 latency (ms);
- exactness: pool top-k == flat top-k (same ids and order up to ties, scores within 1e-4) on every
  test-split question; recall@5: share of test questions with a gold answer span in the top 5.
Writes JSON (--out) and ends with one line:
`retrieval: pool_qps=<x> baseline_qps=<y> speedup=<x/y> recall_at_5=<r> exact_match_vs_flat=<true|false>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

from scripts.cli import parse_config, user_errors

CONCURRENCY = (1, 16, 64)
K = 5


def percentile_ms(latencies: list[float], q: float) -> float:
    """The `q`-th percentile (0-100) of `latencies` (seconds), in milliseconds."""
    return float(np.percentile(np.asarray(latencies) * 1000.0, q))


class FlatBaseline:
    """The seeds' retrieval server in miniature: encoder + one flat FAISS index + in-memory corpus.

    `tuned=True` gives it the FAISS settings the shards use (1 OpenMP thread, BLAS threshold): in
    one process with a torch encoder, FAISS's default threads contend with torch's and halve its
    throughput here. The tuned baseline is the one speedups are reported against.
    """

    def __init__(self, index_dir: Path, manifest, query_batch_size: int):
        import faiss
        import pyarrow.parquet as pq

        from actors.retrieval.encoder import EncoderSpec, TextEncoder
        from actors.retrieval.index_store import load_shard_vectors

        vectors = load_shard_vectors(index_dir)
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(vectors)
        self.encoder = TextEncoder(EncoderSpec(**manifest.encoder, query_batch_size=query_batch_size))
        self.docs = []
        for s in manifest.shards:
            t = pq.read_table(index_dir / s.name / "docs.parquet", columns=["id", "title", "text"]).to_pydict()
            self.docs += [{"doc_id": i, "title": ti, "text": tx} for i, ti, tx in zip(t["id"], t["title"], t["text"])]

    def search(self, queries: list[str], k: int):
        """Encode and search `queries`: (scores `[n, k]` float32, ids `[n, k]` int64 corpus rows (-1 =
        none), hits: per query a list of {doc_id, title, text, score}, best first)."""
        scores, ids = self.index.search(self.encoder.encode_queries(queries), k)
        hits = [[{**self.docs[j], "score": float(s)} for s, j in zip(srow, irow) if j >= 0] for srow, irow in zip(scores, ids)]
        return scores, ids, hits


def bench_baseline(baseline: FlatBaseline, queries: list[str]) -> dict:
    """Serve `queries` one per request, one after another, top-K. Returns {"qps", "p50_ms", "p99_ms"}."""
    latencies = []
    t0 = time.perf_counter()
    for q in queries:
        t = time.perf_counter()
        baseline.search([q], K)
        latencies.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    return {"qps": len(queries) / total, "p50_ms": percentile_ms(latencies, 50), "p99_ms": percentile_ms(latencies, 99)}


def bench_baseline_batched(baseline: FlatBaseline, queries: list[str], batch: int = 64) -> dict:
    """Serve `queries` `batch` per request, top-K. Returns {"qps", "batch", "p50_ms_per_request"}."""
    latencies = []
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch):
        t = time.perf_counter()
        baseline.search(queries[i : i + batch], K)
        latencies.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    return {"qps": len(queries) / total, "batch": batch, "p50_ms_per_request": percentile_ms(latencies, 50)}


async def callers(call, queries: list, concurrency: int) -> tuple[float, list[float]]:
    """`concurrency` callers await `call(q)` for every query once, one at a time each.
    Returns (wall seconds, per-call latencies in seconds)."""
    todo = iter(queries)
    latencies: list[float] = []

    async def caller():
        """Await `call(q)` for queries from the shared iterator, one at a time, until it is empty; record latencies (s)."""
        for q in todo:  # callers share one iterator: each query is asked once
            t = time.perf_counter()
            await call(q)
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return time.perf_counter() - t0, latencies


def bench_calls(call, queries: list, concurrency: int) -> dict:
    """Await `call(q)` (an async function, or one returning an awaitable such as a Ray ObjectRef) once per
    query from `concurrency` callers of one query at a time, in a fresh event loop.

    Returns:
        {"concurrency", "qps", "p50_ms", "p99_ms"} (latency per call, milliseconds).
    """
    total, latencies = asyncio.run(callers(call, queries, concurrency))
    return {"concurrency": concurrency, "qps": len(queries) / total,
            "p50_ms": percentile_ms(latencies, 50), "p99_ms": percentile_ms(latencies, 99)}


def bench_pool(pool, queries: list, concurrency: int, call=None) -> dict:
    """Search every query once through the pool from `concurrency` callers of one query at a time.

    Args:
        call: `call(q)` -> ObjectRef; default `pool.search.remote([q], K)` (e.g. `pool.search_vectors` instead).
    Returns:
        {"concurrency", "qps", "p50_ms", "p99_ms", "mean_batch_queries" (queries per pool micro-batch)}.
    """
    import ray

    before = ray.get(pool.get_stats.remote())
    r = bench_calls(call or (lambda q: pool.search.remote([q], K)), queries, concurrency)
    after = ray.get(pool.get_stats.remote())
    batches = after["batches"] - before["batches"]
    return {**r, "mean_batch_queries": (after["queries"] - before["queries"]) / max(batches, 1)}


def check_exactness_and_recall(pool, baseline: FlatBaseline, examples) -> dict:
    """Compare the pool's top-K with the flat baseline's on every question (same ids and order up to
    ties, scores within 1e-4) and measure recall@5 (a gold answer span in the top 5).

    Returns:
        {"exact_match_vs_flat", "identical_id_positions", "recall_at_5", "questions", "max_abs_score_diff"}.
    """
    import ray

    from actors.retrieval.shard import same_topk
    from recipes.metrics import span_check

    questions = [ex.question for ex in examples]
    pool_hits = []
    for i in range(0, len(questions), 256):
        pool_hits += ray.get(pool.search.remote(questions[i : i + 256], K))
    ref_scores, ref_ids, _ = baseline.search(questions, K)
    id_of = {d["doc_id"]: j for j, d in enumerate(baseline.docs)}
    got_ids = np.array([[id_of[h["doc_id"]] for h in hits] for hits in pool_hits])
    got_scores = np.array([[h["score"] for h in hits] for hits in pool_hits], dtype=np.float32)
    exact = same_topk(got_scores, got_ids, ref_scores, ref_ids.astype(np.int64), atol=1e-4)
    identical_positions = float((got_ids == ref_ids).mean())
    recall = float(np.mean([any(span_check(h["text"], list(ex.golden_answers)) for h in hits) for ex, hits in zip(examples, pool_hits)]))
    return {"exact_match_vs_flat": bool(exact), "identical_id_positions": identical_positions, "recall_at_5": recall,
            "questions": len(questions), "max_abs_score_diff": float(np.abs(got_scores - ref_scores).max())}


def main(argv: list[str] | None = None) -> int:
    """Entry point: benchmark the RetrievalPool against a one-process flat-index server (exit 2: index not flat).

    Usage: SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.retrieval [--config ...] [key=value ...]
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.retrieval", description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=512, help="queries per throughput measurement (default 512)")
    parser.add_argument("--out", default=None, help="JSON output (default <index.dir>/bench_retrieval.json)")
    args, cfg = parse_config(parser, argv)
    from pipelines.build_index import ready_index, require_index_type
    from pipelines.data import iter_qa, pack_file

    with user_errors():
        require_index_type(cfg, ("flat",), "compares the pool against exact search")
        examples = list(iter_qa(pack_file(cfg.data.test, cfg.data.dir)))
        manifest = ready_index(cfg)  # built (resuming) when missing
    if manifest.index_type != "flat":
        print(f"error: the benchmark compares against exact search; {cfg.index.dir} is {manifest.index_type}", file=sys.stderr)
        return 2

    import ray

    from actors.retrieval.pool import start_retrieval_pool
    from cluster.ray_init import init_ray

    index_dir = Path(cfg.index.dir)
    questions = [ex.question for ex in examples]
    bench_q = (questions * (args.queries // len(questions) + 1))[: args.queries]
    report: dict = {"index": str(index_dir), "num_docs": manifest.num_docs, "num_shards": len(manifest.shards),
                    "encoder": manifest.encoder["model"], "k": K, "queries_per_measurement": len(bench_q)}

    print(f"baseline: loading one flat index over {manifest.num_docs} passages ...", flush=True)
    from actors.retrieval.index_store import tune_faiss

    baseline = FlatBaseline(index_dir, manifest, cfg.retrieval.query_batch_size)  # encodes as the pool does
    baseline.search(bench_q[:8], K)  # warm up
    report["baseline_faiss_defaults"] = bench_baseline(baseline, bench_q[:256])  # as the seeds ran it
    tune_faiss(1)
    report["baseline"] = bench_baseline(baseline, bench_q)
    report["baseline_batched"] = bench_baseline_batched(baseline, bench_q)
    print(f"  sequential: {report['baseline']['qps']:.1f} q/s (FAISS defaults: {report['baseline_faiss_defaults']['qps']:.1f})   "
          f"64 per request: {report['baseline_batched']['qps']:.1f} q/s", flush=True)

    init_ray(cfg.ray)
    try:
        # No query-vector cache: every measurement reuses the same queries, and the baseline has none.
        pool = start_retrieval_pool(index_dir, cfg.retrieval.model_copy(update={"query_cache_size": 0}))
        ray.get(pool.search.remote(bench_q[:64], K))  # warm up
        report["pool"] = []
        for c in CONCURRENCY:
            r = bench_pool(pool, bench_q, c)
            report["pool"].append(r)
            print(f"  pool, {c:>2} callers: {r['qps']:.1f} q/s  p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  "
                  f"batch {r['mean_batch_queries']:.1f}", flush=True)
        report["check"] = check_exactness_and_recall(pool, baseline, examples)
    finally:
        ray.shutdown()

    pool64 = next(r for r in report["pool"] if r["concurrency"] == 64)
    base = report["baseline"]["qps"]
    report["speedup_vs_baseline"] = pool64["qps"] / base
    report["ratio_vs_batched_baseline"] = pool64["qps"] / report["baseline_batched"]["qps"]
    out = Path(args.out) if args.out else index_dir / "bench_retrieval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    chk = report["check"]
    print(f"pool@64 / baseline batched-64 = {report['ratio_vs_batched_baseline']:.2f}; "
          f"identical id positions {chk['identical_id_positions']:.4f}; max |score diff| {chk['max_abs_score_diff']:.2e}; "
          f"report: {out}")
    print(f"retrieval: pool_qps={pool64['qps']:.1f} baseline_qps={base:.1f} speedup={report['speedup_vs_baseline']:.2f} "
          f"recall_at_5={chk['recall_at_5']:.3f} exact_match_vs_flat={str(chk['exact_match_vs_flat']).lower()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
