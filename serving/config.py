"""The config of a served checkpoint: the run's saved `config.yaml` unless `--config` names one,
with `key=value` overrides on top (`serve.port=8001`), through `configs.load_config`."""

from __future__ import annotations

from pathlib import Path

from configs import Config, load_config
from serving.checkpoint import Served, resolve_served

# the main job's config: its loop, in which the agent writes its own queries
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "main_cpu.yaml"
"""For a model directory or name with no run (and no --config): the s3 CPU config (s3 trains only the searcher)."""


def config_path(served: Served, config: str | None) -> Path:
    """`config` if given, else the run's `config.yaml`, else `DEFAULT_CONFIG`."""
    return Path(config) if config else (served.config or DEFAULT_CONFIG)


def load_serving(checkpoint: str, config: str | None = None, overrides: list[str] = ()) -> tuple[Served, Config]:
    """The served policy and its config.

    Raises:
        CheckpointError: PATH names nothing servable. ConfigError: a bad config or override.
    """
    served = resolve_served(checkpoint)
    return served, load_config(config_path(served, config), list(overrides))
