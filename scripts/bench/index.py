"""Benchmark passage encoding for the index build: plain torch fp32 against the configured encoder.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.index [--questions 200] [--config ...] [key=value ...]

Reads a flat index (`index.dir`, any encoder; built first when missing) to pick a hard passage subset: the union of the
top-20 passages of the first `--questions` dev questions (a few thousand passages, many holding an
answer, the rest near misses). In one run it encodes that subset with
- torch fp32 (`encoder.backend=torch precision=fp32`, the reference vectors), and
- the config's encoder (e.g. `encoder.backend=openvino precision=bf16`, configs/retrieval_cpu.yaml),
each in this process with `encoder.batch_size` passages per forward pass and all cores, interleaved
over `--rounds` rounds (the median counts: other jobs on a shared machine add noise), and reports
passages/s, their ratio, the cosine of the new vectors to the reference and recall@5 of the dev
questions against that subset (a gold answer span in the top 5) with each. Ends with one line:
`index: torch_pps=<x> new_pps=<y> ratio=<y/x> recall5_fp32=<r> recall5_new=<r'> top5_same=<share> new=<backend precision>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from scripts.cli import parse_config, user_errors

K = 5


def hard_subset(index_dir: Path, manifest, questions: list[str], depth: int = 20) -> np.ndarray:
    """Corpus rows in the top-`depth` of any question, searched with the built index's own encoder.
    Returns sorted int64 row ids."""
    import faiss

    from actors.retrieval.encoder import EncoderSpec, TextEncoder
    from actors.retrieval.index_store import load_shard_vectors

    index = faiss.IndexFlatIP(manifest.dim)
    index.add(load_shard_vectors(index_dir))
    encoder = TextEncoder(EncoderSpec(**manifest.encoder))
    _, ids = index.search(encoder.encode_queries(questions), depth)
    return np.unique(ids[ids >= 0])


def recall_at_k(passages: np.ndarray, queries: np.ndarray, texts: list[str], golds: list[list[str]]) -> tuple[float, np.ndarray]:
    """Share of questions with a gold answer span in the top K passages, and the top-K ids `[q, K]`."""
    import faiss

    from recipes.metrics import span_check

    index = faiss.IndexFlatIP(passages.shape[1])
    index.add(passages)
    _, ids = index.search(queries, K)
    hits = [any(span_check(texts[j], g) for j in row if j >= 0) for row, g in zip(ids, golds)]
    return float(np.mean(hits)), ids


def main(argv: list[str] | None = None) -> int:
    """Entry point: torch fp32 vs the configured passage encoder on a hard dev subset (exit 2: no flat index).

    Usage: SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.index [--questions N] [--rounds R]
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.index", description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=200, help="dev questions picking the subset (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per encoder (default 3)")
    parser.add_argument("--out", default=None, help="JSON output (default: none)")
    args, cfg = parse_config(parser, argv)
    from actors.retrieval.encoder import EncoderSpec, TextEncoder
    from pipelines.build_index import ready_index, require_index_type
    from pipelines.data import iter_qa, pack_file

    with user_errors():
        require_index_type(cfg, ("flat",), "reads its passage subset from a flat index's vectors")
        examples = list(iter_qa(pack_file(cfg.data.dev, cfg.data.dir), limit=args.questions))
        manifest = ready_index(cfg)  # built (resuming) when missing
    if manifest.index_type != "flat":
        print(f"error: the subset is read from a flat index; {cfg.index.dir} is {manifest.index_type}", file=sys.stderr)
        return 2
    import pyarrow.parquet as pq

    index_dir = Path(cfg.index.dir)
    questions = [ex.question for ex in examples]
    rows = hard_subset(index_dir, manifest, questions)
    docs = {"title": [], "text": []}
    for s in manifest.shards:
        t = pq.read_table(index_dir / s.name / "docs.parquet", columns=["title", "text"]).to_pydict()
        docs["title"] += t["title"]
        docs["text"] += t["text"]
    titles = [docs["title"][j] for j in rows]
    texts = [docs["text"][j] for j in rows]
    print(f"subset: {len(rows)} passages (top-20 of {len(questions)} dev questions in {index_dir})", flush=True)

    threads = os.cpu_count() or 1
    new_spec = EncoderSpec.from_config(cfg.encoder)
    encoders = {
        "torch": TextEncoder(EncoderSpec.from_config(cfg.encoder.model_copy(update={"backend": "torch", "precision": "fp32"})), threads),
        "new": TextEncoder(new_spec, threads),
    }
    for enc in encoders.values():
        enc.encode_passages(titles[:32], texts[:32])  # warm up (OpenVINO compiles on first use)
    speeds: dict[str, list[float]] = {name: [] for name in encoders}
    vectors: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        for name, enc in encoders.items():
            t0 = time.perf_counter()
            vectors[name] = enc.encode_passages(titles, texts)
            speeds[name].append(len(rows) / (time.perf_counter() - t0))
            print(f"  round {r + 1}: {name} {speeds[name][-1]:.1f} passages/s", flush=True)
    pps = {name: float(np.median(v)) for name, v in speeds.items()}
    cosine = (vectors["torch"] * vectors["new"]).sum(axis=1)
    golds = [list(ex.golden_answers) for ex in examples]
    recall_ref, ids_ref = recall_at_k(vectors["torch"], encoders["torch"].encode_queries(questions), texts, golds)
    recall_new, ids_new = recall_at_k(vectors["new"], encoders["new"].encode_queries(questions), texts, golds)
    report = {
        "passages": len(rows), "questions": len(questions), "rounds": args.rounds, "threads": threads,
        "new": {"backend": new_spec.backend, "precision": new_spec.precision, "batch_size": new_spec.batch_size},
        "torch_fp32_pps": pps["torch"], "new_pps": pps["new"], "ratio": pps["new"] / pps["torch"],
        "pps_rounds": speeds, "cosine_min": float(cosine.min()), "cosine_mean": float(cosine.mean()),
        "recall5_fp32": recall_ref, "recall5_new": recall_new, "top5_same": float(np.mean(np.all(ids_ref == ids_new, axis=1))),
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"cosine to fp32: min {report['cosine_min']:.6f} mean {report['cosine_mean']:.7f}")
    print(f"index: torch_pps={pps['torch']:.1f} new_pps={pps['new']:.1f} ratio={report['ratio']:.2f} "
          f"recall5_fp32={recall_ref:.3f} recall5_new={recall_new:.3f} top5_same={report['top5_same']:.3f} "
          f"new={new_spec.backend}/{new_spec.precision}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
