"""Start and stop the searcher application on the current Ray cluster (for `scripts.serve`,
`scripts.bench.serve` and tests; `serve run serving.app:build_app` does the same through Serve's CLI)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from serving.checkpoint import Served

APP_NAME = "searchrl"
log = logging.getLogger(__name__)


def start_app(cfg: Any, served: Served, ready_timeout_s: float = 60.0) -> str:
    """Start Serve's HTTP proxy on `serve.host:serve.port`, deploy the app (returns once every
    deployment is up: the engine loaded, the pool's shards answering) and wait until the proxy routes
    to it.

    Returns:
        The base URL, e.g. `http://127.0.0.1:8000` (route prefix included when not "/"; a wildcard
        host is shown as 127.0.0.1).
    Raises:
        RuntimeError: no proxy on host:port routes to the app within `ready_timeout_s` seconds
            (Serve already runs on this cluster with other HTTP options); the app is deleted again.
    """
    from ray import serve

    from actors.retrieval.http import wait_for_route
    from serving.app import compose

    sv = cfg.serve
    serve.start(http_options={"host": sv.host, "port": sv.port})
    serve.run(compose(cfg, served), name=APP_NAME, route_prefix=sv.route_prefix)
    host = "127.0.0.1" if sv.host in ("0.0.0.0", "::", "") else sv.host
    host = f"[{host}]" if ":" in host else host
    base = f"http://{host}:{sv.port}"
    try:
        wait_for_route(base, APP_NAME, ready_timeout_s)
    except RuntimeError as e:
        serve.delete(APP_NAME)
        raise RuntimeError(f"{e}; if Ray Serve already runs on this cluster with another host/port, set "
                           f"serve.host/serve.port to match or shut Serve down first") from None
    return f"{base}{sv.route_prefix.rstrip('/')}"


def stop_app(own_cluster: bool) -> list[str]:
    """Remove the app; on a cluster this process started, stop Serve and Ray too, kill the replicas'
    engine processes that outlived them (`cluster.ray_init.shutdown_local_ray`) and remove the /dev/shm
    segments its processes mapped before the stop that no process maps any more (an engine whose replica
    was killed mid-shutdown leaves vLLM's 160 MB `psm_*` message queue otherwise), then what engines of
    replicas that crashed earlier left (`cluster.shm.sweep_stale_shm`, as a training run does at its end).

    Returns:
        The removed /dev/shm paths ([] on a joined cluster, whose processes are not ours).
    """
    from ray import serve

    from cluster.ray_init import shutdown_local_ray
    from cluster.shm import STOP_SWEEP_MIN_AGE_S, remove_unmapped, sweep_stale_shm, tree_segments

    segments = tree_segments() if own_cluster else set()  # the local cluster's processes are ours
    with contextlib.suppress(Exception):  # nothing to clean up if Serve never started
        serve.shutdown() if own_cluster else serve.delete(APP_NAME)
    if not own_cluster:
        return []
    shutdown_local_ray()
    removed = remove_unmapped(segments)  # any age: the sweep's age guard would spare one written just now
    removed += sweep_stale_shm(STOP_SWEEP_MIN_AGE_S)
    if removed:
        log.info("removed %d /dev/shm segment(s) stopped engines left: %s", len(removed), ", ".join(removed))
    return removed
