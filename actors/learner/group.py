"""`LearnerGroup`: R learner ranks as Ray actors forming one torch.distributed group.

The ranks are placed through a placement group (one bundle per rank, PACK), rank 0 names the
rendezvous address, and the driver hands every rank the same batch through the object store
(one copy); each rank takes its own rows. Results come back in batch order.

Weight sync: every rank takes part in gathering the policy's weights (from ZeRO partitions); rank 0
returns them into the object store (one host copy), and the driver hands that ObjectRef, unread, to
every RolloutWorker's `update_weights(weights, version)`. On GPUs, `learner.weight_sync: nccl`
broadcasts into vLLM's workers instead (`actors.learner.nccl_sync`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from actors.engines.cpu_env import ONEDNN_CACHE_VAR
from actors.learner.batch import TrainBatch
from actors.learner.critic import CriticLearner
from actors.learner.policy import PolicyLearner
from actors.lifecycle import SHUTDOWN_TIMEOUT_S, ActorSet
from configs.schema import LearnerConfig

log = logging.getLogger(__name__)


class LearnerRankError(RuntimeError):
    """A learner rank died (or its node did) during a call: the group's update is void as a whole and
    the group must be rebuilt from a checkpoint (`pipelines.train.Trainer.recover_learners`)."""


LEARNER_ONEDNN_CACHE = "64"
"""Size of the two caches of oneDNN primitives in a CPU learner rank: oneDNN's own (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`)
and ideep's, torch's wrapper of oneDNN (`LRU_CACHE_CAPACITY`); both default to 1,024. torch's bf16 matmuls on CPU run
as oneDNN primitives, one per shape, so every micro-batch of a new sequence length adds some. At 1,024 a rank grew
736 MiB over 15 updates of varied lengths, at 64 140 MiB (`scripts.bench.learner_memory`); per token 64 was 3-7%
slower in that run and 11-16% faster in a run on 16-sequence batches. With one fixed batch the rank stays flat."""

LEARNER_CACHE_VARS = (ONEDNN_CACHE_VAR, "LRU_CACHE_CAPACITY")


def rank_runtime_env(config: LearnerConfig) -> dict[str, Any]:
    """Ray options for CPU learner ranks: `{"runtime_env": {"env_vars": {...}}}` with
    - `LD_PRELOAD`: Ray's bundled jemalloc (`cluster.jemalloc`; under glibc's malloc a rank's heap grew 335 MiB over
      the 40-step training soak), unless `SEARCHRL_LEARNER_MALLOC=system` or `LD_PRELOAD` already names a malloc;
    - `ONEDNN_PRIMITIVE_CACHE_CAPACITY` and `LRU_CACHE_CAPACITY`: `LEARNER_ONEDNN_CACHE`, or the value set in this
      process's environment.
    `{}` on GPUs. Ray merges these `env_vars` into the job's runtime_env."""
    from cluster.jemalloc import jemalloc_preload

    if config.gpus_per_rank:
        return {}
    env = {var: os.environ.get(var, LEARNER_ONEDNN_CACHE) for var in LEARNER_CACHE_VARS}
    preload = jemalloc_preload("SEARCHRL_LEARNER_MALLOC")
    if preload:
        env["LD_PRELOAD"] = preload
    return {"runtime_env": {"env_vars": env}}


class LearnerGroup:
    """A data-parallel learner of `config.num_ranks` Ray actors (policy or critic).

    Args:
        role: "policy" (`PolicyLearner`) or "critic" (`CriticLearner`).
        config: `LearnerConfig` (or its dict).
        name: optional prefix of the placement group's name.
        timeout_s: seconds to wait for placement and model loading.
        temperature: the rollout sampling temperature (policy only; see `PolicyLearner`).
        total_steps: the run's training steps (all stages); needed with a warm-up ratio, which is a
            fraction of them (`learner.warmup_ratio` / `critic_warmup_ratio`).
        call_timeout_s: deadline (seconds) of each later call on the ranks (log-probs, update, save,
            weight sync; `ray.call_timeout_s`); None waits for ever.

    Raises:
        ValueError: unknown role or a bad config (before any actor starts).
        TimeoutError (ray.exceptions.GetTimeoutError): the cluster cannot place the ranks in time.
        actors.lifecycle.RemoteTimeoutError: a later call on the ranks passed `call_timeout_s`.
        LearnerRankError: a rank died during a later call.
    """

    def __init__(self, role: str, config: LearnerConfig | Mapping[str, Any], name: str = "searchrl",
                 timeout_s: float = 900.0, temperature: float = 1.0, total_steps: int | None = None,
                 call_timeout_s: float | None = None):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        classes = {"policy": PolicyLearner, "critic": CriticLearner}
        if role not in classes:
            raise ValueError(f"LearnerGroup role must be one of {sorted(classes)}, got {role!r}")
        self.role, self.call_timeout_s = role, call_timeout_s
        self.worker_restarts = 0  # rollout workers that died in a weight sync and were sent the weights again
        self.config = config if isinstance(config, LearnerConfig) else LearnerConfig(**dict(config))
        c, world = self.config, self.config.num_ranks
        bundle = {"CPU": c.cpus_per_rank, **({"GPU": c.gpus_per_rank} if c.gpus_per_rank else {})}
        self.placement_group = placement_group([bundle] * world, strategy="PACK", name=f"{name}-{role}")
        ray.get(self.placement_group.ready(), timeout=timeout_s)
        extra = {"total_steps": total_steps, **({"temperature": temperature} if role == "policy" else {})}
        self._ranks = ActorSet()
        self.actors = [
            self._ranks.start(classes[role], self.config, rank=i, world_size=world, num_cpus=c.cpus_per_rank,
                              num_gpus=c.gpus_per_rank, max_concurrency=None, **extra,
                              options={"scheduling_strategy": PlacementGroupSchedulingStrategy(self.placement_group, i),
                                       **rank_runtime_env(c)})
            for i in range(world)
        ]
        address, port = ray.get(self.actors[0].master_address.remote(), timeout=timeout_s)
        ray.get([a.init_distributed.remote(address, port) for a in self.actors], timeout=timeout_s)
        self.num_parameters = ray.get([a.setup.remote() for a in self.actors], timeout=timeout_s)[0]

    @property
    def world_size(self) -> int:
        """Number of ranks (Ray actors) in the group."""
        return len(self.actors)

    def _all(self, method: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        return self._get([getattr(a, method).remote(*args) for a in self.actors], method, timeout_s)

    def _get(self, refs: list[Any], method: str, timeout_s: float | None = None) -> list[Any]:
        """The ranks' results of `method` (`refs`, one per rank) within the call deadline.

        Raises:
            LearnerRankError: a rank (or its node) died.
            actors.lifecycle.RemoteTimeoutError: past `timeout_s` (default `call_timeout_s`)."""
        from actors.lifecycle import actor_death_errors, get_within

        try:
            return get_within(refs, timeout_s or self.call_timeout_s, f"{self.role} learner ranks: {method}")
        except actor_death_errors() as e:
            raise LearnerRankError(f"{self.role} learner: a rank died during {method} ({type(e).__name__}); "
                                   "its update is void") from e

    def _gather_rows(self, parts: Sequence[Mapping[str, torch.Tensor]], key: str, batch: TrainBatch) -> torch.Tensor:
        out = torch.zeros((batch.size, batch.response_len))
        for part in parts:
            out[part["rows"]] = part[key]
        return out

    def compute_logprobs(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy log-probs and entropies `[B, R]` float32 (0 where masked), data-parallel."""
        import ray

        ref = ray.put(batch)
        parts = self._all("compute_logprobs", ref)
        return self._gather_rows(parts, "logprobs", batch), self._gather_rows(parts, "entropy", batch)

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """Critic values `[B, R]` float32 (0 where masked), data-parallel."""
        import ray

        return self._gather_rows(self._all("compute_values", ray.put(batch)), "values", batch)

    def update(self, batch: TrainBatch, algorithm: Any, lr: float | None = None) -> dict[str, float]:
        """One update of every rank on the same batch (at learning rate `lr` when given, else the schedule's);
        metrics averaged over ranks (`tokens` and `sequence_tokens` summed over ranks: policy tokens trained
        on, and all the tokens the forward passes ran over)."""
        import ray

        ref = ray.put(batch)
        per_rank = self._all("update", ref, algorithm, *(() if lr is None else (lr,)))  # a critic takes no lr
        out = {k: sum(m[k] for m in per_rank) / len(per_rank) for k in per_rank[0]}
        for summed in ("tokens", "sequence_tokens"):
            if summed in out:
                out[summed] = sum(m[summed] for m in per_rank)
        return out

    def sync_weights(self, rollout_workers: Sequence[Any], version: int) -> dict[str, float]:
        """Send the policy's weights to every RolloutWorker (`update_weights`) with `version`.

        A worker that dies while it loads them (an OOM kill, here) is waited for while Ray restarts it and
        sent them again (`load_weights_into`); `take_worker_restarts()` counts them.

        Returns:
            {"sync_gather_s", "sync_load_s", "sync_s", "sync_bytes"}: seconds to gather the weights
            into the object store on rank 0, seconds until every worker loaded them, the total, and
            the bytes sent once.

        Raises:
            LearnerRankError: a rank died while gathering.
            RuntimeError: a worker reports another version.
            RayActorError / OutOfMemoryError: a worker died on every try (no restarts left).
        """
        if self.config.weight_sync == "nccl":  # GPU: rank 0 broadcasts into the engines (actors.learner.nccl_sync)
            from actors.learner.nccl_sync import sync_over_nccl

            return sync_over_nccl(self, rollout_workers, version)
        if self.role != "policy":
            raise ValueError("sync_weights: only the policy group has weights for the rollout workers")
        t0 = time.perf_counter()
        pairs = [a.sync_payload.options(num_returns=2).remote(self.config.sync_dtype) for a in self.actors]
        size = self._get([size_ref for size_ref, _ in pairs], "sync_payload")[0]  # a dead rank raises here
        weights_ref = pairs[0][1]  # rank 0's weights stay in the object store: the workers read them from there
        del pairs
        # Before the workers load: the ranks hand back the update's freed heap and their gathered copies, so the
        # node's peak is lower while a worker loads (in earlier runs Ray's memory monitor killed the worker there).
        self._all("trim_memory")
        t1 = time.perf_counter()
        versions, restarts = load_weights_into(rollout_workers, weights_ref, version, self.call_timeout_s)
        self.worker_restarts += restarts
        t2 = time.perf_counter()
        del weights_ref  # the last reference: the object store frees the weights
        if any(v != version for v in versions):
            raise RuntimeError(f"sync_weights: workers report versions {versions}, expected {version}")
        return {"sync_gather_s": t1 - t0, "sync_load_s": t2 - t1, "sync_s": t2 - t0, "sync_bytes": float(size)}

    def take_worker_restarts(self) -> int:
        """Rollout workers that died during a weight sync and were sent the weights again, since the last call."""
        count, self.worker_restarts = self.worker_restarts, 0
        return count

    def save_checkpoint(self, directory: str, hf: bool = True) -> str:
        """Every rank writes its DeepSpeed shard; rank 0 the Hugging Face model (unless `hf` is False:
        a snapshot for learner rebuilds). Returns the role folder."""
        return self._all("save_checkpoint", directory, hf)[0]

    def save_hf(self, directory: str) -> str:
        """Rank 0 writes the Hugging Face model to `directory/<role>/hf` (no DeepSpeed state); every rank takes
        part. Returns the role folder."""
        return self._all("save_hf", directory)[0]

    def load_checkpoint(self, directory: str) -> None:
        """Restore weights, optimizer, scheduler, RNG states and the update counter."""
        self._all("load_checkpoint", directory)

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Tear the engines and process group down (all ranks at once), end the actors, then free
        the placement group. A rank still busy (an update in flight) after `timeout_s` seconds is
        killed (`ActorSet.stop`)."""
        from ray.util.placement_group import remove_placement_group

        try:
            self._ranks.stop(timeout_s=timeout_s)
        finally:
            remove_placement_group(self.placement_group)


def load_weights_into(workers: Sequence[Any], weights_ref: Any, version: int, timeout_s: float | None,
                      max_attempts: int = 3) -> tuple[list[int], int]:
    """Every RolloutWorker's `update_weights(weights_ref, version)`; a worker whose process dies meanwhile
    (`actors.lifecycle.actor_death_errors`) is waited for while Ray restarts it (`max_restarts`) and asked
    again: the restarted worker holds its starting weights, and the run goes on instead of ending.

    Args:
        weights_ref: the ObjectRef of the weights (the workers read them from the object store).
        timeout_s: each wait's deadline in seconds (`ray.call_timeout_s`; None: none).
        max_attempts: tries per worker before its last error is raised.

    Returns:
        (the versions the workers report, in order; how many times a worker died and was asked again).

    Raises:
        actors.lifecycle.RemoteTimeoutError: a worker did not answer or restart within `timeout_s`.
        RayActorError / OutOfMemoryError: a worker died on each of `max_attempts` tries.
        actors.lifecycle.ActorNotRestartedError: a killed worker did not come back (no restarts left).
    """
    from actors.lifecycle import actor_death_errors, get_within, wait_restarted

    what = f"rollout workers: loading weights version {version}"
    refs = [w.update_weights.remote(weights_ref, version) for w in workers]
    versions, restarts = [], 0
    for i, (worker, ref) in enumerate(zip(workers, refs)):
        for attempt in range(1, max_attempts + 1):
            try:
                versions.append(int(get_within(ref, timeout_s, what)))
                break
            except actor_death_errors() as e:
                if attempt == max_attempts:
                    raise
                restarts += 1
                log.warning("%s: worker %d died (%s); sending them again once Ray has restarted it", what, i,
                            type(e).__name__)
                wait_restarted(worker, timeout_s, f"{what}: restarted worker {i}")
                ref = worker.update_weights.remote(weights_ref, version)
    return versions, restarts
