"""Benchmark the retrieval pool at Wikipedia scale: N vectors in S shards, built and searched through the
project's own shard and pool code, measured against exact search.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.retrieval_scale [--vectors drawn] [--n 1000000]
        [--dim 768] [--shards 4] [--indexes flat16,ivfpq,ivfpq-mmap,ivfpq-rflat] [--ivfpq IVF4096,PQ96] [--nprobe 64]
        [--k-factor 10] [--queries 1000] [--docstore N] [--config configs/retrieval_cpu.yaml] [key=value ...]

Vectors (float16 on disk, one memory-mapped .npy per shard; the exact search and every index read those):
- real: the passage vectors of the config's flat index (MiniLM over the pack; built first when missing); queries
  are real questions (dev, then test, then train) under its encoder. N = min(--n, the index's size); --dim is unused.
- drawn: a diagonal Gaussian mixture fitted by k-means to those real vectors (or to --fit-from FILE.npy), mapped to
  --dim by a random orthonormal map; queries are the real questions mapped the same way (mixture draws with --fit-from).
Indexes, per shard through `pipelines.build_index.build_vector_shard`, searched by `RetrievalPool`:
- flat16: exact search over fp16 vectors (faiss SQfp16);
- ivfpq: the --ivfpq factory (IVF nlist capped at rows/39 per shard; trained per shard on --train-size rows, or
  once on shard 0 with --train-once), at each --nprobe;
- ivfpq-mmap: that same index; its top k_factor x 10 re-ranked by the exact fp16 vectors memory-mapped from the
  shard's refine.fp16.npy (`ShardSearcher`);
- ivfpq-rflat: the same trained IVF-PQ inside faiss IndexRefineFlat (fp32 vectors in RAM), same k_factor.
Reported per shard and in total: build seconds (train, add), index and doc bytes on disk, each shard actor's
resident memory after the variant's searches (RSS; anon = heap; file = pages of mapped files in RAM, which the
kernel can drop); recall@10 against the exact top-10 on --queries queries; p50/p99 latency and queries/s at
--callers concurrent callers of one query each, through the pool (vectors; for real vectors text too, and HTTP
`/retrieve`). --docstore N: a doc store of N synthetic passages of ~100 words, top-10 fetch latency and resident
memory in a fresh process. Variants whose RAM estimate exceeds what is free are skipped with a note. Prints
markdown tables (real and drawn rows apart) and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from scripts.bench import retrieval_scale_data as data
from scripts.bench.retrieval_scale_data import OptionError, VectorSet, drawn_set, load_real, real_set
from scripts.cli import parse_config, user_errors

K = 10
VARIANTS = ("flat16", "ivfpq", "ivfpq-mmap", "ivfpq-rflat")
BUILD_COLUMNS = ("vectors", "index", "shard", "rows", "train_s", "add_s", "index_mib", "docs_mib", "rss_mib", "anon_mib",
                 "rss_file_mib")
DOCSTORE_COLUMNS = ("rows", "words", "row_group", "store_mib", "write_s", "open_s", "p50_ms", "p99_ms", "lists_per_s",
                    "rss_mib", "anon_mib", "rss_file_mib")
MIB = 2**20


def search_columns(callers: list[int]) -> tuple[str, ...]:
    """Columns of the search table: the variant, its recall, and p50/p99 (ms) and q/s at each caller count."""
    per = tuple(f"{m}@{c}" for c in callers for m in ("p50_ms", "p99_ms", "qps"))
    return ("vectors", "index", "nprobe", "k_factor", "recall@10", "exact10_in_topk", "route") + per


def _ints(text: str, name: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OptionError(f"{name}: {text!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise OptionError(f"{name}: {text!r}; expected positive integers, e.g. 1,16,64")
    return out


def check_options(args) -> None:
    """Check and normalize the options in place (lists parsed). Raises OptionError naming the option."""
    args.vectors = [v for v in args.vectors.split(",") if v]
    if not args.vectors or any(v not in ("real", "drawn", "none") for v in args.vectors) or (
            "none" in args.vectors and len(args.vectors) > 1):
        raise OptionError(f"--vectors: {','.join(args.vectors)!r}; expected real, drawn, real,drawn or none")
    args.vectors = [v for v in args.vectors if v != "none"]
    args.indexes = [v for v in args.indexes.split(",") if v]
    if not args.indexes or any(v not in VARIANTS for v in args.indexes):
        raise OptionError(f"--indexes: {','.join(args.indexes)!r}; expected a comma-separated subset of {','.join(VARIANTS)}")
    args.nprobe, args.callers = _ints(args.nprobe, "--nprobe"), _ints(args.callers, "--callers")
    for name in ("n", "dim", "shards", "queries", "latency_queries", "k_factor", "train_size", "chunk_rows",
                 "mixture", "doc_words", "docstore_fetches"):
        if getattr(args, name) < 1:
            raise OptionError(f"--{name.replace('_', '-')}: got {getattr(args, name)}; expected an integer >= 1")
    if args.docstore < 0:
        raise OptionError(f"--docstore: got {args.docstore}; expected a row count >= 0 (0 = no doc store run)")
    if not args.vectors and not args.docstore:
        raise OptionError("--vectors none measures the doc store only: give --docstore N")
    if args.n < args.shards:
        raise OptionError(f"--n {args.n} is fewer than --shards {args.shards}")
    if not re.fullmatch(r"IVF\d+,PQ\d+(x\d+)?(np)?", args.ivfpq):
        raise OptionError(f"--ivfpq: {args.ivfpq!r}; expected a faiss factory string IVF<nlist>,PQ<m>[x<bits>], e.g. IVF4096,PQ96")
    if "drawn" in args.vectors:
        check_factory(args.ivfpq, args.dim)
    if args.fit_from and not Path(args.fit_from).is_file():
        raise OptionError(f"--fit-from: {args.fit_from} is not a file (expected a .npy of real vectors [n, d])")


def check_factory(factory: str, dim: int) -> None:
    """Raise OptionError when FAISS cannot build `factory` for `dim` (e.g. PQ m not dividing it)."""
    from actors.retrieval.index_store import new_faiss_index

    m = int(re.search(r"PQ(\d+)", factory).group(1))
    if dim % m:
        raise OptionError(f"--ivfpq {factory}: PQ{m} must divide the dimension {dim}")
    try:
        new_faiss_index(dim, factory, {})
    except RuntimeError as e:
        raise OptionError(f"--ivfpq {factory}: faiss cannot build it for dim {dim} ({str(e).splitlines()[0][:200]})") from None


def pq_bytes(factory: str) -> int:
    """Bytes of one vector's PQ code in an `IVF..,PQ<m>[x<bits>]` factory string."""
    m = re.search(r"PQ(\d+)(?:x(\d+))?", factory)
    return int(m.group(1)) * int(m.group(2) or 8) // 8


def ram_need(variant: str, n: int, dim: int, factory: str) -> int:
    """Estimated bytes the shard actors hold in RAM for a variant (flat16: fp16 codes; ivfpq: PQ codes + ids,
    before the mapped file pages; rflat: plus fp32 vectors)."""
    ivf = n * (pq_bytes(factory) + 8)
    return {"flat16": n * dim * 2, "ivfpq": ivf, "ivfpq-mmap": ivf, "ivfpq-rflat": ivf + n * dim * 4}[variant]


def disk_need(vsets: list[VectorSet], args) -> int:
    """Estimated peak bytes under --work: vectors + docs + the largest variant (all of them with --keep) + doc store."""
    total = args.docstore * (args.doc_words * 6 + 60)
    for vs in vsets:
        builds = {"ivfpq" if v == "ivfpq-mmap" else v for v in args.indexes}  # ivfpq-mmap searches the ivfpq build
        variants = [ram_need(v, vs.n, vs.dim, args.ivfpq) for v in builds]
        total += vs.n * (vs.dim * 2 + vs.doc_bytes) + (sum(variants) if args.keep else max(variants))
    return total


def pool_ids(pool, vs: VectorSet, k: int) -> np.ndarray:
    """Global rows of the pool's top-k for every query vector of `vs`: int64 `[q, k]`, -1 padded."""
    import ray

    out = np.full((len(vs.qvecs), k), -1, dtype=np.int64)
    for i in range(0, len(vs.qvecs), 256):
        for j, hits in enumerate(ray.get(pool.search_vectors.remote(vs.qvecs[i : i + 256], k))):
            out[i + j, : len(hits)] = [vs.doc_row(h["doc_id"]) for h in hits]
    return out


def http_latency(url: str, texts: list[str], concurrency: int) -> dict:
    """POST /retrieve with one query and topk 10 per request from `concurrency` clients. Returns bench_calls' dict."""
    import asyncio

    import httpx

    from scripts.bench.retrieval import callers, percentile_ms

    async def run():
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False, limits=limits) as client:
            async def call(q):
                (await client.post("/retrieve", json={"queries": [q], "topk": K, "return_scores": True})).raise_for_status()
            return await callers(call, texts, concurrency)

    total, lat = asyncio.run(run())
    return {"concurrency": concurrency, "qps": len(texts) / total, "p50_ms": percentile_ms(lat, 50), "p99_ms": percentile_ms(lat, 99)}


def latency_rows(pool, vs: VectorSet, args, base: dict, http_url: str | None) -> list[dict]:
    """Search-table rows (`base` + route + p50/p99/qps per caller count) for each route the set allows."""
    from scripts.bench.retrieval import bench_pool

    n = args.latency_queries
    vecs = [vs.qvecs[i % len(vs.qvecs)][None, :] for i in range(n)]
    routes = [("pool vectors", lambda c: bench_pool(pool, vecs, c, call=lambda v: pool.search_vectors.remote(v, K)))]
    if vs.texts:
        texts = [vs.texts[i % len(vs.texts)] for i in range(n)]
        routes.append(("pool text", lambda c: bench_pool(pool, texts, c, call=lambda q: pool.search.remote([q], K))))
        if http_url:
            routes.append(("http /retrieve", lambda c: http_latency(http_url, texts, c)))
    rows = []
    for route, run in routes:
        row = {**base, "route": route}
        for c in args.callers:
            r = run(c)
            row |= {f"p50_ms@{c}": r["p50_ms"], f"p99_ms@{c}": r["p99_ms"], f"qps@{c}": r["qps"]}
        rows.append(row)
        print(f"  {base['index']} nprobe={base['nprobe']}: {route}: recall@10 {base['recall@10']:.3f}; " + ", ".join(
            f"{c} callers p50 {row[f'p50_ms@{c}']:.1f} ms p99 {row[f'p99_ms@{c}']:.1f} ms {row[f'qps@{c}']:.0f} q/s"
            for c in args.callers), flush=True)
    return rows


def build_variant(name: str, vs: VectorSet, ranges, parts, paths, base: Path, args, trained: dict) -> tuple[Path, list[dict]]:
    """Build one index variant (`flat16`, `ivfpq` (+ refine file when ivfpq-mmap is asked for) or `ivfpq-rflat`)
    under `base/name`; IVF-PQ is trained once per shard (`trained`: shard -> (template, factory, seconds))."""
    import faiss

    from actors.retrieval.index_store import cap_ivf_nlist, new_faiss_index, train_faiss_index
    from pipelines.build_index import build_vector_shard, finish_index

    index_dir = base / name
    shutil.rmtree(index_dir, ignore_errors=True)
    index_dir.mkdir(parents=True)
    t0, raws = time.perf_counter(), []
    for i, ((start, count), part) in enumerate(zip(ranges, parts)):
        if name == "flat16":
            template, factory, params, train_s = new_faiss_index(vs.dim, "SQfp16", {}), "SQfp16", {}, 0.0
        else:
            key = 0 if args.train_once else i
            if key not in trained:
                factory = cap_ivf_nlist(args.ivfpq, count)
                template, t = new_faiss_index(vs.dim, factory, {}), time.perf_counter()
                train_faiss_index(template, part, args.train_size, args.seed)
                trained[key] = (template, factory, time.perf_counter() - t)
            template, factory, train_s = trained[key]
            train_s = train_s if key == i else 0.0
            params = {"nprobe": args.nprobe[0]}
            if name == "ivfpq-rflat":
                template, factory = faiss.IndexRefineFlat(faiss.clone_index(template)), factory + ",RFlat"
                params["k_factor"] = args.k_factor
        docs = base / "docs" / f"shard-{i:05d}.parquet"
        refine = paths[i] if name == "ivfpq" and "ivfpq-mmap" in args.indexes else None
        raw = build_vector_shard(index_dir, i, start, part, template, factory, params, lambda p, d=docs: _link(d, p),
                                 refine_from=refine, chunk_rows=args.chunk_rows, max_train=args.train_size)
        raw["build_s"]["train"] = round(train_s, 3)
        raws.append(raw)
        shared = " (shared by the IVF-PQ variants)" if name != "flat16" else ""
        print(f"  {name} shard {i}: {count} rows, train {train_s:.1f} s{shared}, add {raw['build_s']['add']:.1f} s", flush=True)
    finish_index(index_dir, raws, index_type="flat" if name == "flat16" else "ivf_pq", encoder=vs.encoder,
                 normalized=vs.normalized, index={"type": name, "fp16": name == "flat16", "factory": raws[0]["factory"],
                                                  "params": raws[0]["params"]},
                 corpus={"path": vs.how, "limit": None}, build_seconds=time.perf_counter() - t0)
    return index_dir, raws


def _link(src: Path, dst: Path) -> None:
    """Hard-link `src` to `dst` (a copy across file systems)."""
    import os

    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def memory_rows(pool, vs: VectorSet, mode: str, index_dir: Path, raws: list[dict]) -> list[dict]:
    """Build-table rows of one variant: per shard and a total (sizes on disk, build seconds, shard actor memory now)."""
    import ray

    from actors.retrieval.index_store import DOCS, FAISS_FILE, REFINE_FILE

    mem = ray.get([h.memory.remote() for h in ray.get(pool.shard_handles.remote())])
    rows = []
    for raw, m in zip(raws, mem):
        d = index_dir / raw["name"]
        size = (d / FAISS_FILE).stat().st_size + ((d / REFINE_FILE).stat().st_size if mode == "ivfpq-mmap" else 0)
        rows.append({"vectors": vs.kind, "index": mode, "shard": int(raw["name"][-5:]), "rows": raw["count"],
                     "train_s": raw["build_s"]["train"], "add_s": raw["build_s"]["add"], "index_mib": size / MIB,
                     "docs_mib": (d / DOCS).stat().st_size / MIB, "rss_mib": m["rss"] / MIB,
                     "anon_mib": None if m["anon"] is None else m["anon"] / MIB,
                     "rss_file_mib": None if m["file"] is None else m["file"] / MIB})
    total = {c: sum(r[c] for r in rows) if all(r[c] is not None for r in rows) else None for c in BUILD_COLUMNS[3:]}
    return rows + [{"vectors": vs.kind, "index": mode, "shard": "total", **total}]


def run_vectors(vs: VectorSet, args, rcfg: dict, http_port: int | None) -> dict:
    """Write the set's vectors and docs, compute the exact top-10, then build, search and measure each variant
    (under `--work/<kind>`, removed afterwards unless --keep)."""
    base = Path(args.work) / vs.kind
    shutil.rmtree(base, ignore_errors=True)
    try:
        return _run_vectors(vs, args, rcfg, http_port, base)
    finally:  # also when interrupted: the vectors and docs of a large N take GBs
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def _run_vectors(vs: VectorSet, args, rcfg: dict, http_port: int | None, base: Path) -> dict:
    import psutil
    import ray

    from actors.retrieval.index_store import shard_ranges
    from actors.retrieval.pool import start_retrieval_pool

    ranges = shard_ranges(vs.n, args.shards)
    t0 = time.perf_counter()
    paths = data.write_vectors(base / "vectors", ranges, vs.dim, vs.block)
    parts = data.open_vectors(paths)
    t1 = time.perf_counter()
    (base / "docs").mkdir(parents=True)
    for i, (start, count) in enumerate(ranges):
        vs.write_docs(base / "docs" / f"shard-{i:05d}.parquet", start, count)
    t2 = time.perf_counter()
    ex_s, ex_i = data.exact_topk(parts, vs.qvecs, K, args.chunk_rows)
    sec = {"vectors": vs.kind, "n": vs.n, "dim": vs.dim, "shards": args.shards, "how": vs.how, "queries": vs.queries_how,
           "write_vectors_s": t1 - t0, "write_docs_s": t2 - t1, "exact_s": time.perf_counter() - t2,
           "mean_exact_top1": float(ex_s[:, 0].mean()), "mean_exact_top10": float(ex_s[:, -1].mean()),
           "build": [], "search": [], "skipped": []}
    print(f"{vs.kind}: {vs.n} x {vs.dim} in {args.shards} shards written in {t1 - t0:.1f} s (docs {t2 - t1:.1f} s); "
          f"exact top-{K} of {len(vs.qvecs)} queries in {sec['exact_s']:.1f} s", flush=True)
    trained: dict = {}
    for name in [v for v in ("flat16", "ivfpq", "ivfpq-rflat") if v in args.indexes or (v == "ivfpq" and "ivfpq-mmap" in args.indexes)]:
        modes = [m for m in args.indexes if m == name or (name == "ivfpq" and m == "ivfpq-mmap")]
        need, free = max(ram_need(m, vs.n, vs.dim, args.ivfpq) for m in modes), psutil.virtual_memory().available
        if need > 0.8 * free:
            sec["skipped"].append(f"{'/'.join(modes)}: needs about {need / 2**30:.1f} GiB of RAM, {free / 2**30:.1f} GiB free")
            print(f"  skipped {sec['skipped'][-1]}", flush=True)
            continue
        index_dir, raws = build_variant(name, vs, ranges, parts, paths, base, args, trained)
        pool = start_retrieval_pool(index_dir, rcfg)
        url = None
        try:
            shards = ray.get(pool.shard_handles.remote())
            ray.get(pool.search_vectors.remote(vs.qvecs[:64], K))  # warm up
            if http_port and vs.texts:
                url = _serve(pool, rcfg, http_port)
            for mode in modes:
                for nprobe in (args.nprobe if name != "flat16" else [None]):
                    kf = args.k_factor if mode != "ivfpq" and name != "flat16" else 1
                    if nprobe is not None:
                        ray.get([s.set_search_params.remote({"nprobe": nprobe, "k_factor": kf}) for s in shards])
                    deep = K * args.k_factor if mode == "ivfpq" else K
                    got = pool_ids(pool, vs, deep)
                    row = {"vectors": vs.kind, "index": mode, "nprobe": nprobe, "k_factor": kf if name != "flat16" else None,
                           "recall@10": data.recall_at_k(got[:, :K], ex_i, ex_s, parts, vs.qvecs),
                           "exact10_in_topk": (f"{data.recall_at_k(got, ex_i, ex_s, parts, vs.qvecs):.3f} in {deep}"
                                               if deep > K else None)}
                    sec["search"] += latency_rows(pool, vs, args, row, url)
                sec["build"] += memory_rows(pool, vs, mode, index_dir, raws)
        finally:
            if url:
                from ray import serve

                serve.delete("bench_scale")
            ray.kill(pool)
            if not args.keep:
                shutil.rmtree(index_dir, ignore_errors=True)
    return sec


def _serve(pool, rcfg: dict, port: int) -> str:
    """Deploy the `/retrieve` route for `pool` on 127.0.0.1:`port`; returns its base URL."""
    from actors.retrieval.http import serve_retrieval
    from configs.schema import ServeConfig

    return serve_retrieval(pool, ServeConfig(host="127.0.0.1", port=port), rcfg, name="bench_scale")


def run_docstore(args, cfg) -> dict:
    """Step 4: fill a doc store of --docstore synthetic passages and measure top-10 fetches in a fresh process."""
    path = Path(args.work) / "docstore" / "docs.parquet"
    passages = data.PassageSource.from_pack(cfg.data.dir, cfg.data.corpus, words=args.doc_words, seed=args.seed)
    info = data.fill_docstore(path, passages, args.docstore, args.row_group)
    print(f"doc store: {info['rows']} passages, {info['bytes'] / MIB:.0f} MiB written in {info['write_s']:.1f} s", flush=True)
    m = data.docstore_in_subprocess(path, args.docstore_fetches, K, args.seed)
    after = m["mem_after"]
    row = {"rows": m["rows"], "words": args.doc_words, "row_group": args.row_group, "store_mib": info["bytes"] / MIB,
           "write_s": info["write_s"], "open_s": m["open_s"], "p50_ms": m["p50_ms"], "p99_ms": m["p99_ms"],
           "lists_per_s": m["lists_per_s"], "rss_mib": after["rss"] / MIB,
           "anon_mib": None if after["anon"] is None else after["anon"] / MIB,
           "rss_file_mib": None if after["file"] is None else after["file"] / MIB,
           "rss_before_open_mib": m["mem_base"]["rss"] / MIB, "ids_right": m["ids_right"]}
    if not args.keep:
        shutil.rmtree(path.parent, ignore_errors=True)
    return row


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    v = float(v)
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"


def markdown_table(columns, rows: list[dict]) -> str:
    """A markdown table of `rows` (dicts) with `columns` in order; missing values print as –."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def render(report: dict, callers: list[int]) -> str:
    """The report as markdown: per vector kind a header, the build/memory table and the search table; the doc store."""
    out = []
    for sec in report["sections"]:
        out += [f"### {sec['vectors']} vectors: N={sec['n']:,}, d={sec['dim']}, {sec['shards']} shards",
                f"{sec['how']}. Queries: {sec['queries']}; exact top-{K} by brute force in {sec['exact_s']:.1f} s "
                f"(mean exact top-1 score {sec['mean_exact_top1']:.3f}, 10th {sec['mean_exact_top10']:.3f}). The IVF-PQ "
                "variants share one training per shard (train_s repeats it); memory is each shard actor's after the "
                "variant's searches; exact10_in_topk: share of the exact top-10 in IVF-PQ's top k_factor x 10.", "",
                markdown_table(BUILD_COLUMNS, sec["build"]), "", markdown_table(search_columns(callers), sec["search"]), ""]
        out += [f"skipped: {s}" for s in sec["skipped"]]
    if report.get("docstore"):
        out += ["### doc store (synthetic passages, fetched by id in a fresh process, page cache warm)", "",
                markdown_table(DOCSTORE_COLUMNS, [report["docstore"]]), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Entry point: build, search and measure pool indexes of N vectors (exit 2: bad option, index or disk space).

    Usage: SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.bench.retrieval_scale [--vectors drawn] [--n N] ...
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.retrieval_scale", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--vectors", default="drawn", help="real, drawn, real,drawn or none (doc store only); default drawn")
    add("--n", type=int, default=1_000_000, help="vectors (drawn; real: at most the index's size); default 1000000")
    add("--dim", type=int, default=768, help="dimension of drawn vectors (default 768)")
    add("--shards", type=int, default=4, help="shards S (default 4)")
    add("--indexes", default=",".join(VARIANTS), help=f"variants, comma-separated (default {','.join(VARIANTS)})")
    add("--ivfpq", default="IVF4096,PQ96", help="faiss factory of the IVF-PQ variants (default IVF4096,PQ96)")
    add("--nprobe", default="64", help="IVF lists probed, comma-separated values, one row each (default 64)")
    add("--k-factor", type=int, default=10, help="re-ranked candidates = k_factor x 10 (default 10)")
    add("--queries", type=int, default=1000, help="queries for recall@10 against exact search (default 1000)")
    add("--latency-queries", type=int, default=512, help="queries per latency measurement (default 512)")
    add("--callers", default="1,16,64", help="concurrent callers, comma-separated (default 1,16,64)")
    add("--train-size", type=int, default=262144, help="IVF-PQ training vectors per shard (default 262144)")
    add("--train-once", action="store_true", help="train IVF-PQ on shard 0 and reuse it for every shard (default: per shard)")
    add("--chunk-rows", type=int, default=65536, help="rows per chunk when adding and for exact search (default 65536)")
    add("--mixture", type=int, default=1024, help="mixture components for drawn vectors (default 1024; <= real/20)")
    add("--fit-from", default=None, help="a .npy of real vectors [n, d] to fit the mixture to (default: the config's flat index)")
    add("--doc-words", type=int, default=100, help="words per synthetic passage (default 100)")
    add("--no-http", action="store_true", help="skip the HTTP /retrieve measurements (real vectors only)")
    add("--docstore", type=int, default=0, help="also fill a doc store of this many synthetic passages and measure it")
    add("--docstore-fetches", type=int, default=2000, help="top-10 fetches measured on the doc store (default 2000)")
    add("--seed", type=int, default=0, help="seed of draws, training samples and fetches (default 0)")
    add("--work", default="indexes/bench-scale", help="working directory (default indexes/bench-scale)")
    add("--keep", action="store_true", help="keep vectors, docs and indexes (default: removed after measuring)")
    add("--out", default=None, help="JSON report (default <work>/retrieval_scale.json)")
    args, cfg = parse_config(parser, argv, default_config=str(Path(__file__).resolve().parents[2] / "configs" / "retrieval_cpu.yaml"))
    args.row_group = cfg.index.docs_row_group_size
    try:
        check_options(args)
        real = None
        with user_errors():
            if "real" in args.vectors or ("drawn" in args.vectors and not args.fit_from):
                real = load_real(cfg, args.queries)
            vsets = [real_set(real, args) if v == "real" else drawn_set(real, args, cfg) for v in args.vectors]
        for vs in vsets:
            if vs.kind == "real":
                check_factory(args.ivfpq, vs.dim)
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        need, free = disk_need(vsets, args), shutil.disk_usage(work).free
        if need > free:
            raise OptionError(f"needs about {need / 2**30:.1f} GiB under {work}, {free / 2**30:.1f} GiB free: lower --n, "
                              "drop variants (--indexes) or point --work elsewhere")
    except OptionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = {"k": K, "sections": [], "docstore": None, "options": {k: v for k, v in vars(args).items() if k != "overrides"}}
    if vsets:
        import ray

        from cluster.ray_init import init_ray

        local = init_ray(cfg.ray)
        try:
            rcfg = cfg.retrieval.model_copy(update={"query_cache_size": 0, "max_topk": max(cfg.retrieval.max_topk, K * args.k_factor)}).model_dump()
            cpus = ray.cluster_resources().get("CPU", 1) - rcfg["pool_cpus"] - rcfg["query_encoders"] * rcfg["encoder_cpus"]
            rcfg["shard_cpus"] = min(rcfg["shard_cpus"], max(0.01, cpus / args.shards))  # S shards fit the cluster
            port = None if args.no_http else _free_port()
            for vs in vsets:
                report["sections"].append(run_vectors(vs, args, rcfg, port))
        finally:
            if local:
                ray.shutdown()
    if args.docstore:
        report["docstore"] = run_docstore(args, cfg)
    out = Path(args.out) if args.out else Path(args.work) / "retrieval_scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=float))
    print(render(report, args.callers))
    print(f"retrieval_scale: report {out}")
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
