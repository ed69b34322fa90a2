"""The main job until the training pipeline exists: build the index (or reuse it), then search it.

    .venv/bin/python -m scripts.probes.search_demo [--config configs/retrieval_cpu.yaml] [--questions 8] [key=value ...]

Builds the configured sharded index over the data pack's corpus (resuming an interrupted build,
skipping a finished one), starts the RetrievalPool, searches test-split questions and prints the
top-k passages with whether they contain a gold answer (span_check), plus recall@k.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time

from scripts.cli import parse_config, user_errors


def main(argv: list[str] | None = None) -> int:
    """Entry point: build (or reuse) the index, search test questions, print the hits and recall@k.

    Usage: .venv/bin/python -m scripts.probes.search_demo [--config configs/retrieval_cpu.yaml] [--questions 8] [key=value ...]
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.probes.search_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=8, help="test questions to search (default 8)")
    args, cfg = parse_config(parser, argv)
    from pipelines.data import iter_qa, pack_file

    with user_errors():
        test_file = pack_file(cfg.data.test, cfg.data.dir)

    import ray

    from actors.retrieval.pool import start_retrieval_pool
    from cluster.ray_init import init_ray
    from pipelines.build_index import build_index
    from recipes.metrics import span_check

    init_ray(cfg.ray)
    try:
        t0 = time.perf_counter()
        with user_errors():
            manifest = build_index(cfg)
        print(f"index ready: {cfg.index.dir} ({manifest.num_docs} passages, {len(manifest.shards)} shards, "
              f"{manifest.index_type}) in {time.perf_counter() - t0:.1f} s")
        pool = start_retrieval_pool(cfg.index.dir, cfg.retrieval)
        examples = list(iter_qa(test_file, limit=args.questions))
        k = cfg.retrieval.topk
        t1 = time.perf_counter()
        results = ray.get(pool.search.remote([ex.question for ex in examples], k))
        elapsed = time.perf_counter() - t1
        hits_with_answer = 0
        for ex, hits in zip(examples, results):
            found = [span_check(h["text"], list(ex.golden_answers)) for h in hits]
            hits_with_answer += any(found)
            print(f"\nQ: {ex.question}   gold: {' | '.join(ex.golden_answers)}   [{ex.dataset}]")
            for rank, (h, ok) in enumerate(zip(hits, found), 1):
                snippet = textwrap.shorten(h["text"], 110)
                print(f"  {rank}. {'*' if ok else ' '} {h['score']:.3f}  {h['title']}: {snippet}")
        n = len(examples)
        print(f"\nrecall@{k} (a gold answer in the top {k}): {hits_with_answer}/{n} = {hits_with_answer / max(n, 1):.2f}; "
              f"{n} queries searched in {elapsed * 1000:.0f} ms  (* = passage contains a gold answer)")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
