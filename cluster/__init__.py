"""Cluster placement and job submission: which role needs which resources (`roles`), the runtime_env
of a submitted job (`runtime_env`), and how a program starts or joins Ray (`ray_init`).

Importing this package does not import Ray."""

from .roles import ResourceFitError, RoleSpec, check_fits, check_ray_cluster, plan_roles, total_resources
from .runtime_env import absolute_path_overrides, job_runtime_env

__all__ = [
    "ResourceFitError",
    "RoleSpec",
    "absolute_path_overrides",
    "check_fits",
    "check_ray_cluster",
    "job_runtime_env",
    "plan_roles",
    "total_resources",
]
