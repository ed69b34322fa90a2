"""Validate the deploy artifacts offline: no cluster, no API server, no model loaded.

    .venv/bin/python -m scripts.ops.validate_manifests

Prints one line per artifact (`ok` or `FAIL` with every problem found) and a summary; exit status 0 when
all pass, 1 otherwise. What each check covers:

- `cluster/ray-up-gpu.yaml` (`ray up`): Ray's own autoscaler schema (`ray/autoscaler/ray-schema.json`,
  the file Ray's `validate_config` reads) on the file as written and after `ray.autoscaler.sdk.fillout_defaults`
  (the provider defaults `ray up` merges in), Ray's cross-field rules (head type among the node types,
  min_workers within max_workers), then this project's: a GPU worker type, setup commands that run
  `scripts/setup.sh` with SEARCHRL_VARIANT=gpu, the repository and the auth token in `file_mounts`,
  RAY_AUTH_MODE=token on every `ray start`, and every `configs/*_gpu.yaml` plan fits its worker nodes.
- `cluster/kuberay/crd-subset.yaml`: a valid JSON Schema whose every described object has
  `additionalProperties: false` (so the two manifest checks below reject misspelled fields).
- `cluster/kuberay/rayjob-train.yaml`: the RayJob CRD subset; `runtimeEnvYAML` through `ray.runtime_env.RuntimeEnv`
  (plus: only fields Ray knows, nothing installed per job); the entrypoint is `python -m scripts.train
  --config <config> key=value ...` whose config loads, whose paths are absolute, whose HF_HUB_OFFLINE matches
  `cluster.runtime_env.hub_models`, and whose actors (`cluster.roles.plan_roles`) fit the worker groups.
- `cluster/kuberay/rayservice-searcher.yaml`: the RayService CRD subset; `serveConfigV2` through Ray Serve's
  `ServeDeploySchema`, plus no field that schema ignores (it accepts unknown fields for forward
  compatibility, so a misspelled one would do nothing); each application's runtime_env as above; its
  `import_path` imported and called with its `args` to build the `serve.Application` (bound, not deployed;
  a checkpoint that only exists on the cluster is replaced by the config's `learner.model` for this build).

Paths under `/app` (where the image holds this repository, `local:///app`) are read from this checkout.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import shlex
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
RAY_UP = REPO_ROOT / "cluster" / "ray-up-gpu.yaml"
KUBERAY = REPO_ROOT / "cluster" / "kuberay"
CRD_SUBSET = KUBERAY / "crd-subset.yaml"
RAYJOB = KUBERAY / "rayjob-train.yaml"
RAYSERVICE = KUBERAY / "rayservice-searcher.yaml"
IMAGE_REPO = "/app"
"""Where the container image holds this repository; the manifests' working_dir is `local:///app`."""
INSTALL_FIELDS = ("pip", "uv", "conda", "py_executable", "container", "image_uri")
GPU_KEY = "nvidia.com/gpu"


@dataclass
class Result:
    """The outcome of one artifact: `problems` empty means it passed; `details` say what was checked."""

    artifact: str
    details: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def line(self) -> str:
        """One line: `ok    <artifact>: <details>` or `FAIL  <artifact>: <problems>`."""
        said = self.details if self.ok else self.problems
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.artifact}: {'; '.join(said)}"


def load_yaml(path: Path) -> Any:
    """The parsed YAML document at `path`."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def _schema_errors(instance: Any, schema: Mapping, prefix: str = "") -> list[str]:
    """`path: message` for every JSON Schema violation (validator class picked from `$schema`)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    out = []
    for err in sorted(cls(schema).iter_errors(instance), key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        out.append(f"{prefix}{where}: {err.message}")
    return out


def _fits(cfg: Any, nodes: list[dict[str, float]], what: str) -> tuple[str, str | None]:
    """(`name (G GPU, C CPU)` of the plan, problem or None): whether the actors of `cfg`
    (`cluster.roles.plan_roles`) fit `nodes`, in total and each instance on one node (`check_fits`)."""
    from cluster.roles import ResourceFitError, check_fits, plan_roles, total_resources

    plan = plan_roles(cfg)
    need = total_resources(plan)
    summary = f"{cfg.name} ({need.get('GPU', 0):g} GPU, {need.get('CPU', 0):g} CPU)"
    have = {k: sum(n.get(k, 0.0) for n in nodes) for k in ("CPU", "GPU")}
    try:
        check_fits(plan, have, nodes)
    except ResourceFitError as e:
        return summary, f"{what} cannot hold the plan of {summary}: {' '.join(str(e).split())}"
    return summary, None


# ----------------------------------------------------------------------------- ray up


def check_ray_up(config: Any, gpu_configs: list[Path] | None = None) -> Result:
    """Check a `ray up` cluster config (see the module docstring); `gpu_configs` default: configs/*_gpu.yaml."""
    import ray.autoscaler
    from ray.autoscaler.sdk import fillout_defaults

    from configs import load_config

    res = Result(_rel(RAY_UP))
    if not isinstance(config, dict):
        return Result(res.artifact, problems=["not a YAML mapping"])
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())  # validate_config's
    res.problems += _schema_errors(config, schema, "as written: ")
    if res.problems or "provider" not in config:
        return res
    filled = fillout_defaults(copy.deepcopy(config))
    res.problems += _schema_errors(filled, schema, "with Ray's defaults: ")
    types = filled.get("available_node_types", {})
    head = filled.get("head_node_type")
    if head not in types:
        res.problems.append(f"head_node_type {head!r} is not one of available_node_types {sorted(types)}")
    if sum(t.get("min_workers", 0) for t in types.values()) > filled["max_workers"]:
        res.problems.append("the node types' min_workers add up to more than max_workers")
    for name, t in types.items():
        if t.get("min_workers", 0) > t.get("max_workers", filled["max_workers"]):
            res.problems.append(f"available_node_types.{name}: min_workers > max_workers")
        if str(t.get("node_config", {}).get("ImageId", "")).lower() in ("", "latest_dlami"):
            res.problems.append(f"available_node_types.{name}.node_config.ImageId: set an image with the NVIDIA "
                                "driver (Ray's default AMI is Ubuntu 18.04 / CUDA 11.2)")
    res.details.append("Ray's autoscaler schema, as written and with fillout_defaults")
    workers = {n: t for n, t in types.items() if n != head and t.get("resources", {}).get("GPU", 0) > 0}
    if not workers:
        res.problems.append("no worker node type with GPU in its resources")
    setup = " ".join(filled.get("setup_commands", []) + filled.get("worker_setup_commands", []))
    if "scripts/setup.sh" not in setup or "SEARCHRL_VARIANT=gpu" not in setup:
        res.problems.append("setup_commands must install the project: SEARCHRL_VARIANT=gpu bash scripts/setup.sh")
    mounts = filled.get("file_mounts", {})
    if not any(str(src).rstrip("/") in (".", "") for src in mounts.values()):
        res.problems.append('file_mounts must copy the repository ("<remote dir>": ".", run ray up from the repo root)')
    if not any(str(dst).endswith(".ray/auth_token") for dst in mounts):
        res.problems.append("file_mounts must copy the auth token (~/.ray/auth_token) to every node")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in filled.get(key, []) if "ray start" in c]
        if not starts or any("RAY_AUTH_MODE=token" not in c for c in starts):
            res.problems.append(f"{key}: every `ray start` needs RAY_AUTH_MODE=token (token authentication)")
    res.details.append(f"head {head!r} + " + ", ".join(
        f"{n!r} ({t.get('min_workers', 0)} x {t['resources']['GPU']:g} GPU)" for n, t in workers.items())
        + "; token auth on every ray start; setup installs the GPU set")
    nodes = [{k: float(v) for k, v in t.get("resources", {}).items()}
             for t in workers.values() for _ in range(t.get("min_workers", 0))]
    fitted = []
    for path in gpu_configs if gpu_configs is not None else sorted((REPO_ROOT / "configs").glob("*_gpu.yaml")):
        summary, problem = _fits(load_config(path), nodes, "the min_workers GPU nodes")
        res.problems += [problem] if problem else []
        fitted.append(summary)
    res.details += [f"its GPU nodes hold {', '.join(fitted)}"] if fitted else []
    return res


# ----------------------------------------------------------------------------- KubeRay


def crd_subset() -> dict:
    """The CRD subset (cluster/kuberay/crd-subset.yaml): `definitions`, `RayJob`, `RayService`."""
    return load_yaml(CRD_SUBSET)


def _objects(schema: Any, path: str = "") -> Iterator[tuple[str, dict]]:
    """(dotted path, schema) of every schema in `schema` that lists `properties`."""
    if isinstance(schema, dict):
        if "properties" in schema:
            yield path or "(root)", schema
        for key, value in schema.items():
            yield from _objects(value, f"{path}.{key}" if path else key)
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _objects(value, f"{path}[{i}]")


def check_crd_subset(subset: Any) -> Result:
    """The subset is a valid JSON Schema for each kind, and every object it describes rejects unknown fields."""
    import jsonschema

    res = Result(_rel(CRD_SUBSET))
    for kind in ("RayJob", "RayService"):
        try:
            jsonschema.Draft202012Validator.check_schema({**subset[kind], "definitions": subset["definitions"]})
        except (KeyError, TypeError) as e:
            res.problems.append(f"missing {e}")
        except jsonschema.SchemaError as e:
            res.problems.append(f"{kind}: not a valid JSON Schema: {e.message}")
    open_ = [p for p, s in _objects(subset) if s.get("additionalProperties") is not False]
    res.problems += [f"{p}: describes properties without additionalProperties: false" for p in open_]
    n = sum(1 for _ in _objects(subset))
    res.details.append(f"RayJob and RayService schemas; all {n} described objects reject unknown fields")
    return res


def check_crd(manifest: Any, kind: str, subset: Mapping | None = None) -> list[str]:
    """Problems of `manifest` against the CRD subset of `kind` ("RayJob" or "RayService")."""
    subset = subset or crd_subset()
    return _schema_errors(manifest, {**subset[kind], "definitions": subset["definitions"]}, f"{kind} ")


def _local_path(path: str) -> Path:
    """A path of the image (`/app/...`, or relative to its working dir /app) as a path in this checkout."""
    if path == IMAGE_REPO or path.startswith(IMAGE_REPO + "/"):
        return REPO_ROOT / path[len(IMAGE_REPO):].lstrip("/")
    return Path(path) if Path(path).is_absolute() else REPO_ROOT / path


def check_runtime_env(env: Any, where: str, cfg: Any = None) -> list[str]:
    """Problems of a runtime_env: not a mapping, a field Ray does not know, an install (pip, uv, conda,
    py_executable, container, image_uri: nothing is installed per job), what `RuntimeEnv` rejects, a
    working_dir other than `local:///app`, and (with `cfg`) HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE that
    disagree with `cluster.runtime_env.hub_models(cfg)`."""
    from ray.runtime_env import RuntimeEnv

    from cluster.runtime_env import HUB_ENV, hub_models

    if not isinstance(env, Mapping):
        return [f"{where}: must be a mapping, got {type(env).__name__}"]
    known = sorted(f for f in RuntimeEnv.known_fields if not f.startswith("_"))
    problems = [f"{where}: unknown runtime_env field {k!r} (Ray knows {known})"
                for k in env if k not in RuntimeEnv.known_fields]
    problems += [f"{where}: {k!r} installs per job; the image holds the environment (cluster/README.md)"
                 for k in INSTALL_FIELDS if k in env]
    try:
        RuntimeEnv(**env)
    except (TypeError, ValueError) as e:
        problems.append(f"{where}: {' '.join(str(e).split())}")
    if env.get("working_dir") != f"local://{IMAGE_REPO}":
        problems.append(f"{where}.working_dir: expected local://{IMAGE_REPO} (the repository in the image)")
    if cfg is not None:
        hub = hub_models(cfg, REPO_ROOT)
        want = "0" if hub else "1"
        env_vars = env.get("env_vars") or {}
        for name in HUB_ENV:
            if env_vars.get(name) != want:
                why = f"names Hub models ({', '.join(hub)})" if hub else "names only local models"
                problems.append(f"{where}.env_vars.{name}: {env_vars.get(name)!r}, but {cfg.name} {why}: set {want!r}")
    return problems


def check_entrypoint(entrypoint: Any) -> tuple[Any, list[str]]:
    """(config, problems) of a RayJob entrypoint `python -m scripts.train --config FILE key=value ...`:
    the config must load with the overrides and its run_dir and index.dir must be absolute (relative ones
    would land in the image's /app)."""
    from configs import ConfigError, load_config

    if not isinstance(entrypoint, str) or not entrypoint.strip():
        return None, ["entrypoint: missing"]
    tokens = shlex.split(entrypoint)
    if len(tokens) < 3 or not Path(tokens[0]).name.startswith("python") or tokens[1:3] != ["-m", "scripts.train"]:
        return None, [f"entrypoint: expected `python -m scripts.train --config FILE ...`, got {entrypoint!r}"]
    config, overrides, problems = None, [], []
    rest = iter(tokens[3:])
    for tok in rest:
        if tok == "--config":
            config = next(rest, None)
        elif tok.startswith("--config="):
            config = tok.split("=", 1)[1]
        elif tok.startswith("-") and tok not in ("-v", "--verbose"):
            problems.append(f"entrypoint: unexpected option {tok!r}")
        elif "=" in tok:
            overrides.append(tok)
    if config is None:
        return None, problems + ["entrypoint: no --config FILE"]
    try:
        cfg = load_config(_local_path(config), overrides)
    except ConfigError as e:
        return None, problems + [f"entrypoint: {' '.join(str(e).split())}"]
    for key in ("run_dir", "index.dir"):
        value = cfg.run_dir if key == "run_dir" else cfg.index.dir
        if value is not None and not Path(value).is_absolute():
            problems.append(f"entrypoint: {key}={value} is relative; pass an absolute path on shared storage")
    return cfg, problems


def _quantity(value: Any) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _pod_resources(group: Mapping) -> dict[str, float]:
    """Ray's CPU/GPU of one pod of a head or worker group: rayStartParams num-cpus/num-gpus, else the
    first (Ray) container's limits (cpu, nvidia.com/gpu), else its requests."""
    params = group.get("rayStartParams") or {}
    res = (group["template"]["spec"]["containers"][0].get("resources") or {})
    limits = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    return {"CPU": _quantity(params.get("num-cpus", limits.get("cpu", 0))),
            "GPU": _quantity(params.get("num-gpus", limits.get(GPU_KEY, 0)))}


def _cluster_checks(spec: Mapping, kind: str) -> tuple[list[dict[str, float]], list[str]]:
    """(pods' Ray resources, problems) of a RayCluster spec: Ray version, token auth, a GPU worker group."""
    import ray

    problems = []
    if spec.get("rayVersion") != ray.__version__:
        problems.append(f"{kind}: rayVersion {spec.get('rayVersion')!r}, but the project runs Ray {ray.__version__}")
    if (spec.get("authOptions") or {}).get("mode") != "token":
        problems.append(f"{kind}: authOptions.mode must be token (token authentication everywhere, cluster/README.md)")
    nodes = [_pod_resources(spec["headGroupSpec"])]
    for group in spec.get("workerGroupSpecs") or []:
        count = group.get("replicas", group.get("minReplicas", 0)) * group.get("numOfHosts", 1)
        nodes += [_pod_resources(group)] * count
    if not any(n["GPU"] > 0 for n in nodes[1:]):
        problems.append(f"{kind}: no worker group with {GPU_KEY} in its container limits")
    return nodes, problems


def _crd_checked(manifest: Any, kind: str, path: Path, subset: Mapping | None) -> tuple[Result, Any]:
    """A Result for `path` after the CRD subset check, and the manifest's spec (None when that check failed)."""
    res = Result(_rel(path))
    res.problems += check_crd(manifest, kind, subset)
    if res.problems:
        return res, None
    res.details.append(f"{kind} CRD subset")
    return res, manifest["spec"]


def check_rayjob(manifest: Any, subset: Mapping | None = None) -> Result:
    """Check the training RayJob (see the module docstring)."""
    res, spec = _crd_checked(manifest, "RayJob", RAYJOB, subset)
    if spec is None:
        return res
    if spec.get("shutdownAfterJobFinishes") is not True:
        res.problems.append("spec.shutdownAfterJobFinishes: set true (the cluster is deleted when the job ends)")
    cfg, problems = check_entrypoint(spec.get("entrypoint"))
    res.problems += problems
    try:
        res.problems += check_runtime_env(yaml.safe_load(spec.get("runtimeEnvYAML") or ""), "spec.runtimeEnvYAML", cfg)
    except yaml.YAMLError as e:
        res.problems.append(f"spec.runtimeEnvYAML: not YAML: {' '.join(str(e).split())}")
    if cfg is not None:
        res.details.append(f"entrypoint config {cfg.name} loads; runtimeEnvYAML passes RuntimeEnv, Hub access matches")
    if "rayClusterSpec" not in spec:
        return res
    nodes, problems = _cluster_checks(spec["rayClusterSpec"], "spec.rayClusterSpec")
    res.problems += problems
    if cfg is not None:
        gpu_pods = sum(n["GPU"] > 0 for n in nodes)
        summary, problem = _fits(cfg, nodes, f"the {len(nodes)} pods")
        res.problems += [problem] if problem else []
        res.details.append(f"its {len(nodes)} pods ({gpu_pods} with GPUs) hold {summary}")
    return res


def _split(overrides: Any) -> list[str]:
    return overrides.split() if isinstance(overrides, str) else list(overrides or [])


def _build_args(args: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`args` for a local build: config paths read from this checkout; a checkpoint that does not exist
    here replaced by the config's learner.model. Returns (args, note about the replacement)."""
    from configs import load_config

    local, note = dict(args), None
    if isinstance(local.get("config"), str):
        local["config"] = str(_local_path(local["config"]))
    checkpoint = local.get("checkpoint")
    if isinstance(checkpoint, str) and checkpoint.startswith("/") and not Path(checkpoint).exists():
        cfg = load_config(local.get("config"), _split(local.get("overrides")))
        local["checkpoint"] = cfg.learner.model
        note = f"checkpoint {checkpoint} is not on this machine: built with {cfg.learner.model}"
    return local, note


def _unknown_serve_fields(data: Mapping, where: str) -> list[str]:
    """Fields ServeDeploySchema accepts and ignores (its models allow extras for forward compatibility), so a
    misspelling would silently do nothing: the top level, http_options, applications[], their deployments[]."""
    from ray.serve import schema as s

    def names(model: Any) -> set[str]:
        return set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}

    def unknown(obj: Any, model: Any, at: str) -> list[str]:
        extra = sorted(set(obj) - names(model)) if isinstance(obj, Mapping) else []
        return [f"{at}: unknown field {k!r} (Ray Serve ignores it; {model.__name__} has {sorted(names(model))})"
                for k in extra]

    out = unknown(data, s.ServeDeploySchema, where) + unknown(data.get("http_options"), s.HTTPOptionsSchema,
                                                              f"{where}.http_options")
    for i, app in enumerate(data.get("applications") or []):
        out += unknown(app, s.ServeApplicationSchema, f"{where}.applications[{i}]")
        for j, dep in enumerate((app.get("deployments") or []) if isinstance(app, Mapping) else []):
            out += unknown(dep, s.DeploymentSchema, f"{where}.applications[{i}].deployments[{j}]")
    return out


def check_serve_config(text: Any, where: str = "spec.serveConfigV2") -> tuple[list[str], list[str]]:
    """(details, problems) of a serveConfigV2: `ServeDeploySchema`, each application's runtime_env, and
    its builder imported and called with its args (the Application is bound, never deployed)."""
    import pydantic
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    from configs import ConfigError, load_config

    try:
        data = yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError as e:
        return [], [f"{where}: not YAML: {e}"]
    if not isinstance(data, dict):
        return [], [f"{where}: must be a YAML mapping (Ray Serve's config file)"]
    try:
        schema = ServeDeploySchema.model_validate(data)
    except pydantic.ValidationError as e:
        return [], [f"{where}: ServeDeploySchema: {' '.join(str(e).split())}"]
    details, problems = ["ServeDeploySchema, no unknown fields"], _unknown_serve_fields(data, where)
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    for i, app in enumerate(schema.applications):
        at = f"{where}.applications[{i}]"
        cfg = None
        if isinstance(app.args.get("config"), str):
            try:
                cfg = load_config(_local_path(app.args["config"]), _split(app.args.get("overrides")))
            except ConfigError as e:
                problems.append(f"{at}.args: {' '.join(str(e).split())}")
        problems += check_runtime_env(app.runtime_env or {}, f"{at}.runtime_env", cfg)
        module, _, attr = app.import_path.rpartition(":") if ":" in app.import_path else app.import_path.rpartition(".")
        try:
            builder = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            problems.append(f"{at}.import_path {app.import_path!r}: {type(e).__name__}: {e}")
            continue
        if isinstance(builder, serve.Application):
            details.append(f"{app.import_path} imports an Application")
            continue
        try:
            args, note = _build_args(app.args)
            built = builder(args)
        except Exception as e:  # noqa: BLE001 - any error of the user's builder is the finding
            problems.append(f"{at}: building {app.import_path} with its args failed: {type(e).__name__}: {e}")
            continue
        if not isinstance(built, serve.Application):
            problems.append(f"{at}: {app.import_path} returned {type(built).__name__}, not a serve.Application")
            continue
        details.append(f"{app.import_path} built the application{f' ({note})' if note else ''}")
    return details, problems


def check_rayservice(manifest: Any, subset: Mapping | None = None) -> Result:
    """Check the searcher RayService (see the module docstring)."""
    res, spec = _crd_checked(manifest, "RayService", RAYSERVICE, subset)
    if spec is None:
        return res
    details, problems = check_serve_config(spec.get("serveConfigV2"))
    res.details += details
    res.problems += problems
    res.problems += _cluster_checks(spec["rayClusterConfig"], "spec.rayClusterConfig")[1]
    return res


def validate_all() -> list[Result]:
    """Check every artifact; an artifact that cannot be read is one failed result."""
    results = []
    for path, check in ((RAY_UP, check_ray_up), (CRD_SUBSET, check_crd_subset),
                        (RAYJOB, check_rayjob), (RAYSERVICE, check_rayservice)):
        try:
            results.append(check(load_yaml(path)))
        except (OSError, yaml.YAMLError) as e:
            results.append(Result(_rel(path), problems=[f"cannot read: {e}"]))
    return results


def main(argv: list[str] | None = None) -> int:
    """Entry point: validate the deploy artifacts, print one line each and a summary; 0 all pass, 1 otherwise."""
    argparse.ArgumentParser(prog="python -m scripts.ops.validate_manifests",
                            description=__doc__.splitlines()[0]).parse_args(argv)
    results = validate_all()
    for result in results:
        print(result.line())
    failed = sum(not r.ok for r in results)
    print(f"validate_manifests: {len(results)} artifacts, {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
