"""A stop signal ends the process in bounded time, even when its Ray cluster no longer answers.

Cleanup after SIGTERM (stopping Serve, actors, `ray.shutdown`) talks to Ray; when the raylet or GCS
has died, Ray retries those calls for ever (`ServeController.graceful_shutdown` against a dead
actor), and a process that cannot stop breaks every process manager (systemd, Kubernetes, `ray
stop`). So the first stop signal also arms a watchdog thread: if the process is still running
`SEARCHRL_STOP_TIMEOUT_S` seconds later, it prints where the main thread is stuck, kills the
processes this one started (its own children, nothing else) and exits with status 128 + signal.
A thread, not a signal handler: Python runs handlers only between bytecodes of the main thread,
which a blocking call into Ray's C++ core may never reach.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading

ENV = "SEARCHRL_STOP_TIMEOUT_S"
_lock = threading.Lock()
_armed: threading.Timer | None = None


def stop_timeout_s(default: float) -> float:
    """Seconds a stop may take: `SEARCHRL_STOP_TIMEOUT_S` when set, else `default`.

    Raises:
        ValueError: the variable is not a positive number (names it and the fix).
    """
    value = os.environ.get(ENV, "").strip()
    if not value:
        return float(default)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"{ENV}={value!r}: must be a positive number of seconds, e.g. {ENV}=60")
    return seconds


def arm(seconds: float, status: int, why: str) -> bool:
    """Start the watchdog: after `seconds`, dump every thread's stack to stderr, kill this process's
    child processes and `os._exit(status)`. Only the first call arms it (a second signal does not
    extend the deadline). Returns True when this call armed it."""
    global _armed
    with _lock:
        if _armed is not None:
            return False
        timer = threading.Timer(seconds, _expire, args=(seconds, status, why))
        timer.daemon = True  # never keeps a process alive that finished its cleanup
        timer.name = "searchrl-exit-deadline"
        timer.start()
        _armed = timer
        return True


def disarm() -> None:
    """Cancel an armed watchdog (a caller that recovered; tests)."""
    global _armed
    with _lock:
        if _armed is not None:
            _armed.cancel()
        _armed = None


def kill_children() -> list[int]:
    """SIGKILL every descendant process of this one (engines, a local Ray cluster's processes);
    returns their pids."""
    import psutil

    from cluster.leftovers import kill_processes

    children = psutil.Process().children(recursive=True)
    kill_processes(children)
    return [p.pid for p in children]


def _expire(seconds: float, status: int, why: str) -> None:
    try:
        print(f"error: still running {seconds:.0f} s after {why}: the cleanup is stuck (a Ray cluster that no "
              f"longer answers?). Killing the processes this one started and exiting with status {status} "
              f"({ENV} sets the deadline). Where each thread was:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        kill_children()
        from cluster.leftovers import kill_leftovers

        kill_leftovers(grace_s=0)  # engines a killed Ray worker left re-parented to init
    finally:
        os._exit(status)
