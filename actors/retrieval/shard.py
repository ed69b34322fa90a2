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
    SHARD_RECORD,
    DocStore,
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
    """

    def __init__(self, shard_dir: str, faiss_threads: int = 1, search_delay_s: float = 0.0, gpu: bool = False):
        self.dir = Path(shard_dir)
        record = json.loads((self.dir / SHARD_RECORD).read_text())
        self.start, self.count = int(record["start"]), int(record["count"])
        self.search_delay_s = search_delay_s
        self.docs = DocStore(self.dir / DOCS)
        self.bm25 = None
        self.index = None
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


