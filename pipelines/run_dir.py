"""A training run's directory: a new one per run, the resolved config it keeps as YAML, and the
checkpoint a `--resume` of it continues from."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from configs.schema import Config
from pipelines.checkpoints import checkpoint_step, last_checkpoint

log = logging.getLogger(__name__)


def resume_checkpoint(run_dir: Path, cfg: Config) -> Path:
    """The checkpoint a resume of `run_dir` under `cfg` continues from. The run's `config.yaml` is never
    rewritten: what `cfg` changes (only what `configs.resume.RESUME_KEYS` allows) goes to
    `config.resume-<step>.yaml` and the log.

    Raises:
        FileNotFoundError: no resumable checkpoint under `run_dir/checkpoints`.
        ConfigError: `cfg` changes a key a resume may not change, or `run_dir` has no config.yaml.
    """
    from configs.resume import load_resume_config, resume_changes

    checkpoint = last_checkpoint(run_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"--resume {run_dir}: no resumable checkpoint under {run_dir}/checkpoints")
    changed = resume_changes(load_resume_config(run_dir)[0], cfg)
    if changed:
        step = checkpoint_step(checkpoint)
        (run_dir / f"config.resume-{step}.yaml").write_text(cfg_to_yaml(cfg))
        log.info("resume at step %d changes %s (config.resume-%d.yaml)", step,
                 ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()), step)
    return checkpoint


def new_run_dir(cfg: Config) -> Path:
    """`<run_dir>/<recipe>-<timestamp>/` (created)."""
    path = Path(cfg.run_dir) / f"{cfg.train.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def cfg_to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (what `--resume` and `configs.load_config` read back)."""
    import yaml

    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
