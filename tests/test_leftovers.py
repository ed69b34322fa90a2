"""Processes a local Ray cluster leaves behind are found by its marker and killed, and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from cluster import leftovers
from cluster.leftovers import MARKER, kill_leftovers, mark

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
# Starts a sleeper in its own session and exits: the sleeper is re-parented, as a vLLM engine core is
# when Ray kills the worker that started it.
ORPHANER = [sys.executable, "-c",
            f"import subprocess; p = subprocess.Popen({SLEEPER!r}, start_new_session=True, stdout=subprocess.DEVNULL, "
            f"stderr=subprocess.DEVNULL); print(p.pid)"]


def _orphan(env: dict) -> int:
    return int(subprocess.run(ORPHANER, env=env, capture_output=True, text=True, check=True).stdout)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_marked_orphans_are_killed_and_nothing_else(monkeypatch):
    monkeypatch.delenv(MARKER, raising=False)
    assert leftovers.leftovers() == []  # unmarked program: nothing is ours
    marker = mark()
    monkeypatch.setenv(MARKER, marker)  # restored after the test
    orphan = _orphan(dict(os.environ))
    stranger = _orphan({k: v for k, v in os.environ.items() if k != MARKER})
    other = _orphan({**os.environ, MARKER: "another-cluster"})
    child = subprocess.Popen(SLEEPER)  # still this program's: its owner stops it
    try:
        assert [p.pid for p in leftovers.leftovers()] == [orphan]
        assert kill_leftovers(grace_s=0.5) == [orphan]
        assert _gone(orphan)
        assert not any(_gone(pid) for pid in (stranger, other, child.pid))
    finally:
        for pid in (orphan, stranger, other, child.pid):
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        child.wait(timeout=10)


@pytest.mark.slow
def test_local_ray_shutdown_kills_what_an_actor_left(monkeypatch):
    """A process an actor started in its own session (as a vLLM engine core can outlive its worker)
    survives `ray.shutdown`; the shutdown of the program's own local cluster kills it."""
    import ray

    from cluster.ray_init import init_ray, shutdown_local_ray
    from configs.schema import RayConfig

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(MARKER, raising=False)

    @ray.remote(num_cpus=0)
    def start_detached() -> int:
        return _orphan(dict(os.environ))

    assert init_ray(RayConfig(num_cpus=1))
    try:
        pid = ray.get(start_detached.remote(), timeout=120)
        assert psutil.Process(pid).environ().get(MARKER) == os.environ[MARKER]
        ray.shutdown()
        time.sleep(2)
        assert not _gone(pid)  # Ray's own shutdown left it running
    finally:
        killed = shutdown_local_ray(grace_s=1.0)
    assert pid in killed and _gone(pid)
    assert MARKER not in os.environ
