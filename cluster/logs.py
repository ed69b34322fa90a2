"""One logging setup for every entry point: the `logging` module, one format, a per-run log file.

- Console (stderr): this project's loggers at INFO; Ray, vLLM, transformers, DeepSpeed and the
  other libraries at WARNING. Ray's driver messages ("Started a local Ray instance") and the actors'
  output (worker-process warnings, per-actor log lines) stay off the console; they are in the
  run's log and in Ray's session log folder, whose path the run's log records.
- `--verbose` (every entry point) shows everything at INFO and streams the actors' output, as Ray
  does by default.
- `add_run_log(run_dir)`: every record from INFO up, from every library, also goes to
  `<run_dir>/run.log`.

Plain `print` is kept for output meant for the user (result tables, paths); progress bars are tqdm.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PROJECT_LOGGERS = ("actors", "algorithms", "cluster", "configs", "pipelines", "recipes", "scripts", "__main__")
RUN_LOG = "run.log"

_state = {"verbose": False}


def setup_logging(verbose: bool = False) -> None:
    """Configure the root logger once per process: a console handler with `FORMAT`; INFO for this
    project's loggers, WARNING for the libraries unless `verbose`. Calling it again only updates
    the levels."""
    _state["verbose"] = verbose
    root = logging.getLogger()
    if not any(getattr(h, "_searchrl_console", False) for h in root.handlers):
        console = logging.StreamHandler()
        console.setFormatter(logging.Formatter(FORMAT))
        console._searchrl_console = True  # type: ignore[attr-defined]
        root.addHandler(console)
    root.setLevel(logging.INFO)
    library_level = logging.INFO if verbose else logging.WARNING
    for handler in root.handlers:
        if getattr(handler, "_searchrl_console", False):
            handler.removeFilter(_console_filter)
            if not verbose:
                handler.addFilter(_console_filter)
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", logging.getLevelName(library_level))
    if not verbose:
        os.environ.setdefault("WANDB_SILENT", "true")  # its run paths are printed in the final summary
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def _console_filter(record: logging.LogRecord) -> bool:
    """Console: this project's INFO records, everyone's warnings."""
    return record.levelno >= logging.WARNING or record.name.split(".")[0] in PROJECT_LOGGERS


def quiet_library_console(name: str, drop: tuple[str, ...] = ()) -> None:
    """Without `--verbose`: the console handlers a library attached to its own non-propagating logger
    `name` (Ray Data does at import: INFO lines per dataset execution) show only its warnings, and
    none whose message starts with one of `drop` (notices about a setting this project chose). Its
    file handlers keep everything. A no-op with `--verbose`."""
    if verbose():
        return

    def console_only_warnings(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and not record.getMessage().startswith(drop)

    console_only_warnings._searchrl_quiet = True  # type: ignore[attr-defined]
    for handler in logging.getLogger(name).handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            if not any(getattr(f, "_searchrl_quiet", False) for f in handler.filters):  # once per handler
                handler.addFilter(console_only_warnings)


def verbose() -> bool:
    """Whether `setup_logging(verbose=True)` was called (actors' output streamed to the console)."""
    return _state["verbose"]


def add_run_log(run_dir: str | Path) -> Path:
    """Send every INFO-and-above record of this process, from every logger, to `<run_dir>/run.log`
    (appended: a resumed run continues it). Ray's and vLLM's loggers may not propagate to the root
    (Ray sets its own up on import), so they get the file too, through a second handler; the root's
    handler leaves their records out, so none is written twice. Returns the file's path."""
    path = Path(run_dir) / RUN_LOG
    if _run_handlers(path):
        return path
    formatter = logging.Formatter(FORMAT)
    to_root = logging.FileHandler(path, encoding="utf-8")
    to_root.addFilter(lambda record: record.name.split(".")[0] not in _OWN_HANDLERS)
    to_libraries = logging.FileHandler(path, encoding="utf-8")
    for handler in (to_root, to_libraries):
        handler.setFormatter(formatter)
        handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(to_root)
    for name in _OWN_HANDLERS:
        logging.getLogger(name).addHandler(to_libraries)
    return path


def remove_run_log(run_dir: str | Path) -> None:
    """Close and detach the `add_run_log` handlers of `run_dir`."""
    for logger, handler in _run_handlers(Path(run_dir) / RUN_LOG):
        logger.removeHandler(handler)
        handler.close()


_OWN_HANDLERS = ("ray", "vllm")  # libraries that may configure non-propagating loggers of their own


def _run_handlers(path: Path) -> list[tuple[logging.Logger, logging.Handler]]:
    loggers = [logging.getLogger()] + [logging.getLogger(n) for n in _OWN_HANDLERS]
    return [(lg, h) for lg in loggers for h in list(lg.handlers)
            if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path.resolve()]
