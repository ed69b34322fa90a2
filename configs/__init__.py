"""Typed configuration: schema (:mod:`configs.schema`) and YAML loading (:mod:`configs.loader`)."""

from .loader import (
    DEFAULT_CONFIG,
    ConfigError,
    add_config_args,
    config_from_args,
    load_config,
    make_run_dir,
    parse_overrides,
    save_config,
)
from .schema import Config

__all__ = [
    "DEFAULT_CONFIG",
    "Config",
    "ConfigError",
    "add_config_args",
    "config_from_args",
    "load_config",
    "make_run_dir",
    "parse_overrides",
    "save_config",
]
