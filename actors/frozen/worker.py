"""`FrozenLLMWorker`: the Ray actor of a frozen generator, judge or verifier; a thin async shell
over `actors.frozen.scorer.FrozenLLM` on its own engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.engines.spec import EngineHolder, EngineSpec, Role, engine_spec
from actors.frozen.answer_store import AnswerStore, store_path
from actors.frozen.scorer import FrozenLLM
from actors.lifecycle import ActorSet


class FrozenLLMWorker:
    """A frozen generator / judge / verifier: `FrozenLLM` over its own engine.

    Args:
        spec: the engine (`EngineSpec` or a dict of its fields).
        model_name: the cache key's model name (default: the spec's model).
        chat: use the tokenizer's chat template (None = when it has one).
        max_answer_tokens: tokens per answer at most.
        cache_size: answers kept (an LRU keyed by model and prompt; entries, 0 = none).
        answer_cache: `frozen.answer_cache`: the on-disk answer store's file on this actor's node
            (`AnswerStore`; "auto": `answer_store.store_path`), None = none.
    """

    def __init__(self, spec: EngineSpec | Mapping[str, Any], model_name: str | None = None, chat: bool | None = None,
                 max_answer_tokens: int = 64, cache_size: int = 100_000, answer_cache: str | None = None):
        self.holder = EngineHolder(spec)
        self.model_name = model_name or self.holder.spec.model
        self.chat, self.max_answer_tokens, self.cache_size = chat, max_answer_tokens, cache_size
        self.answer_cache = answer_cache
        self.llm: FrozenLLM | None = None

    async def _llm(self) -> FrozenLLM:
        if self.llm is None:
            path = store_path(self.answer_cache)  # resolved here: the file lives on this actor's node
            store = None if path is None else AnswerStore(path)
            self.llm = FrozenLLM(await self.holder.get(), self.model_name, self.chat, self.max_answer_tokens,
                                 cache_size=self.cache_size, store=store)
        return self.llm

    async def ready(self) -> bool:
        """Start the engine."""
        await self._llm()
        return True

    async def generate_answer(self, question: str, context: str, template: str) -> str:
        """The answer to `template` filled with `question` and `context` (greedy, cached)."""
        return await (await self._llm()).generate_answer(question, context, template)

    async def judge(self, response: str, golden_answers: list[str]) -> bool:
        """s3's judge_check (Fig. 13): does `response` contain a gold answer?"""
        return await (await self._llm()).judge(response, golden_answers)

    async def acc_l(self, question: str, golden_answers: list[str], prediction: str) -> bool:
        """R1-Searcher's ACC_L judge verdict (§3.1) on `prediction`."""
        return await (await self._llm()).acc_l(question, golden_answers, prediction)

    async def stats(self) -> dict[str, int]:
        """Cache, answer-store and generation counters of the `FrozenLLM`."""
        return dict((await self._llm()).stats)

    async def shutdown(self) -> None:
        """Free the engine and close the answer store."""
        if self.llm is not None and self.llm.store is not None:
            self.llm.store.close()
        await self.holder.shutdown()


def start_frozen_llm(actors: ActorSet, cfg: Any, role: Role = "generator", chat: bool | None = None) -> Any:
    """Start the frozen LLM of `role` ("generator", "judge" or "verifier") of `cfg` (engine from
    `engine_spec`, `frozen.max_answer_tokens`, `frozen.cache_size`, `frozen.answer_cache`, `frozen.num_cpus` / `num_gpus`). Ray restarts a crashed
    one up to `ray.max_restarts` times; its answer cache starts empty again and refills (answers are
    greedy, so the rebuilt cache holds the same answers). Returns the handle (not yet ready: see
    `ActorSet.wait_ready`)."""
    fr = cfg.frozen
    return actors.start(FrozenLLMWorker, engine_spec(cfg, role), chat=chat, max_answer_tokens=fr.max_answer_tokens,
                        cache_size=fr.cache_size, answer_cache=fr.answer_cache, num_cpus=fr.num_cpus, num_gpus=fr.num_gpus,
                        options={"max_restarts": cfg.ray.max_restarts})
