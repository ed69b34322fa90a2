"""Data of `scripts.bench.retrieval_scale`: real and drawn vectors written to memory-mapped float16 files,
exact top-k by brute force over them in chunks, recall, the run's vector sets (`VectorSet`: real vectors of
the config's flat index, or draws of a mixture fitted to them), and synthetic passages for the doc store.

Nothing here holds N vectors in RAM: vectors are written block by block into one `.npy` per shard
(`np.lib.format.open_memmap`, float16: the stored corpus *is* the float16 vectors, and every index and the
exact search read the same ones); exact search reads them back a chunk at a time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK_ROWS = 32768  # vectors drawn per RNG block: the draws depend on (seed, N), not on the shard count


# ---------------------------------------------------------------------------------------------
# Vectors
# ---------------------------------------------------------------------------------------------


@dataclass
class Mixture:
    """A diagonal Gaussian mixture fitted to real vectors, optionally mapped to another dimension.

    means, stds: float32 `[K, d_real]`; weights: `[K]` summing to 1; lift: float32 `[d_real, d]` with
    orthonormal rows when d > d_real (inner products kept exactly: the drawn vectors are the real ones'
    geometry in a rotated d-dim space), orthonormal columns when d < d_real (a projection), None when equal;
    normalize: draws are scaled to unit length (the real vectors were).
    """

    means: np.ndarray
    stds: np.ndarray
    weights: np.ndarray
    lift: np.ndarray | None
    normalize: bool
    fitted_on: int

    @property
    def dim(self) -> int:
        """Dimension of the drawn vectors."""
        return self.means.shape[1] if self.lift is None else self.lift.shape[1]

    def describe(self) -> str:
        """One line stating how the vectors are drawn."""
        d_real = self.means.shape[1]
        how = ("" if self.lift is None else
               f", mapped {d_real}->{self.dim} by a random orthonormal {'embedding (inner products kept)' if self.dim > d_real else 'projection'}")
        return (f"diagonal Gaussian mixture, {len(self.weights)} components fitted by k-means to {self.fitted_on} real "
                f"{d_real}-d vectors{how}{', normalized' if self.normalize else ''}")

    def to_dim(self, x: np.ndarray) -> np.ndarray:
        """Real-space vectors `[n, d_real]` in the drawn space `[n, dim]` (lifted, normalized as draws are)."""
        x = np.asarray(x, dtype=np.float32)
        if self.lift is not None:
            x = x @ self.lift
        if self.normalize:
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        return x.astype(np.float32)

    def draw(self, count: int, seed) -> np.ndarray:
        """`count` vectors, float32 `[count, dim]`, from `np.random.default_rng(seed)` (an int or a list of ints)."""
        rng = np.random.default_rng(seed)
        comp = rng.choice(len(self.weights), size=count, p=self.weights)
        z = rng.standard_normal((count, self.means.shape[1]), dtype=np.float32)
        return self.to_dim(self.means[comp] + self.stds[comp] * z)


def fit_mixture(real: np.ndarray, components: int, dim: int, seed: int = 0) -> Mixture:
    """Fit a `Mixture` to real vectors `[n, d_real]`: k-means (FAISS, 20 iterations) gives the components;
    each one's mean, per-dimension std and weight come from the vectors assigned to it.

    Args:
        components: wanted K, capped at n // 20 (>= 1) so every component has data.
        dim: dimension of the drawn vectors (see `Mixture.lift`).
    Raises:
        ValueError: fewer than 2 real vectors.
    """
    import faiss

    real = np.ascontiguousarray(real, dtype=np.float32)
    n, d_real = real.shape
    if n < 2:
        raise ValueError(f"a mixture needs at least 2 real vectors, got {n}")
    k = max(1, min(components, n // 20))
    km = faiss.Kmeans(d_real, k, niter=20, seed=seed, verbose=False)
    km.train(real)
    _, assign = km.index.search(real, 1)
    assign = assign[:, 0]
    order = np.argsort(assign, kind="stable")
    labels, starts, counts = np.unique(assign[order], return_index=True, return_counts=True)
    sums = np.add.reduceat(real[order], starts, axis=0)
    sq = np.add.reduceat(real[order].astype(np.float64) ** 2, starts, axis=0)
    means = sums / counts[:, None]
    stds = np.sqrt(np.maximum(sq / counts[:, None] - means.astype(np.float64) ** 2, 0.0))
    lonely = counts < 2  # one vector: no spread of its own, take the others' average
    if lonely.any() and (~lonely).any():
        stds[lonely] = stds[~lonely].mean(axis=0)
    norms = np.linalg.norm(real, axis=1)
    lift = None
    if dim != d_real:
        q, _ = np.linalg.qr(np.random.default_rng(seed + 1).standard_normal((max(dim, d_real), min(dim, d_real))))
        lift = (q.T if dim > d_real else q).astype(np.float32)
    return Mixture(means.astype(np.float32), stds.astype(np.float32), (counts / counts.sum()).astype(np.float64),
                   lift, bool(np.allclose(norms, 1.0, atol=1e-3)), n)


def write_vectors(out_dir: Path, ranges: list[tuple[int, int]], dim: int, block, block_rows: int = BLOCK_ROWS) -> list[Path]:
    """Write N vectors as one float16 `.npy` per shard range (`shard-xxxxx.f16.npy`), block by block.

    Args:
        ranges: the shards' `(start, count)` (`shard_ranges`), contiguous from 0.
        block: `block(start, count)` -> float `[count, dim]`, the rows `[start, start + count)`; called
            for consecutive blocks of `block_rows` rows, so RAM holds one block.
    Returns:
        The files, in shard order.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"shard-{i:05d}.f16.npy" for i in range(len(ranges))]
    files = [np.lib.format.open_memmap(p, mode="w+", dtype=np.float16, shape=(c, dim)) for p, (_, c) in zip(paths, ranges)]
    n = ranges[-1][0] + ranges[-1][1]
    for b0 in range(0, n, block_rows):
        x = np.asarray(block(b0, min(block_rows, n - b0)), dtype=np.float32)
        b1 = b0 + len(x)
        for f, (s, c) in zip(files, ranges):
            lo, hi = max(s, b0), min(s + c, b1)
            if lo < hi:
                f[lo - s : hi - s] = x[lo - b0 : hi - b0].astype(np.float16)
    for f in files:
        f.flush()
    del files
    return paths


def open_vectors(paths: list[Path]) -> list[np.ndarray]:
    """The shard vector files, memory-mapped read-only (float16 `[count, dim]` each)."""
    return [np.load(p, mmap_mode="r") for p in paths]


def exact_topk(parts: list[np.ndarray], queries: np.ndarray, k: int, chunk_rows: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k over the concatenated `parts` (float16/32 `[count_i, dim]`, global row =
    position in the concatenation) by brute force, `chunk_rows` rows (converted to float32) at a time.

    Returns:
        `(scores [q, k] float32, ids [q, k] int64)`, ordered as `merge_topk` orders (ties by lower id).
    """
    import faiss

    from actors.retrieval.shard import merge_topk

    q = np.ascontiguousarray(queries, dtype=np.float32)
    best_s = np.full((len(q), k), -np.inf, dtype=np.float32)
    best_i = np.full((len(q), k), -1, dtype=np.int64)
    offset = 0
    for part in parts:
        for i in range(0, len(part), chunk_rows):
            xb = np.ascontiguousarray(part[i : i + chunk_rows], dtype=np.float32)
            s, j = faiss.knn(q, xb, min(k, len(xb)), metric=faiss.METRIC_INNER_PRODUCT)
            best_s, best_i = merge_topk([best_s, s], [best_i, np.where(j >= 0, j + offset + i, -1)], k)
        offset += len(part)
    return best_s, best_i


def gather_rows(parts: list[np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Vectors of global rows `ids` (any shape; -1 gives zeros) from the shard parts: float32 `[*ids.shape, dim]`."""
    flat = ids.ravel()
    out = np.zeros((len(flat), parts[0].shape[1]), dtype=np.float32)
    offset = 0
    for part in parts:
        sel = (flat >= offset) & (flat < offset + len(part))
        if sel.any():
            local = flat[sel] - offset
            order = np.argsort(local)  # read the file in order
            rows = np.asarray(part[local[order]], dtype=np.float32)
            out[np.flatnonzero(sel)[order]] = rows
        offset += len(part)
    return out.reshape(*ids.shape, -1)


def recall_at_k(got: np.ndarray, exact_ids: np.ndarray, exact_scores: np.ndarray, parts: list[np.ndarray],
                queries: np.ndarray, atol: float = 1e-5) -> float:
    """Recall@k of returned ids `got [q, k]` against exact top-k `[q, k]`: the share of the exact top-k found,
    where a returned id outside the exact list still counts when its true score ties the k-th exact score
    (within `atol`: equal vectors or float rounding make either answer exact)."""
    k = exact_ids.shape[1]
    true = np.einsum("qkd,qd->qk", gather_rows(parts, np.where(got >= 0, got, 0)), np.asarray(queries, np.float32))
    hits = 0
    for row, g, t, kth in zip(exact_ids, got, true, exact_scores[:, -1]):
        inside = np.isin(g, row) & (g >= 0)
        hits += int(inside.sum()) + int(((~inside) & (g >= 0) & (t >= kth - atol)).sum())
    return min(1.0, hits / (k * len(got)))


# ---------------------------------------------------------------------------------------------
# The vector sets of a run
# ---------------------------------------------------------------------------------------------


class OptionError(ValueError):
    """A command-line option is out of range or inconsistent (printed as `error: ...`, exit 2)."""


@dataclass
class VectorSet:
    """One kind of vectors to index: rows come from `block(start, count)`, documents from `write_docs(path, start, count)`."""

    kind: str
    n: int
    dim: int
    how: str
    queries_how: str
    block: object
    qvecs: np.ndarray
    texts: list[str] | None
    write_docs: object
    doc_row: object
    encoder: dict | None
    normalized: bool
    doc_bytes: int  # estimated bytes per stored passage


def load_real(cfg, queries: int) -> dict:
    """The config's flat index (built when missing): its vectors float32 `[n, d]`, documents, manifest, and up
    to `queries` real questions (dev, test, train) with their vectors under the index's encoder."""
    import pyarrow.parquet as pq

    from actors.retrieval.encoder import EncoderSpec, TextEncoder
    from actors.retrieval.index_store import DOCS, load_shard_vectors
    from pipelines.build_index import ready_index, require_index_type
    from pipelines.data import iter_qa, pack_file

    require_index_type(cfg, ("flat",), "reads real passage vectors from a flat index")
    manifest = ready_index(cfg)
    index_dir = Path(cfg.index.dir)
    docs: dict[str, list] = {"id": [], "title": [], "text": []}
    for s in manifest.shards:
        for key, col in pq.read_table(index_dir / s.name / DOCS, columns=list(docs)).to_pydict().items():
            docs[key] += col
    questions: list[str] = []
    for split in (cfg.data.dev, cfg.data.test, cfg.data.train):
        questions += [ex.question for ex in iter_qa(pack_file(split, cfg.data.dir), limit=queries)]
        questions = list(dict.fromkeys(questions))[:queries]
        if len(questions) >= queries:
            break
    print(f"real vectors: {manifest.num_docs} from {index_dir}; encoding {len(questions)} questions ...", flush=True)
    qvecs = TextEncoder(EncoderSpec(**manifest.encoder)).encode_queries(questions)
    return {"vectors": load_shard_vectors(index_dir), "docs": docs, "manifest": manifest, "index_dir": index_dir,
            "questions": questions, "qvecs": qvecs}


def real_set(real: dict, args) -> VectorSet:
    """The real vectors (first --n of them) as a VectorSet."""
    vec, docs, m = real["vectors"], real["docs"], real["manifest"]
    n = min(args.n, len(vec))
    row_of = {d: i for i, d in enumerate(docs["id"][:n])}

    def write(path, start, count):
        from actors.retrieval.index_store import write_docs

        sl = slice(start, start + count)
        write_docs(path, docs["id"][sl], docs["title"][sl], docs["text"][sl], args.row_group)

    return VectorSet("real", n, vec.shape[1], f"{m.encoder['model']} vectors of the pack's first {n} passages ({real['index_dir']})",
                     f"{len(real['questions'])} real questions (dev, test, train) under the same encoder",
                     lambda s, c: vec[s : s + c], real["qvecs"], real["questions"], write, row_of.__getitem__,
                     m.encoder, m.normalized, 700)


def drawn_set(real: dict | None, args, cfg) -> VectorSet:
    """Vectors drawn from a mixture fitted to the real vectors (or to --fit-from) as a VectorSet."""
    from actors.retrieval.index_store import write_docs_stream

    if args.fit_from:
        fit = np.load(args.fit_from, mmap_mode="r")
        if fit.ndim != 2 or len(fit) < 40:
            raise OptionError(f"--fit-from {args.fit_from}: shape {list(fit.shape)}; expected [n >= 40, d]")
        rows = np.sort(np.random.default_rng(args.seed).choice(len(fit), min(len(fit), 200_000), replace=False))
        mix = fit_mixture(np.asarray(fit[rows], dtype=np.float32), args.mixture, args.dim, args.seed)
        qvecs, qhow, source = mix.draw(args.queries, [args.seed, 2**62]), f"{args.queries} draws of the same mixture", args.fit_from
    else:
        mix = fit_mixture(real["vectors"], args.mixture, args.dim, args.seed)
        qvecs, source = mix.to_dim(real["qvecs"]), str(real["index_dir"])
        qhow = f"{len(qvecs)} real questions under {real['manifest'].encoder['model']}, mapped as the passages are"
    passages = PassageSource.from_pack(cfg.data.dir, cfg.data.corpus, words=args.doc_words, seed=args.seed)

    def write(path, start, count):
        write_docs_stream(path, passages.chunks(start, count, max(args.row_group, 65536 // args.row_group * args.row_group)),
                          args.row_group)

    return VectorSet("drawn", args.n, args.dim, f"{mix.describe()} ({source}); {args.doc_words}-word synthetic passages",
                     qhow, lambda s, c: mix.draw(c, [args.seed, s]), qvecs, None, write, lambda d: int(d[4:]),
                     None, mix.normalize, args.doc_words * 6 + 60)


# ---------------------------------------------------------------------------------------------
# Synthetic passages and the doc store
# ---------------------------------------------------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of uint64 values: a per-row random number that does not depend on chunking."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class PassageSource:
    """Synthetic passages of wiki-18's length: each row's text is a window of `words` consecutive real
    words (the pack's passages joined), 1 row in 8 shorter (10..words-1 words, an article's last block as
    in DPR's 100-word split; an assumption, not measured on wiki-18), its title a real title. Row r's
    passage depends only on (seed, r). `doc_id` is `syn-<row, 9 digits>`.

    Args:
        texts, titles: real passages and titles to draw words and titles from (e.g. the pack's first few thousand).
    Raises:
        ValueError: fewer than `words + 1` words in `texts`, or no titles.
    """

    def __init__(self, texts: list[str], titles: list[str], words: int = 100, seed: int = 0):
        tokens = " ".join(texts).split()
        if len(tokens) <= words or not titles:
            raise ValueError(f"need more than {words} words and a title to draw passages from, got {len(tokens)} words")
        self.buf = " ".join(tokens)
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        self.starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
        self.ends = self.starts + lengths
        self.titles, self.words, self.seed = list(titles), words, seed

    @classmethod
    def from_pack(cls, data_dir=None, corpus: str = "corpus.jsonl.gz", sample: int = 3000, words: int = 100,
                  seed: int = 0) -> "PassageSource":
        """Words and titles of the data pack's first `sample` passages. Raises DataPackError: no pack."""
        from pipelines.data import iter_corpus, pack_file

        rows = list(iter_corpus(pack_file(corpus, data_dir), limit=sample))
        return cls([p.text for p in rows], [p.title for p in rows], words, seed)

    def rows(self, start: int, count: int) -> tuple[list[str], list[str], list[str]]:
        """`(ids, titles, texts)` of rows `[start, start + count)`."""
        r = np.arange(start, start + count, dtype=np.uint64)
        h1 = _mix(r ^ np.uint64(self.seed * 0x51ED27 + 1))
        h2 = _mix(h1)
        short = (h2 % np.uint64(8)) == 0
        length = np.where(short, 10 + (h2 >> np.uint64(8)) % np.uint64(max(1, self.words - 10)), self.words).astype(np.int64)
        first = (h1 % np.uint64(len(self.starts) - self.words)).astype(np.int64)
        a, b = self.starts[first], self.ends[first + length - 1]
        t = (h2 >> np.uint64(20)) % np.uint64(len(self.titles))
        buf, titles = self.buf, self.titles
        return ([f"syn-{i:09d}" for i in range(start, start + count)], [titles[j] for j in t.tolist()],
                [buf[x:y] for x, y in zip(a.tolist(), b.tolist())])

    def chunks(self, start: int, count: int, chunk_rows: int = 65536):
        """`rows` for `[start, start + count)` in chunks of `chunk_rows` (for `write_docs_stream`)."""
        for s in range(start, start + count, chunk_rows):
            yield self.rows(s, min(chunk_rows, start + count - s))


def fill_docstore(path: Path, source: PassageSource, n: int, row_group_size: int = 256) -> dict:
    """Write a doc store (`write_docs_stream`) of rows `[0, n)` of `source`. Returns {"rows", "write_s", "bytes"}."""
    from actors.retrieval.index_store import write_docs_stream

    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = write_docs_stream(path, source.chunks(0, n, max(row_group_size, 65536 // row_group_size * row_group_size)),
                             row_group_size)
    return {"rows": rows, "write_s": time.perf_counter() - t0, "bytes": path.stat().st_size}


def measure_docstore(path: str, fetches: int, k: int, seed: int = 0) -> dict:
    """Open a doc store (`DocStore`, memory-mapped) in this process and fetch `fetches` top-k lists of
    random rows (uniform over the store, as a search's hits are), one `get` per list. Meant for a fresh
    process (`docstore_in_subprocess`), so resident memory is the store's.

    Returns:
        {"rows", "open_s", "p50_ms", "p99_ms", "lists_per_s", "ids_right" (every doc_id is `syn-<row>`),
         "mem_open", "mem_after" (`process_memory` dicts, bytes)}.
    """
    from actors.retrieval.index_store import DocStore
    from actors.retrieval.shard import process_memory

    base = process_memory()
    t0 = time.perf_counter()
    store = DocStore(path)
    open_s = time.perf_counter() - t0
    mem_open = process_memory()
    rng = np.random.default_rng(seed)
    lat, right = [], True
    t_all = time.perf_counter()
    for _ in range(fetches):
        rows = rng.integers(0, store.num_rows, size=k)
        t = time.perf_counter()
        docs = store.get(rows)
        lat.append(time.perf_counter() - t)
        right &= all(d["doc_id"] == f"syn-{r:09d}" for d, r in zip(docs, rows.tolist()))
    wall = time.perf_counter() - t_all
    ms = np.asarray(lat) * 1000
    return {"rows": store.num_rows, "open_s": open_s, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "lists_per_s": fetches / wall, "ids_right": bool(right),
            "mem_base": base, "mem_open": mem_open, "mem_after": process_memory()}


def docstore_in_subprocess(path: Path, fetches: int, k: int, seed: int = 0) -> dict:
    """`measure_docstore` in a fresh Python process, so its memory is the store's alone.

    Raises:
        RuntimeError: the process failed (its stderr's last lines in the message).
    """
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = ("import json, sys; from scripts.bench.retrieval_scale_data import measure_docstore; "
            "print(json.dumps(measure_docstore(*json.loads(sys.argv[1]))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([str(path), fetches, k, seed])], cwd=root, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"doc store measurement failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
