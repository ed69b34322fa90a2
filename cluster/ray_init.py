"""Start or join the Ray cluster a program runs on (one place, so every entry point behaves alike)."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading

log = logging.getLogger(__name__)


def init_ray(ray_cfg, **kwargs) -> bool:
    """Connect to `ray_cfg.address` ("auto" = the running cluster) or start a local one.

    Args:
        ray_cfg: `configs.schema.RayConfig`.
        **kwargs: extra `ray.init` arguments.

    Ray's own driver messages and the actors' output reach the console only with `--verbose`
    (`cluster.logs`); otherwise they are in Ray's session log folder, logged here. A SIGTERM handler
    the program installed stays installed (ray.init would replace it with `sys.exit`).
    A local cluster is marked (`cluster.leftovers`): when the program exits, after Ray's shutdown,
    its processes that outlived it (a vLLM engine core whose actor Ray stopped) are killed.

    Returns:
        True when this call started a local cluster (the caller owns it and shuts it down).
    """
    import ray

    if ray.is_initialized():
        return False
    from cluster.torch_extensions import default_extensions_dir

    default_extensions_dir()  # before the local cluster starts: its actors inherit it
    local = ray_cfg.address is None and not os.environ.get("RAY_ADDRESS")
    from cluster.logs import verbose

    loud = verbose()
    # ray.init replaces a main-thread driver's SIGTERM handler with sys.exit; keep the program's own
    # (scripts.cli.sigterm_as_interrupt: bounded cleanup) when it installed one.
    own = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    opts = {"namespace": ray_cfg.namespace, "log_to_driver": loud,
            "logging_level": logging.INFO if loud else logging.WARNING} | kwargs
    if local:
        opts |= local_cluster_options(ray_cfg)
        from cluster.leftovers import mark

        end_dead_programs_leftovers()
        mark()  # before ray.init: every process of the cluster inherits it
        try:
            context = ray.init(**opts)
        except BaseException:  # Ctrl-C / SIGTERM (or a failure) mid-start: no half-started cluster outlives us
            abort_local_start()
            raise
        atexit.unregister(shutdown_local_ray)  # once, however many clusters the program starts
        atexit.register(shutdown_local_ray)
    else:
        context = ray.init(address=ray_cfg.address or os.environ["RAY_ADDRESS"], **opts)
    if callable(own):
        signal.signal(signal.SIGTERM, own)
    log.info("Ray %s at %s; actor logs in %s", "started" if local else "joined",
             context.address_info.get("gcs_address"), context.address_info.get("session_dir"))
    return local


def local_cluster_options(ray_cfg) -> dict:
    """`ray.init` arguments for a cluster this program starts: no dashboard, `num_cpus` (logical CPUs)
    and `object_store_memory` (bytes, from `object_store_gib`) when the config sets them."""
    opts: dict = {"include_dashboard": False}
    if ray_cfg.num_cpus:
        opts["num_cpus"] = ray_cfg.num_cpus
    if ray_cfg.object_store_gib:
        opts["object_store_memory"] = int(ray_cfg.object_store_gib * 2**30)
    return opts


def end_dead_programs_leftovers() -> list[int]:
    """SIGKILL what earlier programs' local clusters left when those programs died without their cleanup
    (`cluster.leftovers.orphans_of_dead_programs`: vLLM engines re-parented to init hold GBs, and the new
    cluster's memory monitor would kill its own workers for them). Returns the pids."""
    from cluster.leftovers import kill_processes, orphans_of_dead_programs

    stale = orphans_of_dead_programs()
    kill_processes(stale)
    if stale:
        log.warning("killed %d process(es) a stopped program's Ray cluster left behind: %s", len(stale),
                    [p.pid for p in stale])
    return [p.pid for p in stale]


def abort_local_start() -> list[int]:
    """Undo an interrupted start of a local cluster: `ray.shutdown()`, then SIGKILL every marked process
    (`cluster.leftovers`), this program's children included: a start cut short (a SIGTERM during
    `ray.init`) leaves GCS, raylet and agents that `ray.shutdown` does not know of, and once this program
    exits they live on as orphans (seen: `ray::DashboardAgent`, `ray::RuntimeEnvAgent`). Returns the pids."""
    import ray

    from cluster.leftovers import kill_processes
    from cluster.leftovers import MARKER, leftovers

    try:
        ray.shutdown()
    except Exception as e:  # noqa: BLE001 - the marked processes are killed below either way
        log.warning("ray.shutdown after an interrupted start failed: %s", e)
    marked = leftovers(descendants=True)
    kill_processes(marked)
    os.environ.pop(MARKER, None)
    if marked:
        log.warning("stopped %d process(es) of the interrupted Ray start-up: %s", len(marked), [p.pid for p in marked])
    return [p.pid for p in marked]


def shutdown_local_ray(grace_s: float = 5.0) -> list[int]:
    """`ray.shutdown()`, then kill the marked processes of the local cluster this program started that
    outlived it (`cluster.leftovers`; nothing when it joined a cluster). Returns the pids killed."""
    import ray

    from cluster.leftovers import MARKER, kill_leftovers

    ray.shutdown()
    killed = kill_leftovers(grace_s)
    os.environ.pop(MARKER, None)  # what this program starts from now on belongs to no cluster
    if killed:
        log.warning("killed %d process(es) the local Ray cluster left behind: %s", len(killed), killed)
    return killed
