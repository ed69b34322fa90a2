"""Start or join the Ray cluster a program runs on (one place, so every entry point behaves alike)."""

from __future__ import annotations

import os


def init_ray(ray_cfg, **kwargs) -> bool:
    """Connect to `ray_cfg.address` ("auto" = the running cluster) or start a local one.

    Args:
        ray_cfg: `configs.schema.RayConfig`.
        **kwargs: extra `ray.init` arguments.
    Returns:
        True when this call started a local cluster (the caller owns it and shuts it down).
    """
    import ray

    if ray.is_initialized():
        return False
    local = ray_cfg.address is None and not os.environ.get("RAY_ADDRESS")
    opts = {"namespace": ray_cfg.namespace, "log_to_driver": True} | kwargs
    if local:
        opts |= {"include_dashboard": False}
        if ray_cfg.num_cpus:
            opts["num_cpus"] = ray_cfg.num_cpus
        ray.init(**opts)
    else:
        ray.init(address=ray_cfg.address or os.environ["RAY_ADDRESS"], **opts)
    return local
