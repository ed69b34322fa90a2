"""`cluster.torch_extensions`: a build lock a killed DeepSpeed build left is removed, a fresh one (a build running
now) is kept, and a direct `python -m` run builds into its own .venv unless the environment names a directory."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from cluster.torch_extensions import clear_stale_build_locks, default_extensions_dir


def _lock(root: Path, name: str, age_s: float, tag: str = "py311_cpu") -> Path:
    lock = root / tag / name / "lock" if tag else root / name / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_a_stale_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    stale = _lock(tmp_path, "deepspeed_shm_comm", age_s=3600)
    fresh = _lock(tmp_path, "cpu_adam", age_s=5)
    assert clear_stale_build_locks(tmp_path) == [stale]
    assert not stale.exists() and fresh.exists()
    assert (stale.parent).is_dir()  # the build's other files stay: torch rebuilds only what is missing


def test_the_root_comes_from_the_environment(tmp_path, monkeypatch):
    """With TORCH_EXTENSIONS_DIR set, torch builds into <dir>/<op> (no python/cpu tag level)."""
    stale = _lock(tmp_path, "deepspeed_shm_comm", age_s=3600, tag="")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert clear_stale_build_locks() == [stale]
    assert clear_stale_build_locks(tmp_path / "missing") == []


def test_the_default_directory_is_the_venvs_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    default_extensions_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(Path(sys.prefix) / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    default_extensions_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)
