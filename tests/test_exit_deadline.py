"""A stop signal ends a process in bounded time (`cluster.exit_deadline`): the watchdog's deadline,
its exit status and the children it kills; and a real `scripts.serve_retrieval` whose raylet was
SIGKILLed under it (its cleanup would otherwise retry Serve's shutdown for ever) exits after SIGTERM
within the deadline, leaving none of its processes behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cluster.exit_deadline import ENV, stop_timeout_s
from cluster.local_cluster import free_ports

REPO = Path(__file__).resolve().parents[1]


def test_stop_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert stop_timeout_s(60) == 60.0
    monkeypatch.setenv(ENV, "7.5")
    assert stop_timeout_s(60) == 7.5
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"{ENV}=.*positive number of seconds"):
            stop_timeout_s(60)


HANGS_IN_CLEANUP = """
import signal, subprocess, sys, time
from scripts.cli import sigterm_as_interrupt
signal.signal(signal.SIGTERM, sigterm_as_interrupt)
child = subprocess.Popen(["sleep", "300"])
try:
    print(child.pid, flush=True)  # inside the try: the test signals as soon as it reads this line
    time.sleep(300)
except KeyboardInterrupt:
    print("cleaning up", flush=True)
    time.sleep(300)  # a cleanup that never returns, like Serve's shutdown against a dead raylet
"""


def test_sigterm_with_a_stuck_cleanup_exits_at_the_deadline_and_kills_its_children():
    env = {**os.environ, ENV: "2"}
    proc = subprocess.Popen([sys.executable, "-c", HANGS_IN_CLEANUP], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        child = int(proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        status = proc.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert status == 128 + signal.SIGTERM, err
    assert 1.5 < took < 15, took
    assert "cleaning up" in proc.stdout.read()
    assert "still running 2 s after SIGTERM" in err and 'File "<string>", line 11' in err  # where it hung
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.slow
def test_serve_retrieval_stops_on_sigterm_after_its_raylet_died(small_index, tmp_path):
    (port,) = free_ports(1)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_SERVICE")} | {ENV: "20"}
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "scripts.serve_retrieval", f"index.dir={small_index}",
                                 f"serve.port={port}", "retrieval.query_encoders=1"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while "retrieval server:" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        started = _descendants(proc.pid)
        raylets = [p for p in started if p.name() == "raylet"]
        assert raylets, [p.name() for p in started]
        for p in raylets:
            p.kill()
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        status = proc.wait(timeout=90)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert took < 20 + 15, (took, text[-3000:])
    assert status in (0, 128 + signal.SIGTERM), text[-3000:]
    time.sleep(2)
    alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.name()) for p in alive]
    print(f"serve_retrieval exited {status} {took:.1f} s after SIGTERM (raylet killed)")
