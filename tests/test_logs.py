"""One logging setup: project messages on the console, library noise only in the logs unless
--verbose, and every record in the run's log file."""

from __future__ import annotations

import logging

import pytest

from cluster import logs


@pytest.fixture
def clean_root():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    for name in ("ray", "vllm"):
        for h in [h for h in logging.getLogger(name).handlers if isinstance(h, logging.FileHandler)]:
            logging.getLogger(name).removeHandler(h)
    root.setLevel(level)
    logs._state["verbose"] = False


def _console(root):
    return next(h for h in root.handlers if getattr(h, "_searchrl_console", False))


def _shown(handler, name: str, level: int) -> bool:
    return handler.filter(logging.LogRecord(name, level, __file__, 1, "m", None, None)) and level >= handler.level


def test_console_shows_project_info_and_everyone_s_warnings(clean_root):
    logs.setup_logging(verbose=False)
    console = _console(clean_root)
    assert _shown(console, "pipelines.train", logging.INFO)
    assert not _shown(console, "ray.worker", logging.INFO) and not _shown(console, "vllm", logging.INFO)
    assert _shown(console, "ray.worker", logging.WARNING)
    assert not logs.verbose()
    logs.setup_logging(verbose=True)  # again: levels change, no second console handler
    assert _shown(_console(clean_root), "ray.worker", logging.INFO) and logs.verbose()
    assert sum(getattr(h, "_searchrl_console", False) for h in clean_root.handlers) == 1


def test_run_log_gets_every_library_s_records(clean_root, tmp_path):
    logs.setup_logging(verbose=False)
    ray_logger = logging.getLogger("ray")
    propagate = ray_logger.propagate
    path = logs.add_run_log(tmp_path)
    assert logs.add_run_log(tmp_path) == path  # idempotent
    logging.getLogger("ray.some_module").info("from ray")
    ray_logger.propagate = not propagate  # Ray's own setup stops propagation: written once either way
    logging.getLogger("ray.other").info("from ray again")
    ray_logger.propagate = propagate
    logging.getLogger("pipelines.train").info("from us")
    logs.remove_run_log(tmp_path)
    logging.getLogger("pipelines.train").info("after removal")
    text = path.read_text()
    assert text.count("INFO ray.some_module: from ray\n") == 1 and text.count("from ray again") == 1
    assert "pipelines.train: from us" in text
    assert "after removal" not in text


def test_a_library_s_own_console_handler_shows_only_its_warnings(clean_root, tmp_path):
    """Ray Data attaches its own console handler to a non-propagating `ray.data` logger: without
    --verbose its INFO lines and the notice about our own progress-bar choice stay off the console,
    its warnings stay on it, and its file handler keeps everything."""
    import io

    lib = logging.getLogger("searchrl_test_lib")
    lib.propagate, lib.level = False, logging.DEBUG
    console = logging.StreamHandler(io.StringIO())
    stream = console.stream
    to_file = logging.FileHandler(tmp_path / "lib.log")
    lib.addHandler(console)
    lib.addHandler(to_file)
    try:
        logs.setup_logging(verbose=False)
        logs.quiet_library_console("searchrl_test_lib", drop=("Progress bars disabled",))
        logs.quiet_library_console("searchrl_test_lib", drop=("Progress bars disabled",))  # once per handler
        assert len(console.filters) == 1 and not to_file.filters
        lib.info("Starting execution of Dataset")
        lib.warning("Progress bars disabled. To enable, set ...")
        lib.warning("an actor died")
        assert stream.getvalue() == "an actor died\n"
        to_file.flush()
        assert (tmp_path / "lib.log").read_text().count("\n") == 3

        logs.setup_logging(verbose=True)
        verbose_console = logging.StreamHandler(io.StringIO())
        lib.addHandler(verbose_console)
        logs.quiet_library_console("searchrl_test_lib")
        assert not verbose_console.filters  # --verbose: everything on the console
    finally:
        for h in list(lib.handlers):
            lib.removeHandler(h)
            h.close()
