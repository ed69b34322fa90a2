"""`RetrievalPool` (encode queries, fan out to every shard, merge per-shard top-k into the global
top-k) and `start_retrieval_pool`, which starts it as a Ray actor and waits for its shards.

The pool micro-batches concurrent callers: requests arriving within `retrieval.batch_wait_ms` (or
queued while earlier batches are in flight) share one encode and one search per shard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from actors.retrieval.index_store import Manifest
from actors.retrieval.request import check_search, check_vector_search
from actors.retrieval.shard import Hit, RetrievalRequestError, ShardSearcher, ShardUnavailableError, merge_topk

log = logging.getLogger(__name__)

@dataclass
class _Request:
    queries: list  # query strings, or float32 [dim] vectors (search_vectors)
    k: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


class RetrievalPool:
    """Query encoding, fan-out to every shard, global top-k merge, micro-batching, retries.

    Owns `retrieval.query_encoders` TextEncoder actors (a micro-batch is split across them) and one
    ShardSearcher actor per shard; both restart on a crash (`max_restarts`) and the pool retries
    the call (`max_retries`). An index built from vectors alone (its manifest names no encoder) gets no
    query encoders and answers `search_vectors` only. Used as a Ray async actor (`start_retrieval_pool`). Args:
        index_dir: an index directory written by `pipelines.build_index`.
        retrieval: a `configs.schema.RetrievalConfig` as a dict (batching window, limits, retries).
        shard_options: extra Ray options for shard actors (e.g. resources for multi-node placement).
        search_delay_s: forwarded to every `ShardSearcher` (fault-injection tests only).
    """

    def __init__(self, index_dir: str, retrieval: dict, shard_options: dict | None = None, search_delay_s: float = 0.0):
        import ray

        self.cfg = retrieval
        self.index_dir = Path(index_dir)
        self.manifest = Manifest.load(self.index_dir)
        self.dense = self.manifest.index_type != "bm25"
        # The pool retries failed calls itself (max_task_retries=0), so it can count and report them.
        restart = {"max_restarts": retrieval["max_restarts"], "max_task_retries": 0}
        self.encoders = []
        if self.dense and self.manifest.encoder is not None:
            import os

            from actors.retrieval.encoder import EncoderSpec, TextEncoder

            n = retrieval["query_encoders"]
            threads = retrieval["encoder_threads"] or max(1, (os.cpu_count() or 1) // n)
            spec = EncoderSpec(
                **self.manifest.encoder, device=retrieval["encoder_device"], query_batch_size=retrieval["query_batch_size"]
            )
            enc_opts = {"num_cpus": retrieval["encoder_cpus"], "num_gpus": retrieval["encoder_gpus"]} | restart
            self.encoders = [ray.remote(TextEncoder).options(**enc_opts).remote(spec, threads) for _ in range(n)]
        # SPREAD: shards go to different nodes when there are several (an index too big for one
        # node's memory); on one node it is the default placement. `cluster.roles` plans the same.
        # shard_gpus > 0: each shard reserves that much GPU and moves its FAISS index there (gpu_index).
        shard_gpus = float(retrieval.get("shard_gpus", 0.0))
        gpu_opts = {"num_gpus": shard_gpus} if shard_gpus > 0 else {}
        shard_opts = ({"num_cpus": retrieval["shard_cpus"], "scheduling_strategy": "SPREAD"} | gpu_opts | restart
                      | (shard_options or {}))
        self.shards = [
            ray.remote(ShardSearcher).options(**shard_opts).remote(
                str(self.index_dir / s.name), 1, search_delay_s, shard_gpus > 0)
            for s in self.manifest.shards
        ]
        self._queue: asyncio.Queue[_Request] | None = None
        self._loop_task: asyncio.Task | None = None
        self._inflight: asyncio.Semaphore | None = None
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()  # query -> vector, LRU
        self.stats = {"requests": 0, "queries": 0, "batches": 0, "retries": 0, "errors": 0, "cache_hits": 0,
                      "encode_s": 0.0, "search_s": 0.0, "queue_wait_s": 0.0}

    # -- public API ------------------------------------------------------------------------
    async def ready(self) -> dict:
        """Manifest summary once every shard and query encoder has loaded."""
        await asyncio.gather(*(s.ready.remote() for s in self.shards), *(e.ready.remote() for e in self.encoders))
        return {"num_docs": self.manifest.num_docs, "num_shards": len(self.shards), "index_type": self.manifest.index_type}

    async def get_stats(self) -> dict:
        """Counters: requests, queries, batches (mean batch = queries / batches), retries, errors,
        cache_hits (queries whose vector came from the cache), and
        seconds summed over batches: encode_s, search_s (fan-out, merge, documents),
        queue_wait_s (summed over requests: arrival to batch start)."""
        return dict(self.stats)

    async def shard_handles(self) -> list:
        """The shard actor handles (for fault-injection tests and monitoring)."""
        return list(self.shards)

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Global top-k hits for each query, equal to one exact search over the whole corpus.

        Args:
            queries: non-empty list (or tuple) of non-empty strings, at most `max_queries_per_request`.
            k: hits per query, an integer in 1..`max_topk`; None = `retrieval.topk`.
        Returns:
            One list of `Hit` per query, best first (fewer than k only if the corpus is smaller).
        Raises:
            RetrievalRequestError: malformed queries or k (`actors.retrieval.request.check_search`, the
                validator of the HTTP route too).
            ShardUnavailableError: a shard stayed down through `max_retries` retries.
        """
        queries, k = check_search(queries, k, self.cfg)
        if self.dense and not self.encoders:
            raise RetrievalRequestError(f"queries: {self.index_dir} was built from vectors and has no encoder; "
                                        "call search_vectors(vectors, k)")
        return await self._submit(queries, k)

    async def search_vectors(self, vectors, k: int) -> list[list[Hit]]:
        """Global top-k hits for query vectors (already encoded), micro-batched with text searches.

        Args:
            vectors: float `[n, dim]` (a numpy array or nested lists), dim = the index's, n in
                1..`max_queries_per_request`; inner product with the stored vectors ranks the hits.
            k: hits per query, as for `search`.
        Returns:
            One list of `Hit` per vector, best first.
        Raises:
            RetrievalRequestError: a BM25 index, a wrong shape or dtype, NaN/inf, or a bad k
                (`actors.retrieval.request.check_vector_search`).
            ShardUnavailableError: a shard stayed down through `max_retries` retries.
        """
        arr, k = check_vector_search(vectors, k, self.manifest.dim if self.dense else None, self.cfg)
        return await self._submit(list(arr), k)

    # -- internals -------------------------------------------------------------------------
    async def _submit(self, queries: list, k: int) -> list[list[Hit]]:
        """Queue checked queries (strings or vectors) for the batch loop and await their hits."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._inflight = asyncio.Semaphore(self.cfg["max_inflight_batches"])
            self._loop_task = asyncio.get_running_loop().create_task(self._batch_loop())  # held: the loop keeps running
        fut = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(queries, k, fut))
        return await fut

    async def _batch_loop(self) -> None:
        wait = self.cfg["batch_wait_ms"] / 1000.0
        max_batch = self.cfg["max_batch_size"]
        while True:
            # Take a batch slot first: while batches are in flight, callers pile up in the queue and
            # the next batch takes all of them (forming it first would dispatch many small batches).
            await self._inflight.acquire()
            first = await self._queue.get()
            batch, size = [first], len(first.queries)
            deadline = time.perf_counter() + wait
            while size < max_batch:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    # The window is over; still take whatever is already queued.
                    if self._queue.empty():
                        break
                    req = self._queue.get_nowait()
                else:
                    try:
                        req = await asyncio.wait_for(self._queue.get(), remaining)
                    except asyncio.TimeoutError:
                        continue
                batch.append(req)
                size += len(req.queries)
            asyncio.get_running_loop().create_task(self._serve_batch(batch))

    async def _serve_batch(self, batch: list[_Request]) -> None:
        try:
            now = time.perf_counter()
            self.stats["queue_wait_s"] += sum(now - r.arrived for r in batch)
            queries = [q for r in batch for q in r.queries]
            k = max(r.k for r in batch)
            results = await self._search_merged(queries, k)
            self.stats["batches"] += 1
            self.stats["requests"] += len(batch)
            self.stats["queries"] += len(queries)
            pos = 0
            for r in batch:
                if not r.future.done():
                    r.future.set_result([hits[: r.k] for hits in results[pos : pos + len(r.queries)]])
                pos += len(r.queries)
        except Exception as e:  # every caller of the batch gets the error, none hangs
            self.stats["errors"] += 1
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(e)
        finally:
            self._inflight.release()

    async def _search_merged(self, queries: list[str], k: int) -> list[list[Hit]]:
        t0 = time.perf_counter()
        query = queries
        if self.dense:
            texts = [q for q in queries if isinstance(q, str)]
            encoded = iter(await self._encode(texts) if texts else ())  # vectors of search_vectors pass as they are
            query = np.stack([next(encoded) if isinstance(q, str) else q for q in queries]).astype(np.float32)
            self.stats["encode_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
        per_shard = await asyncio.gather(
            *(self._call(self.shards, i, "search_with_docs", query, k) for i in range(len(self.shards)))
        )
        scores, ids = merge_topk([p[0] for p in per_shard], [p[1] for p in per_shard], k)
        docs = {gid: doc for p in per_shard for gid, doc in p[2].items()}
        self.stats["search_s"] += time.perf_counter() - t0
        return [
            [{**docs[int(g)], "score": float(s)} for s, g in zip(srow, irow) if g >= 0]
            for srow, irow in zip(scores, ids)
        ]

    async def _encode(self, queries: list[str]) -> np.ndarray:
        """Query vectors, float32 `[n, dim]`: cached ones from the LRU cache, the rest encoded with the
        micro-batch split into contiguous chunks, one per query encoder."""
        cache, size = self._vectors, self.cfg["query_cache_size"]
        misses = list(dict.fromkeys(q for q in queries if q not in cache))
        self.stats["cache_hits"] += sum(q in cache for q in queries)
        fresh: dict[str, np.ndarray] = {}
        if misses:
            n = min(len(self.encoders), len(misses))
            bounds = np.linspace(0, len(misses), n + 1).astype(int)
            parts = await asyncio.gather(
                *(self._call(self.encoders, j, "encode_queries", misses[bounds[j] : bounds[j + 1]]) for j in range(n))
            )
            fresh = dict(zip(misses, np.concatenate(parts)))
        out = np.stack([fresh[q] if q in fresh else cache[q] for q in queries])
        for q in queries:  # refresh recency; insert the new ones
            if q in cache:
                cache.move_to_end(q)
            elif size:
                cache[q] = fresh[q]
        while len(cache) > size:
            cache.popitem(last=False)
        return out

    async def _call(self, actors: list, i: int, method: str, *args):
        """Call `actors[i].method`; on actor death (`actors.lifecycle.actor_death_errors`, an OOM kill included)
        wait for Ray to restart it and retry."""
        from actors.lifecycle import actor_death_errors

        retries = self.cfg["max_retries"]
        for attempt in range(retries + 1):
            try:
                return await getattr(actors[i], method).remote(*args)
            except actor_death_errors() as e:
                if attempt == retries:
                    what = f"shard {i} ({self.manifest.shards[i].name} of {self.index_dir})" if actors is self.shards else f"query encoder {i}"
                    raise ShardUnavailableError(
                        f"{what} is down after "
                        f"{attempt + 1} attempts ({type(e).__name__}); check the shard actor's log, "
                        f"raise retrieval.max_restarts/max_retries, or rebuild the shard"
                    ) from e
                self.stats["retries"] += 1
                log.warning("%s %d failed (%s); retry %d/%d", method, i, type(e).__name__, attempt + 1, retries)
                await asyncio.sleep(self.cfg["retry_backoff_s"] * (2**attempt))


def start_retrieval_pool(index_dir: str | Path, retrieval, name: str | None = None, startup_timeout_s: float = 600.0, **kwargs):
    """Create the `RetrievalPool` Ray actor and wait until every shard is loaded.

    Args:
        index_dir: a finished index directory.
        retrieval: `configs.schema.RetrievalConfig` (or its dict).
        name: optional actor name (detached callers such as the HTTP route look it up).
        startup_timeout_s: seconds to wait for the pool and its shards to be placed and loaded.
        **kwargs: forwarded to `RetrievalPool` (shard_options, search_delay_s).
    Returns:
        The pool's actor handle.
    Raises:
        IndexFormatError: index_dir holds no finished index (checked before any actor starts).
        TimeoutError: the actors were not ready in time (usually: the cluster lacks the CPUs).
    """
    import ray

    manifest = Manifest.load(index_dir)  # fail before starting actors
    cfg = retrieval if isinstance(retrieval, dict) else retrieval.model_dump()
    # Searches are idempotent, so a restarted pool (with fresh shards) may safely re-run them.
    opts = {"num_cpus": cfg["pool_cpus"], "max_concurrency": 1000, "max_restarts": cfg["max_restarts"],
            "max_task_retries": cfg["max_retries"]}
    if name:
        opts["name"] = name
    pool = ray.remote(RetrievalPool).options(**opts).remote(str(index_dir), cfg, **kwargs)
    try:
        ray.get(pool.ready.remote(), timeout=startup_timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        need = cfg["pool_cpus"] + len(manifest.shards) * cfg["shard_cpus"] + cfg["query_encoders"] * cfg["encoder_cpus"]
        ray.kill(pool)
        raise TimeoutError(
            f"RetrievalPool over {index_dir} not ready after {startup_timeout_s:.0f} s; it needs "
            f"{need:g} CPUs (retrieval.pool_cpus + {len(manifest.shards)} x shard_cpus + query_encoders x encoder_cpus) and the "
            f"cluster has {ray.available_resources().get('CPU', 0):g} free: lower them or add nodes"
        ) from e
    return pool
