"""Load, override, validate and save :class:`~configs.schema.Config`.

Typical use in a script::

    parser = argparse.ArgumentParser()
    add_config_args(parser, default_config=str(DEFAULT_CONFIG))
    cfg = config_from_args(parser.parse_args())
    run = make_run_dir(cfg, "build-index")

Overrides are ``dotted.key=value`` strings whose value is parsed as a YAML
scalar, e.g. ``retrieval.topk=5 index.fp16=true ray.address=null``.
"""

from __future__ import annotations

import argparse
import time
import types
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from .schema import Config

DEFAULT_CONFIG = Path(__file__).resolve().parent / "retrieval_cpu.yaml"
"""The embedded default config for a CPU-only machine."""

_OVERRIDE_FORM = "expected KEY=VALUE with a dotted key, e.g. retrieval.topk=5"


class ConfigError(ValueError):
    """A config could not be read or is invalid.

    ``problems`` lists each problem as ``"<dotted.path>: <what is wrong>"``;
    ``source`` names where the config came from (file and/or overrides).
    """

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"invalid config ({source})" if source else "invalid config"
        super().__init__(head + ":\n" + "\n".join(f"  {p}" for p in self.problems))


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``key.sub=value`` strings into a nested dict.

    The value is parsed with ``yaml.safe_load``: ``3`` -> int, ``0.5`` -> float,
    ``true`` -> bool, ``null`` -> None, ``[a, b]`` -> list; an empty value is
    the empty string.  Quote values containing ``: `` (e.g. ``'k="query: "'``).
    Later items win.  Raises :class:`ConfigError` naming a malformed item
    (no ``=``, empty key or key segment, YAML error in the value).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or any(not p.strip() for p in parts):
            raise ConfigError(f"override {item!r}: {_OVERRIDE_FORM}", "command line")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({e})", "command line") from e
        node = out
        for p in parts[:-1]:
            p = p.strip()
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1].strip()] = value
    return out


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """Return the pydantic model inside a field annotation (``M`` or ``M | None``), if any."""
    candidates = [annotation]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        candidates = list(typing.get_args(annotation))
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _model_at(path: Iterable[Any]) -> type[BaseModel] | None:
    """Return the config section model at a dotted path (``()`` = root), or None."""
    model: type[BaseModel] | None = Config
    for part in path:
        field = model.model_fields.get(str(part)) if model else None
        model = _section_model(field.annotation) if field else None
        if model is None:
            return None
    return model


def _merge(base: dict, over: dict, model: type[BaseModel]) -> None:
    """Deep-merge ``over`` into ``base`` in place, following ``model``'s sections.

    Sections merge key by key, free-form mapping fields (e.g. ``train.recipe_options``) merge their
    keys, anything else is replaced. Unknown keys are copied as they are: validation reports them
    (``_format_error``: the one place that names the known keys).
    """
    for key, value in over.items():
        field = model.model_fields.get(key)
        if isinstance(value, dict) and field is not None:
            old = base.get(key) if isinstance(base.get(key), dict) else {}
            sub = _section_model(field.annotation)
            if sub is not None:
                base[key] = old
                _merge(old, value, sub)
                continue
            if typing.get_origin(field.annotation) is dict:
                base[key] = {**old, **value}
                continue
        base[key] = value


def _format_error(err: dict) -> str:
    """One ``path: message`` line for a pydantic error dict of a ``Config`` validation.

    An unknown key lists the known keys of its section; a mapping given where a value belongs (an
    override such as ``retrieval.topk.x=1``) is named as an unknown key below that value.
    """
    loc = tuple(err["loc"])
    dotted = ".".join(str(p) for p in loc) or "<root>"
    value = err.get("input")
    parent = _model_at(loc[:-1]) if loc else None
    if err["type"] == "extra_forbidden" and parent is not None:
        return f"{dotted}: unknown key (allowed: {', '.join(parent.model_fields)})"
    field = parent.model_fields.get(str(loc[-1])) if parent is not None else None
    if (isinstance(value, dict) and value and field is not None and err["type"].endswith("_type")
            and _section_model(field.annotation) is None and typing.get_origin(field.annotation) is not dict):
        return f"{dotted}.{next(iter(value))}: unknown key ({dotted} is a value, not a section)"
    msg = err["msg"].removeprefix("Value error, ")
    if not isinstance(value, dict) and err["type"] not in ("missing", "value_error"):
        shown = repr(value)
        msg += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    return f"{dotted}: {msg}"


def _read_yaml(path: Path) -> dict:
    """Read a YAML mapping from ``path``; an empty file is ``{}``. Raises ConfigError."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}", str(path))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{where}: YAML syntax error: {problem}", str(path)) from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"<root>: expected a mapping of sections, got {type(data).__name__}", str(path))
    return data


def _read_with_base(path: Path, source: str, seen: tuple[Path, ...] = ()) -> dict:
    """A YAML file's data, merged over the file its `base:` key names (a path relative to it), so
    recipe configs share one CPU or GPU base and spell out only what differs."""
    path = path.resolve()
    if path in seen:
        raise ConfigError([f"base: {path} includes itself ({' -> '.join(map(str, seen))})"], source)
    data = _read_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError([f"base: must be a file name (relative to {path.parent}), got {base!r}"], source)
    merged = _read_with_base(path.parent / base, source, (*seen, path))
    _merge(merged, data, Config)
    return merged


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> Config:
    """Load a config from a YAML file (None = defaults only), apply overrides, validate.

    Raises :class:`ConfigError` for a missing file, a YAML syntax error (with
    file and line), a malformed or unknown override, and every validation
    problem (one ``dotted.path: message`` line each).
    """
    overrides = list(overrides)
    source = str(path) if path is not None else "built-in defaults"
    if overrides:
        source += ", overrides: " + " ".join(overrides)
    data = _read_with_base(Path(path), source) if path is not None else {}
    _merge(data, parse_overrides(overrides), Config)
    return validate_config(data, source)


def validate_config(data: dict, source: str) -> Config:
    """Validate a config dict (a file's merged data, or a dumped config with changes) into a `Config`.

    Raises :class:`ConfigError` naming `source`, one ``dotted.path: message`` line per problem.
    """
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError([_format_error(err) for err in e.errors()], source) from None


def save_config(cfg: Config, path: str | Path) -> Path:
    """Write ``cfg`` fully resolved (all fields) as YAML; ``load_config`` reads it back equal."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
    path.write_text(text, encoding="utf-8")
    return path


def make_run_dir(cfg: Config, label: str) -> Path:
    """Create ``<cfg.run_dir>/<label>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... if taken).

    Writes the resolved config to ``config.yaml`` inside it and returns the
    directory.  Raises ValueError for an empty label or one containing ``/``.
    """
    if not label or "/" in label or "\\" in label:
        raise ValueError(f"run label must be a non-empty name without slashes, got {label!r}")
    parent = Path(cfg.run_dir)
    parent.mkdir(parents=True, exist_ok=True)
    stem = f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while True:
        run = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            run.mkdir()
            break
        except FileExistsError:
            n += 1
    save_config(cfg, run / "config.yaml")
    return run


def add_config_args(parser: argparse.ArgumentParser, default_config: str | None = None) -> argparse.ArgumentParser:
    """Add ``--config PATH`` and positional ``KEY=VALUE`` overrides to ``parser``."""
    parser.add_argument(
        "--config", default=default_config, metavar="PATH",
        help=f"YAML config file (default: {default_config or 'built-in defaults'})",
    )
    parser.add_argument(
        "overrides", nargs="*", default=[], metavar="KEY=VALUE",
        help="config overrides, e.g. retrieval.topk=5 index.fp16=true",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    """Build the Config from arguments added by :func:`add_config_args`."""
    return load_config(args.config, args.overrides)
