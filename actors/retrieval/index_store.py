"""On-disk layout of a sharded retrieval index: manifest, per-shard FAISS / BM25 index, Parquet doc store.

```
<index dir>/
  manifest.json            written last: encoder, dim, metric, index type, shards, checksums
  build.json               the build's parameters (a resumed build must match them)
  shard-00000/
    shard.json             this shard's record (also written last: its presence = shard complete)
    index.faiss | bm25/    the search structure over this shard's documents
    refine.fp16.npy        optional: the shard's exact vectors in float16, memory-mapped to re-rank
                           an approximate index's candidates (shard.json params `k_factor`)
    docs.parquet           {row, id, title, text}; row = position within the shard
```
A shard owns the contiguous global rows `[start, start + count)` of the corpus; global id = row
number in the corpus. Plain Python, no Ray: the build pipeline writes it, RetrievalShard reads it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import asdict, field
from pathlib import Path

import numpy as np
from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

MANIFEST = "manifest.json"
SHARD_RECORD = "shard.json"
DOCS = "docs.parquet"
FAISS_FILE = "index.faiss"
REFINE_FILE = "refine.fp16.npy"
BM25_DIR = "bm25"


class IndexFormatError(RuntimeError):
    """An index directory is missing, incomplete, or does not match what the caller expects."""


# The manifest's records are pydantic dataclasses: checked types, no unknown keys, and still plain dataclasses
# (`asdict`, `dataclasses.fields`) for the build pipeline.
_RECORD = ConfigDict(extra="forbid", strict=True)


@dataclass(config=_RECORD)
class ShardRecord:
    """One shard: its global row range, files and their SHA-256 checksums, size in bytes."""

    name: str
    start: int
    count: int
    files: dict[str, str] = field(default_factory=dict)
    size_bytes: int = 0
    ntotal: int = 0  # vectors (or BM25 documents) in the shard's index; equals count when complete


@dataclass(config=_RECORD)
class Manifest:
    """What an index directory holds; enough for a reader to load and query it correctly.

    `encoder` is an `EncoderSpec` dict (None for BM25); `metric` is "inner_product" (vectors) or
    "bm25"; `index` holds the type and its parameters (e.g. faiss factory string, fp16);
    `build_seconds` is the wall time of the run that finished the build (a resumed build counts
    only its own part).
    """

    version: int
    index_type: str
    metric: str
    dim: int | None
    normalized: bool
    encoder: dict | None
    index: dict
    num_docs: int
    shards: list[ShardRecord]
    corpus: dict
    build_seconds: float = 0.0

    def to_json(self) -> str:
        """The manifest as indented JSON text (shards as dicts), the content of manifest.json."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def load(cls, index_dir: str | Path) -> "Manifest":
        """Read `<index_dir>/manifest.json`.

        Raises:
            IndexFormatError: no manifest (the build did not finish), or it is unreadable: not JSON, a
                missing or unknown key, or a value of the wrong type (the key named, e.g. `shards[0].count`).
        """
        path = Path(index_dir) / MANIFEST
        if not path.is_file():
            raise IndexFormatError(
                f"{path} not found: {index_dir} is not a finished index. Build it with "
                f"`.venv/bin/python -m scripts.build_index index.dir={index_dir}` (an interrupted build resumes)."
            )
        try:
            return TypeAdapter(cls).validate_json(path.read_bytes())
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".") or "<root>"
            more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
            problem = f"{where}: {err['msg']}{more}"
            raise IndexFormatError(f"{path}: unreadable manifest: {problem}; rebuild the index") from None


def shard_name(i: int) -> str:
    """Directory name of shard `i`, zero-padded to 5 digits: `shard-00000`."""
    return f"shard-{i:05d}"


def shard_ranges(num_docs: int, num_shards: int) -> list[tuple[int, int]]:
    """Split `num_docs` rows into `num_shards` contiguous `(start, count)` ranges, sizes differing by <= 1.

    Raises:
        ValueError: fewer documents than shards, or num_shards < 1.
    """
    if num_shards < 1:
        raise ValueError(f"index.num_shards must be >= 1, got {num_shards}")
    if num_docs < num_shards:
        raise ValueError(f"corpus has {num_docs} documents, fewer than index.num_shards={num_shards}")
    base, extra = divmod(num_docs, num_shards)
    out, start = [], 0
    for i in range(num_shards):
        count = base + (1 if i < extra else 0)
        out.append((start, count))
        start += count
    return out


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, streamed (`hashlib.file_digest`).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def checksum_dir(shard_dir: Path) -> tuple[dict[str, str], int]:
    """SHA-256 of every file below `shard_dir` except the shard record, and their total size (bytes)."""
    files, size = {}, 0
    for p in sorted(shard_dir.rglob("*")):
        if p.is_file() and p.name != SHARD_RECORD:
            files[str(p.relative_to(shard_dir))] = sha256_file(p)
            size += p.stat().st_size
    return files, size


def verify_shard(shard_dir: Path, record: ShardRecord) -> None:
    """Recompute checksums of a shard's files.

    Raises:
        IndexFormatError: a file is missing or its checksum differs from the record.
    """
    files, _ = checksum_dir(shard_dir)
    for name, digest in record.files.items():
        if files.get(name) != digest:
            raise IndexFormatError(f"{shard_dir / name}: checksum mismatch or missing; rebuild this index")


# ---------------------------------------------------------------------------------------------
# FAISS index construction
# ---------------------------------------------------------------------------------------------


def faiss_factory(index_cfg, dim: int, num_vectors: int) -> tuple[str, dict]:
    """The FAISS factory string (inner-product metric) and resolved parameters for one shard.

    flat: exact `Flat` (`SQfp16` with fp16 storage); hnsw: `HNSW{m}[_SQfp16]`; ivf_pq:
    `IVF{nlist},PQ{m}x{nbits}` with nlist capped so each list gets >= 39 training vectors
    (FAISS's own minimum). Raises ValueError for settings FAISS cannot build (dim % pq_m != 0,
    fp16 with ivf_pq).
    """
    t = index_cfg.type
    if t == "flat":
        return ("SQfp16" if index_cfg.fp16 else "Flat"), {}
    if t == "hnsw":
        m = index_cfg.hnsw_m
        return (f"HNSW{m}_SQfp16" if index_cfg.fp16 else f"HNSW{m}"), {
            "ef_construction": index_cfg.hnsw_ef_construction,
            "ef_search": index_cfg.hnsw_ef_search,
        }
    if t == "ivf_pq":
        if index_cfg.fp16:
            raise ValueError("index.fp16 applies to flat and hnsw; ivf_pq stores PQ codes (set index.fp16=false)")
        if dim % index_cfg.pq_m:
            raise ValueError(f"index.pq_m={index_cfg.pq_m} must divide the embedding dim {dim}")
        nlist = max(1, min(index_cfg.ivf_nlist, num_vectors // 39))
        return f"IVF{nlist},PQ{index_cfg.pq_m}x{index_cfg.pq_nbits}", {"nlist": nlist, "nprobe": index_cfg.ivf_nprobe}
    raise ValueError(f"index.type={t!r} has no FAISS index (one of flat, hnsw, ivf_pq)")


def cap_ivf_nlist(factory: str, num_vectors: int) -> str:
    """A FAISS factory string with its `IVF<nlist>` lowered so each list gets >= 39 training vectors
    (FAISS's own minimum; as `faiss_factory` does for `index.ivf_nlist`). Other strings are returned as they are."""
    import re

    return re.sub(r"IVF(\d+)", lambda m: f"IVF{max(1, min(int(m.group(1)), num_vectors // 39))}", factory, count=1)


def new_faiss_index(dim: int, factory: str, params: dict):
    """An empty inner-product FAISS index from a factory string (HNSW's `ef_construction` applied).

    PQ indexes skip FAISS's polysemous training (which `index_factory` turns on for 8-bit codes): it only
    reorders the codes for Hamming-distance filtering, which no search here uses (polysemous_ht = 0), and
    it took most of the training time (1.7 s per sub-quantizer on this machine, whatever the data size).

    Raises:
        RuntimeError: FAISS cannot parse `factory` for `dim` (e.g. a PQ size that does not divide it).
    """
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if "ef_construction" in params:
        faiss.downcast_index(index).hnsw.efConstruction = params["ef_construction"]
    ivf = faiss.try_extract_index_ivf(index)
    inner = faiss.downcast_index(ivf if ivf is not None else index)
    if getattr(inner, "do_polysemous_training", False):
        inner.do_polysemous_training = False
    return index


def train_faiss_index(index, vectors: np.ndarray, max_train: int | None = None, seed: int = 0) -> None:
    """Train `index` (no-op when it needs none) on `vectors` (`[n, dim]`, any float dtype; a memory-mapped
    array is read only at the sampled rows): all of them, or `max_train` rows drawn without replacement
    (sorted, so a file on disk is read in order), converted to float32."""
    if index.is_trained:
        return
    rows = None
    if max_train is not None and len(vectors) > max_train:
        rows = np.sort(np.random.default_rng(seed).choice(len(vectors), max_train, replace=False))
    index.train(np.ascontiguousarray(vectors if rows is None else vectors[rows], dtype=np.float32))


def add_vectors(index, vectors: np.ndarray, chunk_rows: int | None = None) -> None:
    """Add `vectors` (`[n, dim]`, any float dtype, memory-mapped or not) to a trained index in chunks of
    `chunk_rows` rows (None = all at once), each converted to float32: only one chunk is in RAM as float32."""
    step = chunk_rows or max(1, len(vectors))
    for i in range(0, len(vectors), step):
        index.add(np.ascontiguousarray(vectors[i : i + step], dtype=np.float32))


def build_faiss_index(vectors: np.ndarray, factory: str, params: dict):
    """Build an inner-product FAISS index over float32 `[n, dim]` vectors (trains IVF-PQ first)."""
    index = new_faiss_index(vectors.shape[1], factory, params)
    train_faiss_index(index, vectors)
    add_vectors(index, vectors)
    return apply_search_params(index, params)


# FAISS 1.15 moves flat searches to its BLAS path only for very large query batches; here that made
# 64 queries over a 13k x 384 shard 5x slower (36 ms vs 7 ms, one thread). At this threshold single
# queries keep the direct path and batches of >= ~8 queries use BLAS.
FAISS_BLAS_THRESHOLD = 1000


def tune_faiss(threads: int) -> None:
    """Set FAISS's OpenMP threads (1 per shard actor: shards share a node's cores, and FAISS's
    spinning OpenMP threads slow a torch encoder in the same process) and its BLAS threshold."""
    import faiss

    faiss.omp_set_num_threads(threads)
    faiss.cvar.distance_compute_blas_threshold = FAISS_BLAS_THRESHOLD


def load_faiss_index(path: Path, params: dict, mmap: bool = True):
    """Read a shard's FAISS index (memory-mapped where FAISS supports it) and apply search params."""
    import faiss

    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    try:
        index = faiss.read_index(str(path), flags)
    except RuntimeError:  # not every index type can be memory-mapped
        index = faiss.read_index(str(path))
    return apply_search_params(index, params)


def apply_search_params(index, params: dict):
    """Set query-time knobs: HNSW `efSearch`, IVF `nprobe` (also below a refine index), a FAISS refine
    index's `k_factor` (candidates re-ranked = k_factor x k); no-op for flat. Returns the index."""
    import faiss

    if "ef_search" in params:
        faiss.downcast_index(index).hnsw.efSearch = params["ef_search"]
    if "nprobe" in params:
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]
    refine = faiss.downcast_index(index)
    if "k_factor" in params and isinstance(refine, faiss.IndexRefine):
        refine.k_factor = float(params["k_factor"])
    return index


# ---------------------------------------------------------------------------------------------
# Documents
# ---------------------------------------------------------------------------------------------


class DocStore:
    """A shard's documents in Parquet, memory-mapped; rows are decoded one row group at a time.

    Memory is the file mapping plus at most `cache_groups` decoded row groups (an LRU cache of this
    instance), so a shard actor holds its index and a small working set, not the corpus text.
    """

    def __init__(self, path: str | Path, cache_groups: int = 64):
        import pyarrow.parquet as pq

        self.path = Path(path)
        self._file = pq.ParquetFile(str(self.path), memory_map=True)
        meta = self._file.metadata
        self.num_rows = meta.num_rows
        self._group_starts = np.cumsum([0] + [meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
        # Per instance (wraps the bound method): the cache goes with the store, none is shared or kept alive.
        self._group = functools.lru_cache(maxsize=cache_groups)(self._read_group)

    def _read_group(self, g: int) -> dict:
        """Row group `g` decoded as `{"id": [...], "title": [...], "text": [...]}`."""
        table = self._file.read_row_group(g, columns=["id", "title", "text"])
        return {name: table.column(name).to_pylist() for name in ("id", "title", "text")}

    def get(self, rows) -> list[dict]:
        """Documents at local rows (ints in `[0, num_rows)`) as `{doc_id, title, text}` dicts.

        Raises:
            IndexError: a row outside the shard.
        """
        out = []
        for r in rows:
            r = int(r)
            if not 0 <= r < self.num_rows:
                raise IndexError(f"row {r} outside {self.path} (0..{self.num_rows - 1})")
            g = int(np.searchsorted(self._group_starts, r, side="right") - 1)
            cols = self._group(g)
            j = r - int(self._group_starts[g])
            out.append({"doc_id": cols["id"][j], "title": cols["title"][j], "text": cols["text"][j]})
        return out


def write_docs(path: Path, ids: list[str], titles: list[str], texts: list[str], row_group_size: int) -> None:
    """Write a shard's documents as Parquet `{row, id, title, text}`, uncompressed (cheap mmap reads),
    in row groups of `row_group_size` rows."""
    write_docs_stream(path, [(ids, titles, texts)], row_group_size)


def write_docs_stream(path: Path, chunks, row_group_size: int) -> int:
    """Write a doc store from an iterable of `(ids, titles, texts)` chunks (lists of str, equal lengths),
    one chunk in RAM at a time: the same file `write_docs` writes (`row` counts on across chunks), for
    stores of millions of rows. Chunks of a multiple of `row_group_size` rows keep every group full.
    Returns the number of rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("row", pa.int64()), ("id", pa.string()), ("title", pa.string()), ("text", pa.string())])
    rows = 0
    with pq.ParquetWriter(path, schema, compression="none") as writer:
        for ids, titles, texts in chunks:
            table = pa.table(
                {
                    "row": pa.array(np.arange(rows, rows + len(ids), dtype=np.int64)),
                    "id": pa.array(ids, pa.string()),
                    "title": pa.array(titles, pa.string()),
                    "text": pa.array(texts, pa.string()),
                },
                schema=schema,
            )
            writer.write_table(table, row_group_size=row_group_size)
            rows += len(ids)
    return rows


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file via a temporary sibling and rename, so readers never see half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_shard_vectors(index_dir: str | Path) -> np.ndarray:
    """All stored vectors of a flat (exact) index, concatenated in global id order: float32 `[num_docs, dim]`.

    Used to build the unsharded reference index that sharded search must equal.

    Raises:
        IndexFormatError: the index is not a flat FAISS index (HNSW / IVF-PQ / BM25 hold no exact vectors).
    """
    import faiss

    manifest = Manifest.load(index_dir)
    if manifest.index_type != "flat":
        raise IndexFormatError(f"{index_dir}: vectors can only be read back from a flat index, not {manifest.index_type}")
    parts = []
    for s in manifest.shards:
        index = faiss.read_index(str(Path(index_dir) / s.name / FAISS_FILE))
        parts.append(index.reconstruct_n(0, index.ntotal))
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)
