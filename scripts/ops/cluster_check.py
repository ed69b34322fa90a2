"""Can this Ray cluster hold a run of this config? Print its resources and the role plan, check it.

    .venv/bin/python -m scripts.ops.cluster_check [--address auto] [--config PATH] [KEY=VALUE ...]
    .venv/bin/python -m scripts.submit --module scripts.ops.cluster_check [--config PATH] [KEY=VALUE ...]

Connects to a running cluster (`ray.init(address="auto")`; inside a submitted job that is the
job's cluster), prints the cluster's total and available resources, the actors a training run
would start (`cluster.roles.plan_roles`) and the result of `check_fits`, and writes all of it to
`<run_dir>/cluster_check.json`. Exit status 0 when the plan fits, 1 when it does not (the message
names the roles and config keys), 2 for a bad config.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from scripts.cli import parse_config

# Environment variables worth seeing in the report (what the job's runtime_env set); no secrets.
REPORTED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "RAY_USAGE_STATS_ENABLED",
                "WANDB_MODE", "SEARCHRL_DATA", "SEARCHRL_MODEL_CACHE", "RAY_AUTH_MODE")


def cluster_report(cfg) -> dict:
    """Resources of the connected cluster, the plan for `cfg` and whether it fits (JSON-ready)."""
    import ray

    from cluster.roles import ResourceFitError, alive_node_resources, check_fits, plan_roles, total_resources

    available = ray.available_resources()
    nodes = alive_node_resources(ray.nodes())
    plan = plan_roles(cfg)
    error = None
    try:
        check_fits(plan, available, nodes)
    except ResourceFitError as e:
        error = str(e)
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "ray_version": ray.__version__,
        "python": sys.executable,
        "host": platform.node(),
        "cwd": os.getcwd(),
        "env": {k: os.environ[k] for k in REPORTED_ENV if k in os.environ},
        "config_name": cfg.name,
        "cluster_resources": ray.cluster_resources(),
        "available_resources": available,
        "nodes": nodes,
        "plan": [role.as_dict() for role in plan],
        "total": total_resources(plan),
        "fits": error is None,
        "error": error,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: report the Ray cluster's resources and whether the config's role plan fits (exit 0 fits, 1 not).

    Usage: .venv/bin/python -m scripts.ops.cluster_check [--address auto] [--config PATH] [KEY=VALUE ...]
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.ops.cluster_check", description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="auto", help="Ray cluster to join (default: auto = the running one)")
    args, cfg = parse_config(parser, argv)

    import ray

    from cluster.roles import format_plan, plan_roles

    ray.init(address=args.address, namespace=cfg.ray.namespace, log_to_driver=False)
    try:
        report = cluster_report(cfg)
    finally:
        ray.shutdown()
    print(f"cluster (Ray {report['ray_version']}, {len(report['nodes'])} node(s)): "
          f"total {report['cluster_resources']}")
    print(f"available: {report['available_resources']}")
    print(f"python: {report['python']}  cwd: {report['cwd']}")
    print(f"plan for config {cfg.name!r}:\n{format_plan(plan_roles(cfg))}")
    print("fits: yes" if report["fits"] else f"fits: NO\n{report['error']}")
    out = Path(cfg.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cluster_check.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0 if report["fits"] else 1


if __name__ == "__main__":
    sys.exit(main())
