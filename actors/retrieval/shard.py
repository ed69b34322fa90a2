"""`ShardSearcher`: one index shard (FAISS or bm25s) and its memory-mapped Parquet documents, the
plain class behind each shard actor; `merge_topk` / `same_topk`, the `Hit` record and the
retrieval errors. Usable without Ray."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TypedDict

import numpy as np

from actors.retrieval.gpu_index import gpu_plan, to_gpu
from actors.retrieval.index_store import (
    BM25_DIR,
    DOCS,
    FAISS_FILE,
    REFINE_FILE,
    SHARD_RECORD,
    DocStore,
    apply_search_params,
    load_faiss_index,
    tune_faiss,
)

log = logging.getLogger(__name__)
_bm25_gpu_logged = False  # "BM25 shards ignore gpu" is logged once per process


class Hit(TypedDict):
    """One retrieved passage. `score`: inner product (dense) or BM25 score; higher is better."""

    doc_id: str
    title: str
    text: str
    score: float


class ShardUnavailableError(RuntimeError):
    """A shard (or query encoder) stayed down through every retry; the pool never answers with fewer shards."""


class RetrievalRequestError(ValueError):
    """A search request is malformed (names the field and the allowed range)."""


def merge_topk(scores: list[np.ndarray], ids: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard top-k lists into the global top-k.

    Args:
        scores: per shard, float32 `[n_queries, k_s]`, higher is better; padding slots hold -inf.
        ids: per shard, int64 `[n_queries, k_s]` global ids; padding slots hold -1.
        k: how many to keep.
    Returns:
        `(scores [n, k] float32, ids [n, k] int64)`, ordered by score descending and, among equal
        scores, by global id ascending -- the order an exact flat search over the whole corpus gives
        (FAISS keeps the lowest ids among ties). Rows with fewer than k real hits end in (-inf, -1).
    """
    all_scores = np.concatenate(scores, axis=1)
    all_ids = np.concatenate(ids, axis=1)
    all_scores = np.where(all_ids < 0, -np.inf, all_scores).astype(np.float32)
    # Padding (-1) must sort after real ids with the same -inf score.
    tie_key = np.where(all_ids < 0, np.iinfo(np.int64).max, all_ids)
    order = np.lexsort((tie_key, -all_scores), axis=-1)[:, :k]
    out_s = np.take_along_axis(all_scores, order, axis=1)
    out_i = np.take_along_axis(all_ids, order, axis=1)
    if out_s.shape[1] < k:  # fewer candidates than k in total
        pad = k - out_s.shape[1]
        out_s = np.pad(out_s, ((0, 0), (0, pad)), constant_values=-np.inf)
        out_i = np.pad(out_i, ((0, 0), (0, pad)), constant_values=-1)
    return out_s, out_i


def same_topk(a_scores: np.ndarray, a_ids: np.ndarray, b_scores: np.ndarray, b_ids: np.ndarray, atol: float = 1e-4) -> bool:
    """Whether two top-k results `[n, k]` are the same ranking up to ties.

    Scores must agree within `atol`. Positions are grouped into runs of near-equal scores (within
    `atol`: float rounding can reorder such docs); each run must hold the same ids, except the run
    reaching position k-1, where equally scored docs beyond the cut may legitimately differ
    (FAISS itself picks arbitrarily among ties at the boundary).
    """
    if a_ids.shape != b_ids.shape or not np.allclose(a_scores, b_scores, atol=atol, equal_nan=True):
        return False
    k = a_ids.shape[1]
    for sa, ia, ib in zip(a_scores, a_ids, b_ids):
        start = 0
        while start < k:
            end = start + 1
            while end < k and abs(sa[end] - sa[start]) <= atol:
                end += 1
            if end < k and set(ia[start:end]) != set(ib[start:end]):
                return False
            start = end
    return True


def rerank_exact(vectors: np.ndarray, queries: np.ndarray, candidates: np.ndarray, k: int,
                 chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Re-rank candidate rows by their exact inner product with each query.

    Args:
        vectors: `[rows, dim]` exact vectors (any float dtype; a memory-mapped file is read only at the
            candidates' rows).
        queries: float32 `[n, dim]`.
        candidates: int64 `[n, c]` rows into `vectors` (an approximate index's top-c); -1 = none.
        k: hits to keep per query.
        chunk: queries re-ranked at a time (bounds the gathered `[chunk, c, dim]` float32 block).
    Returns:
        `(scores [n, k] float32, rows [n, k] int64)`, ordered as `merge_topk` orders (score descending,
        then row ascending); padded with (-inf, -1) when a query has fewer than k candidates.
    """
    out_s, out_i = [], []
    for i in range(0, len(queries), chunk):
        cand = candidates[i : i + chunk]
        valid = cand >= 0
        uniq, inv = np.unique(np.where(valid, cand, 0), return_inverse=True)  # sorted rows: a file is read in order
        gathered = np.asarray(vectors[uniq], dtype=np.float32)[inv.reshape(cand.shape)]  # [q, c, dim]
        scores = np.einsum("qcd,qd->qc", gathered, queries[i : i + chunk])
        s, r = merge_topk([np.where(valid, scores, -np.inf)], [np.where(valid, cand, -1)], k)
        out_s.append(s)
        out_i.append(r)
    return np.concatenate(out_s), np.concatenate(out_i)


def process_memory() -> dict:
    """This process's resident memory in bytes: `rss` (psutil), and from Linux's /proc/self/status `anon`
    (RssAnon: heap, an index read into RAM) and `file` (RssFile + RssShmem: pages of memory-mapped files
    and shared memory now in RAM, which the kernel can drop and re-read); None where unavailable."""
    import psutil

    out = {"pid": psutil.Process().pid, "rss": psutil.Process().memory_info().rss, "anon": None, "file": None}
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        kib = {k: int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile", "RssShmem") if k in fields}
        out["anon"] = kib.get("RssAnon")
        out["file"] = kib.get("RssFile", 0) + kib.get("RssShmem", 0) if "RssFile" in kib else None
    except OSError:
        pass
    return out


class ShardSearcher:
    """One shard: its FAISS (or bm25s) index and its Parquet doc store, memory-mapped.

    Args:
        shard_dir: `<index dir>/shard-xxxxx` written by `pipelines.build_index`.
        faiss_threads: OpenMP threads for FAISS searches (shards share the node's cores).
        search_delay_s: extra seconds slept per search; for fault-injection tests and latency
            experiments only (0 in normal use).
        gpu: move a FAISS index to GPU 0 of this process (the actor's Ray-assigned GPU) when
            `actors.retrieval.gpu_index.gpu_plan` allows it (flat in float16, IVF-Flat, supported
            IVF-PQ); otherwise, e.g. HNSW, it stays on CPU with a warning. BM25 shards ignore it.
            Raises RuntimeError when faiss has no GPU support (the faiss-cpu wheel).

    A shard with `refine.fp16.npy` and a `k_factor` > 1 in its params searches its index for
    k_factor x k candidates and re-ranks them by exact inner product with those memory-mapped vectors
    (`rerank_exact`): an IVF-PQ shard's recall without its exact vectors in RAM.
    """

    def __init__(self, shard_dir: str, faiss_threads: int = 1, search_delay_s: float = 0.0, gpu: bool = False):
        self.dir = Path(shard_dir)
        record = json.loads((self.dir / SHARD_RECORD).read_text())
        self.start, self.count = int(record["start"]), int(record["count"])
        self.search_delay_s = search_delay_s
        self.docs = DocStore(self.dir / DOCS)
        self.bm25 = None
        self.index = None
        self.refine, self.k_factor = None, 1.0  # exact fp16 vectors for re-ranking (FAISS shards with refine.fp16.npy)
        self.device, self.device_reason = "cpu", "retrieval.shard_gpus=0: searches on CPU"
        if (self.dir / BM25_DIR).is_dir():
            import bm25s

            self.bm25 = bm25s.BM25.load(str(self.dir / BM25_DIR), mmap=True, show_progress=False)
            if gpu:
                self.device_reason = "BM25 (bm25s) shards search on CPU; retrieval.shard_gpus is ignored"
                global _bm25_gpu_logged
                if not _bm25_gpu_logged:
                    _bm25_gpu_logged = True
                    log.info(self.device_reason)
        else:
            tune_faiss(faiss_threads)
            params = record.get("params", {})
            self.index = load_faiss_index(self.dir / FAISS_FILE, params)
            self.refine = np.load(self.dir / REFINE_FILE, mmap_mode="r") if (self.dir / REFINE_FILE).is_file() else None
            self.k_factor = float(params.get("k_factor", 1))
            if gpu:
                self._move_to_gpu(params)

    def _move_to_gpu(self, params: dict) -> None:
        """Move the FAISS index to GPU 0 when `gpu_plan` allows it (k up to 2048 per search)."""
        plan = gpu_plan(self.index, params, topk=2048)
        self.device_reason = plan.reason
        if plan.move:
            self.index = to_gpu(self.index, plan, device=0)
            self.device = "cuda:0"
            log.info("shard %s: %s", self.dir.name, plan.reason)
        else:
            log.warning("shard %s stays on CPU: %s", self.dir.name, plan.reason)

    def device_info(self) -> dict:
        """Where this shard searches: `{"device": "cuda:0" | "cpu", "reason": ...}`."""
        return {"device": self.device, "reason": self.device_reason}

    def ready(self) -> int:
        """Number of documents in the shard (used as a readiness probe)."""
        return self.count

    def set_search_params(self, params: dict) -> None:
        """Change query-time knobs of a FAISS shard from now on: `nprobe`, `ef_search`, `k_factor`
        (candidates re-ranked = k_factor x k, by a FAISS refine index or by `refine.fp16.npy`).

        Raises:
            RuntimeError: a BM25 shard, or a knob its index lacks (e.g. nprobe on a flat index; from FAISS).
        """
        if self.index is None:
            raise RuntimeError(f"shard {self.dir.name} is BM25: it has no FAISS search parameters")
        apply_search_params(self.index, params)
        self.k_factor = float(params.get("k_factor", self.k_factor))

    def memory(self) -> dict:
        """Resident memory of this shard's process in bytes (`process_memory`: rss, anon, file) and its pid."""
        return process_memory()

    def _delay(self) -> None:
        if self.search_delay_s:
            time.sleep(self.search_delay_s)

    def search(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product within the shard.

        Args:
            query_vectors: float32 `[n, dim]`.
            k: hits per query.
        Returns:
            `(scores [n, k] float32, ids [n, k] int64 global ids)`; -1 / -inf pad when the shard
            has fewer than k documents.
        """
        self._delay()
        q = np.ascontiguousarray(query_vectors, dtype=np.float32)
        if self.refine is not None and self.k_factor > 1:
            _, cand = self.index.search(q, min(self.count, int(k * self.k_factor)))
            scores, local = rerank_exact(self.refine, q, cand.astype(np.int64), k)
        else:
            scores, local = self.index.search(q, k)
        ids = np.where(local >= 0, local + self.start, -1).astype(np.int64)
        return scores.astype(np.float32), ids

    def search_text(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """BM25 top-k within the shard for raw query strings. Same return shapes as `search`."""
        import bm25s

        self._delay()
        n, kk = len(queries), min(k, self.count)
        tokens = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        local, scores = self.bm25.retrieve(tokens, k=kk, show_progress=False, n_threads=1)
        ids = np.full((n, k), -1, dtype=np.int64)
        out = np.full((n, k), -np.inf, dtype=np.float32)
        ids[:, :kk] = local + self.start
        out[:, :kk] = scores
        return out, ids

    def fetch(self, global_ids: list[int]) -> list[dict]:
        """Documents for global ids owned by this shard, as `{doc_id, title, text}` in the given order."""
        return self.docs.get([int(g) - self.start for g in global_ids])

    def search_with_docs(self, query, k: int) -> tuple[np.ndarray, np.ndarray, dict[int, dict]]:
        """`search` (float32 `[n, dim]` vectors) or `search_text` (BM25: a list of strings), plus the
        documents of every hit keyed by global id, so the pool needs no second round trip for them."""
        scores, ids = self.search_text(query, k) if self.bm25 is not None else self.search(query, k)
        hit_ids = np.unique(ids[ids >= 0]).tolist()
        return scores, ids, dict(zip(hit_ids, self.fetch(hit_ids)))


