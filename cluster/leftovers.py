"""Processes a local Ray cluster leaves behind, found by a marker and ended when the program exits.

A vLLM engine runs in its own processes (`VLLM::EngineCore`, `VLLM::Worker`). When Ray stops the
actor that owns one (`serve.shutdown`, `ray.shutdown`, a killed replica), those processes are
re-parented to init and live on: twice `scripts.serve` stopped cleanly and left 1 GB + 3 GB of them,
and the next training run was killed by Ray's memory monitor. So a program that starts its own
local cluster marks it: `mark()` puts a unique value in this process's environment before Ray
starts, every process the cluster spawns inherits it, and `kill_leftovers()` ends the marked ones
that are no longer this program's descendants. Another Ray cluster's processes never carry the
marker, so they are never touched.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from typing import Any

MARKER = "SEARCHRL_LOCAL_RAY"
EXEC_WAIT_S = 0.5  # how long a process with an empty environment (mid-exec) is read again


def mark() -> str:
    """Set a new marker in this process's environment (inherited by what it starts); returns it."""
    os.environ[MARKER] = f"{os.getpid()}-{secrets.token_hex(6)}"
    return os.environ[MARKER]


def leftovers(marker: str | None = None, descendants: bool = False) -> list:
    """Running processes (`psutil.Process`) that carry `marker` (default: this process's own) and are
    neither this process nor (unless `descendants`) one of its descendants: orphans of the cluster it
    started, or with `descendants` every process of it. [] unmarked.

    A process in the middle of `exec` reads as having no environment (`/proc/<pid>/environ` is empty
    until the new image's is set up, after the parent already saw the exec succeed: 1 read in 300 right
    after `Popen` here); such a process is read again for up to `EXEC_WAIT_S` seconds."""
    import psutil

    marker = marker or os.environ.get(MARKER)
    if not marker:
        return []
    me = psutil.Process()
    own = {me.pid} if descendants else {me.pid, *(p.pid for p in me.children(recursive=True))}
    return _marked([p for p in psutil.process_iter() if p.pid not in own], lambda p, found: found == marker)


def _marked(processes: list, keep: Callable[[Any, str | None], bool]) -> list:
    """The live processes of `processes` for which `keep(process, its MARKER value or None)` holds. A
    process with an empty environment (mid-`exec`, see `leftovers`) is read again for up to `EXEC_WAIT_S`
    seconds; zombies, vanished processes and other users' processes are left out."""
    import psutil

    out, pending = [], list(processes)
    deadline = time.monotonic() + EXEC_WAIT_S
    while pending:
        mid_exec = []
        for p in pending:
            try:
                env = p.environ()
                if not env:
                    mid_exec.append(p)
                elif keep(p, env.get(MARKER)) and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not mid_exec or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
        pending = mid_exec
    return out


def owner_pid(marker: str) -> int | None:
    """The pid of the program that set `marker` (`mark()` writes `<pid>-<random hex>`); None when the
    value is not of that form."""
    head, sep, _ = marker.partition("-")
    return int(head) if sep and head.isdigit() else None


def orphans_of_dead_programs() -> list:
    """Running processes (`psutil.Process`) that carry some program's marker whose owner (`owner_pid`)
    no longer runs: what a local cluster left behind when its program died without its cleanup. A
    reused owner pid reads as alive (its processes are kept); other users' processes and processes
    without a marker are never returned."""
    import psutil

    def owner_gone(p: Any, marker: str | None) -> bool:
        pid = owner_pid(marker) if marker else None
        return pid is not None and pid != p.pid and not psutil.pid_exists(pid)

    return _marked(list(psutil.process_iter()), owner_gone)


def kill_processes(processes: list, timeout_s: float = 5.0) -> None:
    """SIGKILL each `psutil.Process` still running and wait up to `timeout_s` for them to go."""
    import psutil

    for p in processes:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(processes, timeout=timeout_s)


def kill_leftovers(grace_s: float = 5.0, marker: str | None = None) -> list[int]:
    """Wait up to `grace_s` seconds for the marked orphans to exit on their own, then SIGKILL the
    rest. Returns the pids killed."""
    deadline = time.monotonic() + grace_s
    while (alive := leftovers(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    kill_processes(alive)
    return [p.pid for p in alive]
