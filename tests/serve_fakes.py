"""Test doubles of the searcher app: a `Backend` that runs `SearchService` in process (no Ray, no
model) with a queue limit, and a scripted engine that can be slowed down."""

from __future__ import annotations

import asyncio

from actors.engines.base import Sampling
from actors.rollout.agent_loop import RolloutLimits
from serving.errors import OverloadedError, UnavailableError
from serving.schemas import ModelOut
from serving.searcher import SearchService
from tests.scripted_engine import ScriptedEngine

MODEL = ModelOut(name="searcher-test", checkpoint="/ckpt/step-8/policy/hf", step=8, recipe="search_r1")
RETRIEVAL = {"topk": 3, "max_topk": 20, "max_queries_per_request": 4, "max_body_bytes": 4096, "request_timeout_s": 5.0}


class SlowEngine(ScriptedEngine):
    """A scripted engine whose every turn takes `delay_s` seconds."""

    def __init__(self, tokenizer, policy, delay_s: float = 0.0):
        super().__init__(tokenizer, policy)
        self.delay_s = delay_s
        self.cancelled = 0

    async def generate(self, prompt_token_ids, sampling: Sampling):
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await super().generate(prompt_token_ids, sampling)


def docs(query: str, k: int) -> list[dict]:
    """k hits for a query: ids `<query>-<i>`, score 1/i."""
    return [{"doc_id": f"{query}-{i}", "title": f"T{i}", "text": f"Passage {i} about {query}.", "score": 1.0 / i}
            for i in range(1, k + 1)]


async def fake_search(query: str, k: int) -> list[dict]:
    await asyncio.sleep(0)
    return docs(query, k)


class LocalBackend:
    """`serving.api.Backend` over a `SearchService`, admitting at most `capacity` requests at once
    (what Serve's max_ongoing_requests + max_queued_requests do for the real app)."""

    def __init__(self, service: SearchService, capacity: int = 100, ready: bool = True):
        self.service, self.model, self.capacity, self.ready = service, service.model, capacity, ready
        self.inflight = 0

    def _admit(self) -> None:
        if self.inflight >= self.capacity:
            raise OverloadedError(f"{self.inflight} requests in flight")
        self.inflight += 1

    async def search(self, req, request_id, received_at):
        self._admit()
        try:
            return await self.service.search(req, request_id, received_at)
        finally:
            self.inflight -= 1

    async def events(self, req, request_id, received_at):
        self._admit()
        try:
            async for item in self.service.events(req, request_id, received_at):
                yield item
        finally:
            self.inflight -= 1

    async def health(self):
        if not self.ready:
            raise UnavailableError("searcher: engine still loading")
        return {"deployments": {"searcher": "ready", "retrieval": "ready"}}

    async def retrieve(self, request):
        from actors.retrieval.http import retrieve_response

        async def search(queries, k):
            return [docs(q, k) for q in queries]

        return await retrieve_response(request, search, RETRIEVAL)


def make_service(tokenizer, policy, delay_s: float = 0.0, recipe: str = "search_r1", options=None, **kwargs):
    """A `SearchService` on a `SlowEngine` playing `policy`, searching `fake_search`."""
    engine = SlowEngine(tokenizer, policy, delay_s)
    opts = {"topk": 3, **(options or {})}
    return SearchService(engine, recipe, opts, fake_search, sampling=Sampling(temperature=0.0, seed=0),
                         limits=RolloutLimits(128, 600, 2048), chat=False, model=MODEL, **kwargs), engine
