"""RolloutWorker and FrozenLLM Ray actors: thin async shells over `AgentLoop` and `FrozenLLM`.

A RolloutWorker holds one policy engine (vLLM by default) and runs episodes of any recipe against
the RetrievalPool; many episodes share the engine's batch. Frozen LLM actors (s3 generator and
judge, R-Search verifier) hold their own engines and answer concurrently.

`update_weights` is meant to be called between rollout batches (synchronous RL): episodes record
the weight version they started with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.agent_loop import AgentLoop, RolloutLimits, pool_searcher
from actors.engine import Sampling
from actors.scorer import ActorScorer, FrozenLLM
from recipes import get_recipe


def _make_engine(engine_spec: Mapping[str, Any]):
    from actors.engine_factory import make_engine

    return make_engine(**dict(engine_spec))


class _EngineHolder:
    """Creates the engine on first use, inside the actor's event loop (vLLM's async engine needs one)."""

    def __init__(self, engine_spec: Mapping[str, Any]):
        self.engine_spec = dict(engine_spec)
        self.engine = None
        self._lock = asyncio.Lock()

    async def get(self):
        async with self._lock:
            if self.engine is None:
                self.engine = _make_engine(self.engine_spec)
            return self.engine

    async def shutdown(self) -> None:
        if self.engine is not None:
            await self.engine.shutdown()
            self.engine = None


class RolloutWorker:
    """Runs a recipe's episodes on a policy engine.

    Args:
        engine_spec: keyword arguments of `actors.engine_factory.make_engine` (backend, model, ...).
        pool: a RetrievalPool actor handle (searches go through it).
        generator, judge: FrozenLLMActor handles for rewards that need frozen LLMs (s3, R-Search).
    """

    def __init__(self, engine_spec: Mapping[str, Any], pool: Any, generator: Any = None, judge: Any = None):
        self.holder = _EngineHolder(engine_spec)
        self.searcher = pool_searcher(pool)
        self.scorer = ActorScorer(generator, judge) if generator is not None else None

    async def ready(self) -> int:
        """Start the engine; returns its weight version."""
        return (await self.holder.get()).weight_version

    async def run(
        self,
        examples: Sequence[Mapping[str, Any]],
        recipe: str,
        recipe_config: Mapping[str, Any] | None = None,
        n: int = 1,
        sampling: Mapping[str, Any] | None = None,
        limits: Mapping[str, Any] | None = None,
        chat: bool | None = None,
        compute_reward: bool = True,
    ) -> list[dict[str, Any]]:
        """`n` episodes per example (dicts with id, question, golden_answers, dataset); returns
        trajectories as JSON-ready dicts (`Trajectory.to_json`)."""
        engine = await self.holder.get()
        loop = AgentLoop(
            engine,
            get_recipe(recipe, dict(recipe_config or {})),
            self.searcher,
            Sampling(**dict(sampling or {})),
            RolloutLimits(**dict(limits or {})),
            chat=chat,
            scorer=self.scorer,
            compute_reward=compute_reward,
        )
        return [t.to_json() for t in await loop.run_batch(list(examples), n)]

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> int:
        """Load new policy weights; returns the recorded version."""
        engine = await self.holder.get()
        await engine.update_weights(named_tensors, version)
        return engine.weight_version

    async def shutdown(self) -> None:
        """Free the engine (call before ray.shutdown: vLLM leaves /dev/shm segments otherwise)."""
        await self.holder.shutdown()


class FrozenLLMWorker:
    """A frozen generator / judge / verifier: `FrozenLLM` over its own engine."""

    def __init__(self, engine_spec: Mapping[str, Any], model_name: str | None = None, chat: bool | None = None,
                 max_answer_tokens: int = 64):
        self.holder = _EngineHolder(engine_spec)
        self.model_name = model_name or str(engine_spec.get("model", ""))
        self.chat, self.max_answer_tokens = chat, max_answer_tokens
        self.llm: FrozenLLM | None = None

    async def _llm(self) -> FrozenLLM:
        if self.llm is None:
            self.llm = FrozenLLM(await self.holder.get(), self.model_name, self.chat, self.max_answer_tokens)
        return self.llm

    async def ready(self) -> bool:
        await self._llm()
        return True

    async def generate_answer(self, question: str, context: str, template: str) -> str:
        return await (await self._llm()).generate_answer(question, context, template)

    async def judge(self, response: str, golden_answers: list[str]) -> bool:
        return await (await self._llm()).judge(response, golden_answers)

    async def stats(self) -> dict[str, int]:
        return dict((await self._llm()).stats)

    async def shutdown(self) -> None:
        await self.holder.shutdown()


def remote_rollout_worker(num_cpus: float = 1.0, num_gpus: float = 0.0, **options: Any):
    """`RolloutWorker` as a Ray actor class with the given resources (max_concurrency high: async)."""
    import ray

    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=1000, **options)(RolloutWorker)


def remote_frozen_llm(num_cpus: float = 1.0, num_gpus: float = 0.0, **options: Any):
    """`FrozenLLMWorker` as a Ray actor class with the given resources."""
    import ray

    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=1000, **options)(FrozenLLMWorker)
