"""`ActorSet`: start with resources, wait for ready with a deadline, shut down then kill."""

from __future__ import annotations

import time

import pytest

from actors.lifecycle import ActorSet


class _Recorder:
    """Writes "shutdown" to a file when shut down; `ready` sleeps `delay_s` seconds."""

    def __init__(self, path: str, delay_s: float = 0.0):
        self.path, self.delay_s = path, delay_s

    def ready(self) -> bool:
        time.sleep(self.delay_s)
        return True

    def shutdown(self) -> None:
        with open(self.path, "a") as f:
            f.write("shutdown\n")


class _NoShutdown:
    def ready(self) -> int:
        return 1


def _assert_dies(ray, handle, timeout_s: float = 60.0) -> None:
    """`ray.kill` is asynchronous: a call sent right after it may still run, so poll until one fails."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(handle.ready.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.2)
    pytest.fail(f"{handle} still answers {timeout_s:.0f} s after it was killed")


def test_start_ready_stop(ray_local, tmp_path):
    actors = ActorSet()
    a = actors.start(_Recorder, str(tmp_path / "a"), num_cpus=0.1, max_concurrency=None)
    b = actors.start(_Recorder, str(tmp_path / "b"), num_cpus=0.1, max_concurrency=None)
    c = actors.adopt(ray_local.remote(num_cpus=0.1)(_NoShutdown).remote())  # started elsewhere, owned here
    assert ActorSet.wait_ready([a, b, c], timeout_s=120) == [True, True, 1]
    assert actors.handles == [a, b, c]  # each owned once
    actors.stop([a])
    assert (tmp_path / "a").read_text() == "shutdown\n" and not (tmp_path / "b").exists()
    _assert_dies(ray_local, a)  # killed after its shutdown
    actors.stop()  # the rest: shutdown where the class has one, then kill
    assert (tmp_path / "b").read_text() == "shutdown\n" and actors.handles == []
    _assert_dies(ray_local, c)


def test_wait_ready_has_a_deadline(ray_local, tmp_path):
    actors = ActorSet()
    slow = actors.start(_Recorder, str(tmp_path / "slow"), 30.0, num_cpus=0.1, max_concurrency=None)
    try:
        with pytest.raises(TimeoutError, match="the slow actor not ready after 1 s"):
            ActorSet.wait_ready([slow], timeout_s=1, what="the slow actor")
    finally:
        actors.stop(timeout_s=5)


def test_remote_waits_have_a_deadline_naming_the_work(ray_local, tmp_path):
    from actors.lifecycle import RemoteTimeoutError, get_within

    actors = ActorSet()
    slow = actors.start(_Recorder, str(tmp_path / "slow"), 30.0, num_cpus=0.1, max_concurrency=None)
    try:
        with pytest.raises(RemoteTimeoutError, match=r"rollout workers: 4 episodes: no result after 1 s"):
            get_within([slow.ready.remote()], 1.0, "rollout workers: 4 episodes")
        fast = actors.start(_NoShutdown, num_cpus=0.1)
        assert get_within(fast.ready.remote(), 60.0, "fast") == 1
    finally:
        actors.stop(timeout_s=5)


_SIGNAL_CHILD = """
import signal, sys, time
import ray
from actors.lifecycle import get_within

class Stop(Exception):
    pass

def handler(signum, frame):
    raise Stop

@ray.remote(num_cpus=0.1)
class Slow:
    def ready(self):
        time.sleep(60)
        return True

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    slow = Slow.remote()
    signal.signal(signal.SIGALRM, handler)
    signal.alarm(2)
    t0 = time.monotonic()
    try:
        get_within(slow.ready.remote(), None, "the slow actor")
        print("NOT STOPPED")
    except Exception as raised:  # Ray's Cython wait may wrap it: SystemError caused by Stop
        chain, error = [], raised
        while error is not None and len(chain) < 8:
            chain, error = [*chain, error], error.__cause__ or error.__context__
        print("STOPPED", any(isinstance(e, Stop) for e in chain), round(time.monotonic() - t0, 1))
finally:
    ray.shutdown()
"""


@pytest.mark.slow
def test_a_signal_handler_runs_while_a_call_without_deadline_waits():
    """`get_within(..., None)` (the learner update's wait) returns to Python between short waits, so a handler's
    exception (graceful_stop's second signal: stop now) ends the wait at once instead of after the remote call.
    In a child process: a handler raising inside Ray's Cython wait leaves that process's Ray core worker unfit
    for further use (the suite's shared cluster segfaulted a later test); the real stop exits after it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", _SIGNAL_CHILD], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("STOPPED", "NOT STOPPED"))]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    verdict, caused_by_stop, seconds = lines[-1].split()
    assert verdict == "STOPPED" and caused_by_stop == "True", lines
    assert float(seconds) < 20  # not the call's 60 s


class _Restarting:
    """A handle whose `ready` call Ray refuses `refusals` times (the actor is restarting), then answers."""

    def __init__(self, refusals: int):
        self.refusals, self.calls = refusals, 0
        outer = self

        class _Ready:
            @staticmethod
            def remote():
                outer.calls += 1
                return outer, outer.calls

        self.ready = _Ready()


def test_wait_restarted_asks_again_while_ray_restarts_the_actor(monkeypatch):
    from ray.exceptions import ActorUnavailableError

    import actors.lifecycle as lifecycle

    handle = _Restarting(refusals=2)

    def fake_get_within(ref, timeout_s, what):
        actor, call = ref
        if call <= actor.refusals:
            raise ActorUnavailableError("The actor is restarting", None)
        return "up"

    monkeypatch.setattr(lifecycle, "get_within", fake_get_within)
    assert lifecycle.wait_restarted(handle, 10.0, "worker", poll_s=0.01) == "up" and handle.calls == 3
    never = _Restarting(refusals=10**9)
    with pytest.raises(lifecycle.RemoteTimeoutError, match="worker: not ready after"):
        lifecycle.wait_restarted(never, 0.05, "worker", poll_s=0.01)


class _Lives:
    """Answers whether its process is one Ray restarted (asked in __init__, as `RolloutWorker` does)."""

    def __init__(self):
        from actors.lifecycle import restarted_by_ray

        self.restarted = restarted_by_ray()

    def ready(self) -> bool:
        return self.restarted


def test_a_restarted_actor_knows_it_and_the_driver_is_no_actor(ray_local):
    import ray

    from actors.lifecycle import restarted_by_ray

    assert restarted_by_ray() is False  # the driver: no actor
    actor = ray.remote(max_restarts=1, num_cpus=0)(_Lives).remote()
    assert ray.get(actor.ready.remote(), timeout=60) is False  # its first life
    ray.kill(actor, no_restart=False)
    deadline, answer = time.monotonic() + 60, None
    while answer is not True and time.monotonic() < deadline:
        try:
            answer = ray.get(actor.ready.remote(), timeout=60)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            time.sleep(0.2)  # killed or restarting
    assert answer is True
    ray.kill(actor)
