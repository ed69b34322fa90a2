"""Each node of the cluster sweeps its own leftovers: what killed vLLM engines and DeepSpeed ranks left
in that node's /dev/shm (`cluster.shm.sweep_stale_shm`). A sweep on the driver's node alone
misses every other node's files, and /dev/shm is memory: 160-250 MB per dead vLLM engine.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def _sweep(min_age_s: float) -> tuple[str, list[str]]:
    import ray

    from cluster.shm import sweep_stale_shm

    return ray.get_runtime_context().get_node_id(), sweep_stale_shm(min_age_s)


def sweep_every_node(min_age_s: float = 60.0, timeout_s: float = 60.0) -> dict[str, list[str]]:
    """Run `sweep_stale_shm(min_age_s)` once on every alive node of the connected Ray cluster: a
    zero-CPU task pinned to each node (hard node affinity), so it runs even when the node's CPUs are
    all reserved. Nodes that do not answer within `timeout_s` seconds (dying, unreachable) are
    skipped with a warning; a cleanup never fails the caller.

    Returns:
        {node_id (hex): removed paths on that node}.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    sweep = ray.remote(num_cpus=0, max_retries=0)(_sweep)
    refs = [sweep.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(min_age_s)
            for n in ray.nodes() if n.get("Alive")]
    done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    out: dict[str, list[str]] = {}
    for ref in done:
        try:
            node, removed = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - a node that died meanwhile: nothing to sweep there
            log.warning("a /dev/shm sweep task failed: %s: %s", type(e).__name__, e)
            continue
        out[node] = removed
        if removed:
            log.info("node %s: removed %d stale /dev/shm files", node[:8], len(removed))
    for ref in pending:
        ray.cancel(ref, force=True)
    if pending:
        log.warning("%d node(s) did not sweep /dev/shm within %.0f s", len(pending), timeout_s)
    return out
