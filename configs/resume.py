"""What a resumed run may change: how long it runs, how often it evaluates and saves, how it logs
and where Ray is, never what it is (recipe, models, data, algorithm, batch sizes, seeds).

`resume_changes(saved, new)` lists the dotted keys that differ between a run's saved config and the
config it is resumed with, and raises `ConfigError` naming every key it may not change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .loader import ConfigError, load_config
from .schema import Config

RESUME_KEYS: tuple[str, ...] = (
    "train.total_steps", "train.eval_every", "train.eval_questions", "train.save_every", "train.keep_checkpoints",
    "train.keep_every", "train.save_rollouts", "train.max_learner_restarts", "train.wandb.", "ray.",
    "learner.sync_dtype", "rollout.dtype", "frozen.dtype",
)
"""Keys (a trailing "." = every key of that section) a resume may override; all others are the run. The engines'
dtypes and the sync dtype may change (a run moved to a CPU without bf16 instructions, `configs.dtype_choice`);
`learner.dtype` may not: the DeepSpeed checkpoint holds the weights and optimizer state in its layout."""


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def resumable_key(key: str) -> bool:
    """True when `key` (dotted) is one a resumed run may change (`RESUME_KEYS`)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUME_KEYS)


def resume_changes(saved: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """The keys whose values differ between `saved` and `new`, as `{key: (saved, new)}`.

    Raises:
        ConfigError: a changed key that is not in `RESUME_KEYS`, naming each one with both values.
    """
    before, after = _flat(saved.model_dump(mode="json")), _flat(new.model_dump(mode="json"))
    changed = {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
               if before.get(k) != after.get(k)}
    refused = [f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items() if not resumable_key(k)]
    if refused:
        raise ConfigError(refused + [
            "a resumed run keeps what it is (recipe, models, data, algorithm, batch sizes, seeds); it may change "
            f"only {', '.join(k.rstrip('.') for k in RESUME_KEYS)}. Start a new run for the rest."], "--resume")
    return changed


def load_resume_config(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[Config, dict]:
    """A run's own `config.yaml` with `overrides` applied; returns it and `resume_changes`.

    Raises:
        ConfigError: `run_dir` has no `config.yaml`, an override is malformed or invalid, or it
            changes a key a resume may not change (see `resume_changes`).
    """
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--resume {run_dir}: no config.yaml there; pass a run directory written by "
                          "scripts.train (runs/<recipe>-<timestamp>)", "--resume")
    saved = load_config(path)
    new = load_config(path, overrides) if overrides else saved
    return new, resume_changes(saved, new)
