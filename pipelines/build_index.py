"""Build a sharded retrieval index: corpus -> N shards -> embeddings (Ray Data) -> one index per shard.

Order of work (each shard is finished atomically, so an interrupted build resumes at the first
unfinished shard):
1. Count the corpus rows (streaming) and split them into `index.num_shards` contiguous ranges.
2. For every unfinished shard: stream its rows into `docs.parquet`; embed them with Ray Data
   `map_batches` over encoder actors (`actors.retrieval.encoder.PassageEncoderUDF`); build its FAISS index
   (or its bm25s index); checksum its files; rename `shard-i.partial/` to `shard-i/`.
3. Write `manifest.json` (encoder, dim, metric, normalization, prefixes, shards, checksums).
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from actors.retrieval.encoder import EncoderSpec
from actors.retrieval.index_store import (
    BM25_DIR,
    DOCS,
    FAISS_FILE,
    MANIFEST,
    REFINE_FILE,
    SHARD_RECORD,
    IndexFormatError,
    Manifest,
    ShardRecord,
    add_vectors,
    apply_search_params,
    atomic_write_text,
    build_faiss_index,
    checksum_dir,
    faiss_factory,
    shard_name,
    shard_ranges,
    train_faiss_index,
    write_docs,
)
from configs import save_config
from pipelines.data import count_records, iter_corpus, pack_file

MANIFEST_VERSION = 1


def build_params(cfg, corpus_path: Path, num_docs: int) -> dict:
    """Everything that determines the index's content; a resumed build must see the same dict."""
    index = cfg.index.model_dump(exclude={"dir", "encode_actors", "encode_cpus"})
    encoder = None if cfg.index.type == "bm25" else EncoderSpec.from_config(cfg.encoder).index_fields()
    return {"corpus": str(corpus_path.resolve()), "num_docs": num_docs, "index": index, "encoder": encoder}


def param_differences(old: dict, new: dict) -> list[str]:
    """The build parameters that differ between two `build_params` dicts, encoder fields named one by
    one (e.g. "encoder.backend ('torch' there, 'openvino' here)"). A build recorded before
    `encoder.backend` existed was encoded with torch."""
    diff = sorted(k for k in set(old) | set(new) if k != "encoder" and old.get(k) != new.get(k))
    was, now = old.get("encoder"), new.get("encoder")
    if was and now:
        was = {"backend": "torch", **was}
        diff += [f"encoder.{k} ({was.get(k)!r} there, {now.get(k)!r} here)"
                 for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
    elif was != now:
        diff.append("encoder")
    return diff


def _check_resume(index_dir: Path, params: dict) -> None:
    """Refuse to resume a build started with different parameters (it would mix two indexes).

    Raises:
        IndexFormatError: naming the differing parameters (encoder fields one by one).
    """
    path = index_dir / "build.json"
    if path.exists():
        diff = param_differences(json.loads(path.read_text()), params)
        if diff:
            raise IndexFormatError(
                f"{index_dir} holds a build with other parameters (differs in: {', '.join(diff)}); "
                "choose another index.dir or delete this one"
            )
    else:
        atomic_write_text(path, json.dumps(params, indent=2))


def write_shard_docs(corpus_path: Path, index_dir: Path, todo: dict[int, tuple[int, int]], row_group_size: int) -> None:
    """One streaming pass over the corpus writing `docs.parquet` of every shard in `todo` ({i: (start, count)})
    into its `shard-i.partial/` directory. Shards own contiguous ranges, so one shard's rows are
    buffered at a time."""
    if not todo:
        return
    order = sorted(todo.items(), key=lambda kv: kv[1][0])
    pos = 0
    rows = iter_corpus(corpus_path)
    for i, (start, count) in order:
        work = index_dir / (shard_name(i) + ".partial")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for _ in itertools.islice(rows, start - pos):  # skip rows of finished shards
            pass
        chunk = list(itertools.islice(rows, count))
        pos = start + len(chunk)
        if len(chunk) != count:
            raise IndexFormatError(f"{corpus_path}: expected {count} rows from row {start}, read {len(chunk)} (file changed?)")
        write_docs(work / DOCS, [p.id for p in chunk], [p.title for p in chunk], [p.text for p in chunk], row_group_size)


def length_sorted_blocks(table, block_rows: int) -> list:
    """Split an Arrow table of passages into blocks of `block_rows` rows, longest passages first
    (characters of title + text, a proxy for tokens). Each encoder batch then holds passages of
    similar length and pads little: random 16-passage batches of this corpus (mean 127 tokens, p95
    238) pad to about twice the tokens they hold. Rows keep their `row` column, so order is free."""
    import pyarrow.compute as pc

    lengths = pc.add(pc.utf8_length(table["title"]), pc.utf8_length(table["text"]))
    table = table.take(np.argsort(-lengths.to_numpy(zero_copy_only=False), kind="stable"))
    return [table.slice(i, block_rows) for i in range(0, table.num_rows, block_rows)]


def embed_docs(docs_path: Path, spec: EncoderSpec, num_actors: int, cpus_per_actor: float, on_rows=None) -> np.ndarray:
    """Embed a shard's `docs.parquet` with Ray Data over `num_actors` encoder actors.

    Rows go out longest first in blocks of `16 x encoder.batch_size` (`length_sorted_blocks`), so
    several actors (on several nodes) share a shard; each actor call encodes `4 x encoder.batch_size`
    passages and `on_rows(n)` is called as each block's rows come back (progress bars).
    Returns float32 `[rows, dim]` in the file's row order (rows carry their index, so Ray Data's
    output order does not matter).
    Raises:
        RuntimeError: Ray Data returned missing or repeated rows.
    """
    import os

    import pyarrow.parquet as pq
    import ray
    import ray.data

    from actors.retrieval.encoder import PassageEncoderUDF
    from cluster.logs import quiet_library_console

    ray.data.DataContext.get_current().enable_progress_bars = False  # the build's own bar reports
    quiet_library_console("ray.data", drop=("Progress bars disabled",))
    table = pq.read_table(docs_path, columns=["row", "title", "text"])
    num_rows = table.num_rows
    # Ray Data returns a task's output when the task ends: small blocks keep the progress bar moving.
    block_rows = max(1, min(spec.batch_size * 16, -(-num_rows // num_actors)))
    ds = ray.data.from_arrow(length_sorted_blocks(table, block_rows))
    threads = max(1, (os.cpu_count() or 1) // num_actors)
    ds = ds.map_batches(
        PassageEncoderUDF,
        fn_constructor_kwargs={"spec": spec.to_dict(), "threads": threads},
        batch_size=spec.batch_size * 4,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=num_actors),
        num_cpus=cpus_per_actor,
    )
    parts_rows, parts_vecs = [], []
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        parts_rows.append(batch["row"])
        parts_vecs.append(batch["embedding"])
        if on_rows:
            on_rows(len(batch["row"]))
    rows = np.concatenate(parts_rows)
    if len(rows) != num_rows or not np.array_equal(np.sort(rows), np.arange(num_rows)):
        raise RuntimeError(f"{docs_path}: Ray Data returned {len(rows)} embeddings for {num_rows} rows, with gaps or repeats")
    vectors = np.empty((num_rows, parts_vecs[0].shape[1]), dtype=np.float32)
    vectors[rows] = np.concatenate(parts_vecs)
    return vectors


def build_bm25(shard_dir: Path, texts: list[str]) -> int:
    """Index a shard's passages with bm25s (English stopwords) into `shard_dir/bm25`. Returns doc count.

    Each shard computes IDF over its own documents: merged scores approximate one global BM25
    (exactly equal only with 1 shard).
    """
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    retriever.save(str(shard_dir / BM25_DIR))
    return len(texts)


def build_shard(cfg, index_dir: Path, i: int, start: int, count: int, spec: EncoderSpec | None, on_rows=None) -> ShardRecord:
    """Index shard `i` (rows [start, start+count)) from `shard-i.partial/docs.parquet`, then rename it
    into place. `on_rows(n)` reports embedding progress."""
    import pyarrow.parquet as pq

    final = index_dir / shard_name(i)
    work = index_dir / (shard_name(i) + ".partial")
    extra: dict = {}
    if cfg.index.type == "bm25":
        docs = pq.read_table(work / DOCS, columns=["title", "text"]).to_pydict()
        ntotal = build_bm25(work, [f"{t}\n{x}" for t, x in zip(docs["title"], docs["text"])])
    else:
        import faiss

        vectors = embed_docs(work / DOCS, spec, cfg.index.encode_actors, cfg.index.encode_cpus, on_rows)
        factory, params = faiss_factory(cfg.index, vectors.shape[1], len(vectors))
        index = build_faiss_index(vectors, factory, params)
        faiss.write_index(index, str(work / FAISS_FILE))
        ntotal = index.ntotal
        extra = {"dim": int(vectors.shape[1]), "factory": factory, "params": params}
    return finish_shard(work, final, start, count, int(ntotal), extra)


def finish_shard(work: Path, final: Path, start: int, count: int, ntotal: int, extra: dict) -> ShardRecord:
    """Seal a shard built in `work` (`shard-i.partial/`): checksum its files, write `shard.json` (the record
    plus `extra`: dim, factory, params, ...) last, and rename it to `final`. Returns its record."""
    files, size = checksum_dir(work)
    record = ShardRecord(name=final.name, start=start, count=count, files=files, size_bytes=size, ntotal=ntotal)
    atomic_write_text(work / SHARD_RECORD, json.dumps({**asdict(record), **extra}, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    return record


def build_vector_shard(index_dir: Path, i: int, start: int, vectors, index, factory: str, params: dict, write_shard_docs,
                       refine_from: Path | None = None, chunk_rows: int = 65536, max_train: int | None = None) -> dict:
    """Index shard `i` from vectors already computed (no corpus, no encoder): the shard a benchmark or an
    import of precomputed embeddings builds, in the layout `build_shard` writes.

    Args:
        index_dir: the index directory; the shard goes to `shard-i/` via `shard-i.partial/`.
        start: the shard's first global row; it holds `len(vectors)` rows.
        vectors: `[rows, dim]` float16/float32, e.g. a memory-mapped .npy: trained on a sample of
            `max_train` rows (None = all), added `chunk_rows` rows at a time, so RAM holds one chunk.
        index: an empty FAISS index (`new_faiss_index`), or a trained one to clone (one training reused);
            `factory` names it in `shard.json`.
        params: search parameters (nprobe, k_factor, ...) recorded in `shard.json` and applied.
        write_shard_docs: `write_shard_docs(path)` writes the shard's `docs.parquet` (`write_docs_stream`).
        refine_from: a float16 `.npy` of these rows, hard-linked (copied across file systems) as
            `refine.fp16.npy`, for exact re-ranking (`ShardSearcher`).
    Returns:
        The shard's `shard.json` content, with `build_s: {"train": s, "add": s}` (seconds).
    """
    import os

    import faiss

    final, work = index_dir / shard_name(i), index_dir / (shard_name(i) + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    write_shard_docs(work / DOCS)
    if refine_from is not None:
        try:
            os.link(refine_from, work / REFINE_FILE)
        except OSError:
            shutil.copyfile(refine_from, work / REFINE_FILE)
    index = faiss.clone_index(index)
    t0 = time.perf_counter()
    train_faiss_index(index, vectors, max_train)
    t1 = time.perf_counter()
    add_vectors(index, vectors, chunk_rows)
    t2 = time.perf_counter()
    faiss.write_index(apply_search_params(index, params), str(work / FAISS_FILE))
    extra = {"dim": int(vectors.shape[1]), "factory": factory, "params": params,
             "build_s": {"train": round(t1 - t0, 3), "add": round(t2 - t1, 3)}}
    finish_shard(work, final, start, len(vectors), int(index.ntotal), extra)
    return json.loads((final / SHARD_RECORD).read_text())


def finish_index(index_dir: Path, shard_raw: list[dict], *, index_type: str, encoder: dict | None, normalized: bool,
                 index: dict, corpus: dict, build_seconds: float) -> Manifest:
    """Write `manifest.json` (last: its presence means the index is finished) for shards whose `shard.json`
    contents are `shard_raw`, in order. `encoder`: an `EncoderSpec.index_fields()` dict, or None (BM25, or
    an index built from vectors alone). Returns the `Manifest`."""
    first = shard_raw[0]
    manifest = Manifest(
        version=MANIFEST_VERSION,
        index_type=index_type,
        metric="bm25" if index_type == "bm25" else "inner_product",
        dim=first.get("dim"),
        normalized=normalized,
        encoder=encoder,
        index=index,
        num_docs=sum(int(r["count"]) for r in shard_raw),
        shards=[ShardRecord(**{k: r[k] for k in ShardRecord.__dataclass_fields__}) for r in shard_raw],
        corpus=corpus,
        build_seconds=round(build_seconds, 3),
    )
    atomic_write_text(index_dir / MANIFEST, manifest.to_json())
    return manifest


def _finished_shard(index_dir: Path, i: int, start: int, count: int) -> dict | None:
    path = index_dir / shard_name(i) / SHARD_RECORD
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return raw if (raw["start"], raw["count"]) == (start, count) else None


def build_index(cfg, corpus_path: str | Path | None = None, progress: bool = True) -> Manifest:
    """Build (or resume building) the index described by `cfg.index` / `cfg.encoder` from a corpus.

    Args:
        cfg: a `configs.schema.Config`; uses `data` (corpus file, `corpus_limit`), `encoder`, `index`.
        corpus_path: overrides the pack's corpus file (JSONL(.gz) or Parquet, pack or FlashRAG rows).
        progress: show a progress bar (tqdm: passages/s, ETA; it moves as each block of
            `16 x encoder.batch_size` passages is embedded) and a final summary line.
    Returns:
        The `Manifest` written to `<index.dir>/manifest.json`.
    Raises:
        IndexFormatError: the index dir holds a build with other parameters.
        DataPackError / BadRowError: the corpus is missing or has a malformed row (file and line named).
        ray.exceptions.RayError: the Ray Data embedding job failed.
    """
    from tqdm import tqdm

    t0 = time.perf_counter()
    corpus_path = Path(corpus_path) if corpus_path else pack_file(cfg.data.corpus, cfg.data.dir)
    index_dir = Path(cfg.index.dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    num_docs = count_records(corpus_path)
    if cfg.data.corpus_limit:
        num_docs = min(num_docs, cfg.data.corpus_limit)
    ranges = shard_ranges(num_docs, cfg.index.num_shards)
    params = build_params(cfg, corpus_path, num_docs)
    _check_resume(index_dir, params)
    (index_dir / MANIFEST).unlink(missing_ok=True)
    spec = None if cfg.index.type == "bm25" else EncoderSpec.from_config(cfg.encoder)

    done = {i: _finished_shard(index_dir, i, start, count) for i, (start, count) in enumerate(ranges)}
    todo = {i: ranges[i] for i, raw in done.items() if raw is None}
    write_shard_docs(corpus_path, index_dir, todo, cfg.index.docs_row_group_size)
    shard_raw: list[dict] = []
    skipped = sum(ranges[i][1] for i, raw in done.items() if raw is not None)
    # Finished shards count as done from the start (`initial`), so the rate and ETA are this run's.
    bar = tqdm(total=num_docs, initial=skipped, unit="passage", desc=f"index {index_dir.name}",
               disable=not progress, dynamic_ncols=True)
    t_embed = time.perf_counter()
    for i, (start, count) in enumerate(ranges):
        raw = done[i]
        if raw is None:
            bar.set_postfix_str(f"{shard_name(i)}/{len(ranges)}")
            before = bar.n
            record = build_shard(cfg, index_dir, i, start, count, spec, on_rows=bar.update)
            raw = json.loads((index_dir / record.name / SHARD_RECORD).read_text())
            bar.update(count - (bar.n - before))  # BM25 shards report no rows on the way
        shard_raw.append(raw)
    bar.close()
    built, seconds = num_docs - skipped, time.perf_counter() - t_embed
    if progress:
        how = "bm25" if spec is None else f"{spec.model} {spec.backend} {spec.precision}"
        print(f"index {index_dir.name}: {built} passages embedded and indexed in {seconds:.1f} s "
              f"({built / max(seconds, 1e-9):.1f} passages/s, {how}); {skipped} from finished shards", flush=True)

    first = shard_raw[0]
    save_config(cfg, index_dir / "config.yaml")  # the resolved config that produced this index
    return finish_index(
        index_dir, shard_raw, index_type=cfg.index.type, encoder=None if spec is None else spec.index_fields(),
        normalized=bool(spec and spec.normalize),
        index={"type": cfg.index.type, "fp16": cfg.index.fp16, "factory": first.get("factory"), "params": first.get("params", {})},
        corpus={"path": params["corpus"], "limit": cfg.data.corpus_limit}, build_seconds=time.perf_counter() - t0,
    )


def ensure_index(cfg, progress: bool = True) -> Manifest:
    """The finished index at `cfg.index.dir`, built first when it is missing: what every entry point that
    reads an index calls once Ray is up, so a command works on a fresh clone whatever index its config
    names. A finished index (its `manifest.json` reads) is used as it is; a missing or interrupted one is
    built by `build_index` (resuming at the first unfinished shard, with its progress bar), then a line
    `index ready: <dir> (<n> passages, <s> shards) after <t> s` is printed.

    Returns:
        The index's `Manifest`.
    Raises:
        IndexFormatError: an unreadable manifest, or an interrupted build with other parameters;
        DataPackError / BadRowError: the corpus is missing or malformed (as `build_index`).
    """
    index_dir = Path(cfg.index.dir)
    if (index_dir / MANIFEST).is_file():
        return Manifest.load(index_dir)
    t0 = time.perf_counter()
    manifest = build_index(cfg, progress=progress)
    if progress:
        print(f"index ready: {cfg.index.dir} ({manifest.num_docs} passages, {len(manifest.shards)} shards) "
              f"after {time.perf_counter() - t0:.0f} s", flush=True)
    return manifest


def require_index_type(cfg, allowed: tuple[str, ...], why: str, shards: int | None = None) -> None:
    """Refuse a config whose index this entry point cannot read, before Ray starts.

    Args:
        allowed: index types (`index.type`) the caller reads, e.g. ("flat",).
        why: what the caller does with it, for the message ("compares against exact search").
        shards: the number of shards the caller needs (`index.num_shards`), or None for any.
    Raises:
        IndexFormatError: naming the field, the value and the override that fixes it (with the
            index directory the main job builds when that one fits).
    """
    t, n = cfg.index.type, cfg.index.num_shards
    if t in allowed and (shards is None or n == shards):
        return
    need = f"index.type={allowed[0]}" + (f" index.num_shards={shards}" if shards is not None else "")
    fix = ("the main job's index: index.dir=indexes/bm25-1 index.type=bm25 index.num_shards=1" if allowed == ("bm25",)
           else f"e.g. --config configs/retrieval_cpu.yaml ({need}, indexes/minilm-flat-4; built on first use)")
    raise IndexFormatError(f"index.type={t!r} index.num_shards={n}: this command {why} and reads "
                           f"{' or '.join(allowed)}{'' if shards is None else f' with {shards} shard(s)'} "
                           f"indexes only; use {fix}")


def ready_index(cfg, progress: bool = True) -> Manifest:
    """`ensure_index` for an entry point that reads the index before it starts Ray (or never does): a
    finished index is read without Ray; a missing BM25 index is built in this process, a missing dense
    one on a Ray cluster started here (or the one `ray.address` names) and stopped again, so the
    caller's own `init_ray` later starts fresh.

    Returns / Raises: as `ensure_index`.
    """
    if (Path(cfg.index.dir) / MANIFEST).is_file():
        return Manifest.load(cfg.index.dir)
    if cfg.index.type == "bm25":  # no encoder, no Ray Data: built in this process
        return ensure_index(cfg, progress)
    import ray

    from cluster.ray_init import init_ray

    was_up = ray.is_initialized()
    init_ray(cfg.ray)
    try:
        return ensure_index(cfg, progress)
    finally:
        if not was_up:
            ray.shutdown()
