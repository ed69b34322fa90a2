"""`RolloutWorker`: the Ray actor that runs a recipe's episodes on a policy engine; a thin async
shell over `AgentLoop`.

A RolloutWorker holds one policy engine (vLLM by default) and runs episodes of any recipe against
the RetrievalPool; many episodes share the engine's batch. Rewards that need a frozen LLM go to the
frozen generator / judge actors (`actors.frozen`).

`update_weights` is meant to be called between rollout batches (synchronous RL): episodes record
the weight version they started with.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.engines.base import Sampling
from actors.engines.spec import EngineHolder, EngineSpec, engine_spec
from actors.frozen.scorer import ActorScorer
from actors.lifecycle import ActorSet, restarted_by_ray
from actors.rollout.agent_loop import AgentLoop, RolloutLimits, pool_searcher
from recipes import get_recipe


class RolloutWorker:
    """Runs a recipe's episodes on a policy engine.

    Args:
        spec: the policy engine (`actors.engines.spec.EngineSpec` or a dict of its fields).
        pool: a RetrievalPool actor handle (searches go through it).
        generator, judge: FrozenLLMWorker handles for rewards that need frozen LLMs (s3, R-Search).
    """

    def __init__(self, spec: EngineSpec | Mapping[str, Any], pool: Any, generator: Any = None, judge: Any = None):
        self.holder = EngineHolder(spec)
        # retries since the last `take_faults`; a life Ray started again counts itself once, whatever killed the last
        self.faults: Counter = Counter({"rollout_worker_restarts": int(restarted_by_ray())})
        self.searcher = pool_searcher(pool, on_retry=lambda: self.faults.update(["search_retries"]))
        self.scorer = (ActorScorer(generator, judge, on_retry=lambda: self.faults.update(["scoring_retries"]))
                       if generator is not None else None)

    async def ready(self) -> int:
        """Start the engine; returns its weight version."""
        return (await self.holder.get()).weight_version

    async def agent_loop(self, recipe: str, recipe_config: Mapping[str, Any] | None, sampling: Mapping[str, Any] | None,
                         limits: Mapping[str, Any] | None, chat: bool | None, compute_reward: bool,
                         expert: bool = False) -> AgentLoop:
        """An `AgentLoop` of `recipe` on this worker's engine and pool (`expert`: the recipe's expert writes)."""
        return AgentLoop(await self.holder.get(), get_recipe(recipe, dict(recipe_config or {})), self.searcher,
                         Sampling(**dict(sampling or {})), RolloutLimits(**dict(limits or {})), chat=chat,
                         scorer=self.scorer, compute_reward=compute_reward, expert=expert)

    async def run(
        self,
        examples: Sequence[Mapping[str, Any]],
        recipe: str,
        *,
        recipe_config: Mapping[str, Any] | None = None,
        n: int = 1,
        sampling: Mapping[str, Any] | None = None,
        limits: Mapping[str, Any] | None = None,
        chat: bool | None = None,
        compute_reward: bool = True,
        expert: bool = False,
    ) -> list[dict[str, Any]]:
        """`n` episodes per example (dicts with id, question, golden_answers, dataset). `sampling`:
        `actors.engines.base.Sampling` fields; `limits`: `RolloutLimits` fields (tokens);
        `compute_reward`: score each episode as it ends; `expert`: the recipe's expert writes the turns
        (`AgentLoop`). Returns trajectories as JSON-ready dicts (`Trajectory.to_json`)."""
        loop = await self.agent_loop(recipe, recipe_config, sampling, limits, chat, compute_reward, expert)
        return [t.to_json() for t in await loop.run_batch(list(examples), n)]

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> int:
        """Load new policy weights; returns the recorded version."""
        from cluster.malloc_trim import malloc_trim

        engine = await self.holder.get()
        await engine.update_weights(named_tensors, version)
        del named_tensors
        malloc_trim()  # the copy of the weights is freed: hand its pages back (cluster/malloc_trim.py)
        return engine.weight_version

    # -- NCCL weight sync (`learner.weight_sync: nccl`; driven by actors.learner.nccl_sync.sync_over_nccl) --------
    async def _nccl_engine(self) -> Any:
        engine = await self.holder.get()
        if not hasattr(engine, "receive_weights"):
            raise ValueError(f"NCCL weight sync needs a vLLM policy engine, this worker runs "
                             f"{self.holder.spec.backend!r}; set rollout.backend: vllm, or learner.weight_sync: "
                             "object_store")
        return engine

    async def weight_transfer_state(self, update: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """{"ranks": the engine's NCCL ranks (its tensor_parallel_size), "endpoint": [address, port] of the
        weight-transfer group its engine is in, or None}; checks the NCCL update message `update` first when
        given (`VLLMEngine.check_weight_update`)."""
        engine = await self._nccl_engine()
        if update is not None:
            engine.check_weight_update(dict(update))
        info = engine.weight_transfer_info
        return {"ranks": self.holder.spec.tensor_parallel_size,
                "endpoint": None if info is None else [info["master_address"], info["master_port"]]}

    async def init_weight_transfer(self, info: Mapping[str, Any]) -> None:
        """Join the engine to the trainer's NCCL weight-transfer group (`VLLMEngine.init_weight_transfer`)."""
        await (await self._nccl_engine()).init_weight_transfer(dict(info))

    async def receive_weights(self, update: Mapping[str, Any], version: int) -> int:
        """Receive one NCCL broadcast of the policy's weights (`VLLMEngine.receive_weights`); returns the
        recorded version."""
        engine = await self._nccl_engine()
        await engine.receive_weights(dict(update), version)
        return engine.weight_version

    async def take_faults(self) -> dict[str, int]:
        """Retries of searches and scoring calls since the last call, and 1 for `rollout_worker_restarts` in the first
        call to a process Ray restarted (counts); then reset."""
        out, self.faults = dict(self.faults), Counter()
        return out

    async def shutdown(self) -> None:
        """Free the engine (call before ray.shutdown: vLLM leaves /dev/shm segments otherwise)."""
        await self.holder.shutdown()


def start_rollout_workers(actors: ActorSet, cfg: Any, pool: Any, generator: Any = None, judge: Any = None,
                          model: str | None = None, worker_cls: type = RolloutWorker, count: int | None = None) -> list:
    """Start `count` (default `rollout.num_workers`) workers of `worker_cls` on the policy engine of
    `cfg` (`model`: another policy, e.g. a checkpoint), each with `rollout.cpus_per_worker` /
    `gpus_per_worker`, spread over the nodes; Ray restarts a crashed one up to `ray.max_restarts` times (it comes back with
    the starting weights: `pipelines.rollout_dispatch` re-syncs it before use). Returns the handles
    (not yet ready: see `ActorSet.wait_ready`)."""
    ro = cfg.rollout
    spec = engine_spec(cfg, "policy", model)
    # SPREAD over nodes (cluster.roles plans it): each node's engines share its cores and memory.
    options = {"max_restarts": cfg.ray.max_restarts, "scheduling_strategy": "SPREAD"}
    return [actors.start(worker_cls, spec, pool, generator, judge, num_cpus=ro.cpus_per_worker,
                         num_gpus=ro.gpus_per_worker, options=options)
            for _ in range(ro.num_workers if count is None else count)]
