"""Which role of a training run needs which CPUs, GPUs and memory: one table, derived from the config.

`plan_roles(cfg)` lists the actors a training run starts (`RoleSpec`: name, instances, resources per
instance, placement strategy, the config keys behind each number); `total_resources(plan)` adds
them up in Ray's resource names; `check_fits(plan, available)` raises `ResourceFitError` naming
the role, what it needs, what the cluster has and which keys to lower, before any actor starts.

Pure Python: no Ray import at module level (`check_ray_cluster` imports it when called).

Resources are Ray's *logical* reservations (what `ray.available_resources()` reports), not cores:
a 2-core machine may run a cluster started with `--num-cpus 4`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Ray's resource names, as in `ray.cluster_resources()`.
CPU, GPU, MEMORY = "CPU", "GPU", "memory"
_EPS = 1e-6  # Ray keeps 4 decimals of fractional resources; sums of floats need a tolerance.

class ResourceFitError(ValueError):
    """The cluster cannot hold the run's actors. `problems`: one line per short resource or role."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            "the Ray cluster cannot hold this run's actors (checked before starting any):\n"
            + "\n".join(problems)
            + "\nLower the config keys named above, or give the cluster more resources "
            "(`ray start --num-cpus N --num-gpus M` on each node; `ray.num_cpus` for a local cluster)."
        )


@dataclass(frozen=True)
class RoleSpec:
    """One kind of actor and how many of them a run starts.

    Attributes:
        name: role name, e.g. "rollout_worker".
        count: instances (actors); for "PACK" roles, the bundles of one placement group.
        cpus: logical CPUs reserved per instance.
        gpus: GPUs per instance (fractions allowed).
        memory: bytes of Ray `memory` reserved per instance (0 = none; the config has no memory keys yet).
        strategy: "DEFAULT" = independent actors placed by Ray's scheduler; "SPREAD" = independent
            actors spread over the nodes (Ray's "SPREAD" scheduling strategy: retrieval shards, so a
            large index is split over the nodes' memory, and rollout workers); "PACK" = one placement
            group of `count` bundles, packed onto as few nodes as possible (actors.learner.group).
        keys: the config keys behind the numbers: {"count": ..., "cpus": ..., "gpus": ...}; a
            missing "count" means a fixed number of instances.
        detail: what the instances are, for people reading the plan.
    """

    name: str
    count: int
    cpus: float
    gpus: float = 0.0
    memory: int = 0
    strategy: str = "DEFAULT"
    keys: Mapping[str, str] = field(default_factory=dict)
    detail: str = ""

    def bundle(self) -> dict[str, float]:
        """Resources of one instance in Ray's names (a placement-group bundle); zero entries left out."""
        out = {CPU: float(self.cpus), GPU: float(self.gpus), MEMORY: float(self.memory)}
        return {k: v for k, v in out.items() if v > 0}

    def ray_options(self) -> dict[str, Any]:
        """`num_cpus` / `num_gpus` (/ `memory`, `scheduling_strategy` for "SPREAD") for
        `ray.remote(...).options(...)` of one instance."""
        opts: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.strategy == "SPREAD":
            opts["scheduling_strategy"] = "SPREAD"
        if self.memory:
            opts["memory"] = self.memory
        return opts

    def total(self) -> dict[str, float]:
        """Resources of all instances together (Ray's names; zero entries left out)."""
        return {k: v * self.count for k, v in self.bundle().items()}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (for cluster_check.json and logs)."""
        return {"name": self.name, "count": self.count, "cpus": self.cpus, "gpus": self.gpus,
                "memory": self.memory, "strategy": self.strategy, "keys": dict(self.keys),
                "detail": self.detail, "total": self.total()}


def frozen_llm_count(cfg: Any) -> int:
    """Frozen LLM actors the recipe's reward needs (`Recipe.frozen_roles`): 0, 1 (the generator,
    also judging and verifying) or 2 (a separate judge when the recipe calls one and
    `frozen.judge_model` names another model than `frozen.model`).

    Looks at `train.recipe_options` merged with every stage's options (the largest count wins).
    """
    from recipes import get_recipe  # pure Python; imported here to keep this module light

    roles: set[str] = set()
    for options in cfg.train.option_sets():
        roles.update(get_recipe(cfg.train.recipe, cfg.recipe_config(options)).frozen_roles())
    if not roles:
        return 0
    judge = cfg.frozen.judge_model
    return 2 if "judge" in roles and judge is not None and judge != cfg.frozen.model else 1


def plan_roles(cfg: Any) -> list[RoleSpec]:
    """The actors a training run with `cfg` (`configs.schema.Config`) starts, in start order.

    Roles: retrieval_pool, retrieval_shard (index.num_shards, SPREAD), query_encoder (dense indexes
    only), rollout_worker (SPREAD), frozen_llm (recipes whose reward calls one), policy_learner (num_ranks bundles,
    PACK), critic_learner (only for advantage_estimator "gae"), reference_model (only when
    algorithm.kl_coef > 0; it uses the learner's per-rank resources). Roles with no instance are
    left out.
    """
    r, lrn, ro, fr = cfg.retrieval, cfg.learner, cfg.rollout, cfg.frozen
    plan = [
        RoleSpec("retrieval_pool", 1, r.pool_cpus, keys={"cpus": "retrieval.pool_cpus"},
                 detail="batches queries, fans out to shards, merges top-k"),
        RoleSpec("retrieval_shard", cfg.index.num_shards, r.shard_cpus, r.shard_gpus, strategy="SPREAD",
                 keys={"count": "index.num_shards", "cpus": "retrieval.shard_cpus", "gpus": "retrieval.shard_gpus"},
                 detail=f"one {cfg.index.type} index shard each"
                 + (" (FAISS on GPU)" if r.shard_gpus > 0 and cfg.index.type in ("flat", "ivf_pq") else "")),
    ]
    if cfg.index.type != "bm25":
        plan.append(RoleSpec("query_encoder", r.query_encoders, r.encoder_cpus, r.encoder_gpus,
                             keys={"count": "retrieval.query_encoders", "cpus": "retrieval.encoder_cpus",
                                   "gpus": "retrieval.encoder_gpus"},
                             detail=f"{cfg.encoder.model} on {r.encoder_device}"))
    plan.append(RoleSpec("rollout_worker", ro.num_workers, ro.cpus_per_worker, ro.gpus_per_worker, strategy="SPREAD",
                         keys={"count": "rollout.num_workers", "cpus": "rollout.cpus_per_worker",
                               "gpus": "rollout.gpus_per_worker"},
                         detail=f"policy engine ({ro.backend}, tensor_parallel_size={ro.tensor_parallel_size})"))
    n_frozen = frozen_llm_count(cfg)
    if n_frozen:
        plan.append(RoleSpec("frozen_llm", n_frozen, fr.num_cpus, fr.num_gpus,
                             keys={"cpus": "frozen.num_cpus", "gpus": "frozen.num_gpus"},
                             detail="generator + judge" if n_frozen == 2 else "generator (also judges)"))
    learner_keys = {"count": "learner.num_ranks", "cpus": "learner.cpus_per_rank", "gpus": "learner.gpus_per_rank"}
    plan.append(RoleSpec("policy_learner", lrn.num_ranks, lrn.cpus_per_rank, lrn.gpus_per_rank, strategy="PACK",
                         keys=learner_keys, detail=f"DeepSpeed ZeRO-{lrn.zero_stage} ranks, one placement group"))
    if cfg.algorithm.needs_critic:
        plan.append(RoleSpec("critic_learner", lrn.num_ranks, lrn.cpus_per_rank, lrn.gpus_per_rank, strategy="PACK",
                             keys=learner_keys, detail="value model ranks (advantage_estimator=gae)"))
    if cfg.algorithm.kl_coef > 0:
        plan.append(RoleSpec("reference_model", 1, lrn.cpus_per_rank, lrn.gpus_per_rank,
                             keys={"cpus": "learner.cpus_per_rank", "gpus": "learner.gpus_per_rank"},
                             detail=f"frozen reference log-probs (algorithm.kl_coef={cfg.algorithm.kl_coef:g})"))
    return [role for role in plan if role.count > 0]


def total_resources(plan: Sequence[RoleSpec]) -> dict[str, float]:
    """Sum of every role's resources in Ray's names: always "CPU" and "GPU", "memory" (bytes) when
    any role reserves it."""
    out = {CPU: 0.0, GPU: 0.0}
    for role in plan:
        for k, v in role.total().items():
            out[k] = out.get(k, 0.0) + v
    return out


def _fmt(value: float, resource: str) -> str:
    if resource == MEMORY:
        return f"{value / 2**30:.3g} GiB"
    return f"{value:g}"


def _fmt_bundle(bundle: Mapping[str, float], keys: Sequence[str]) -> str:
    return ", ".join(f"{k} {_fmt(float(bundle.get(k, 0.0)), k)}" for k in keys)


def _keys_hint(role: RoleSpec, resource: str) -> str:
    per = {CPU: "cpus", GPU: "gpus", MEMORY: "memory"}[resource]
    keys = [role.keys[k] for k in ("count", per) if k in role.keys]
    return f"lower {' or '.join(keys)}" if keys else "fixed"


def _shortfall(plan: Sequence[RoleSpec], resource: str, need: float, have: float) -> list[str]:
    lines = [f"  {resource}: the plan needs {_fmt(need, resource)}, the cluster has {_fmt(have, resource)}"]
    users = sorted((r for r in plan if r.total().get(resource, 0.0) > 0), key=lambda r: -r.total()[resource])
    for role in users:
        per = role.bundle()[resource]
        each = f"{role.count} x {_fmt(per, resource)}"
        lines.append(f"    {role.name:<16} {each:<12} = {_fmt(role.total()[resource], resource):<8} "
                     f"({_keys_hint(role, resource)})")
    return lines


def _fits(bundle: Mapping[str, float], node: Mapping[str, float]) -> bool:
    return all(node.get(k, 0.0) + _EPS >= v for k, v in bundle.items())


def check_fits(plan: Sequence[RoleSpec], available: Mapping[str, float],
               nodes: Sequence[Mapping[str, float]] | None = None) -> None:
    """Raise `ResourceFitError` when the cluster cannot hold `plan`; return None when it can.

    Args:
        plan: from `plan_roles`.
        available: the cluster's resources in Ray's names, e.g. `ray.available_resources()` taken
            before any actor starts ("CPU", "GPU" counts; "memory" in bytes). Missing keys count as 0.
        nodes: optional per-node resources (e.g. `alive_node_resources(ray.nodes())`): then every
            instance (placement-group bundle) must also fit on one node.
    Raises:
        ResourceFitError: the message names each short resource, every role using it (instances x
            per instance = total) and the config keys that set those numbers; and each role whose
            single instance is larger than every node.
    """
    problems: list[str] = []
    need = total_resources(plan)
    for resource, amount in need.items():
        have = float(available.get(resource, 0.0))
        if amount > have + _EPS:
            problems += _shortfall(plan, resource, amount, have)
    if nodes:
        for role in plan:
            bundle = role.bundle()
            if not any(_fits(bundle, n) for n in nodes):
                largest = max(nodes, key=lambda n: tuple(n.get(k, 0.0) for k in (GPU, CPU, MEMORY)))
                hint = " or ".join(role.keys[k] for k in ("cpus", "gpus") if k in role.keys) or "its resources"
                problems.append(f"  {role.name}: one instance needs {_fmt_bundle(bundle, list(bundle))} but no "
                                f"node has that much (largest: {_fmt_bundle(largest, list(bundle))}); "
                                f"lower {hint} or add a bigger node")
    if problems:
        raise ResourceFitError(problems)


def alive_node_resources(ray_nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per-node total resources of the alive nodes in a `ray.nodes()` listing."""
    return [dict(n.get("Resources", {})) for n in ray_nodes if n.get("Alive")]


def check_ray_cluster(cfg: Any) -> list[RoleSpec]:
    """`check_fits(plan_roles(cfg), ...)` against the connected Ray cluster; call it after
    `ray.init` and before starting any actor. Returns the plan.

    Raises:
        ResourceFitError: see `check_fits`.
    """
    import ray

    plan = plan_roles(cfg)
    check_fits(plan, ray.available_resources(), alive_node_resources(ray.nodes()))
    return plan


def format_plan(plan: Sequence[RoleSpec]) -> str:
    """A small text table of the plan (role, instances, per-instance resources, strategy, keys)."""
    rows = [f"{'role':<16} {'n':>3} {'CPU':>6} {'GPU':>5}  {'strategy':<8} keys"]
    for r in plan:
        keys = ", ".join(r.keys.values())
        rows.append(f"{r.name:<16} {r.count:>3} {r.cpus:>6g} {r.gpus:>5g}  {r.strategy:<8} {keys}")
    total = total_resources(plan)
    rows.append(f"{'total':<16} {'':>3} {total[CPU]:>6g} {total[GPU]:>5g}")
    return "\n".join(rows)
