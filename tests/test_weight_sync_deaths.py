"""A weight sync survives a rollout worker that dies while it loads the weights
(`actors.learner.group.load_weights_into`): Ray restarts the worker, the weights are sent again, and
the run goes on (a long run once ended here when Ray's memory monitor killed the worker). Ray's
`OutOfMemoryError` counts as a death there and in a rollout batch (`pipelines.rollout_dispatch`), and
`actors.lifecycle.wait_restarted` asks an actor that answers with it again for a bounded time.
Real Ray actors; a death is `os._exit` (no cleanup runs)."""

from __future__ import annotations

import pytest

from actors.learner.group import load_weights_into
from pipelines.rollout_dispatch import run_parts


class LoadingWorker:
    """A rollout worker's weight-loading surface. `fail`: "exit" = its process exits on the first
    `update_weights` of the test (a marker file keeps the restarted one alive), "always_exit" = on
    every call, "oom" = the first call raises Ray's OutOfMemoryError (what the caller sees when Ray's
    memory monitor killed it) and so does the first `ready()` after it (seen while Ray restarted such a worker),
    "always_oom" = every `ready()` raises it, "never"."""

    def __init__(self, fail: str, marker: str):
        self.fail, self.marker = fail, marker
        self.version = 0

    def _first_call(self, suffix: str = "") -> bool:
        import os

        first = not os.path.exists(self.marker + suffix)
        open(self.marker + suffix, "a").close()
        return first

    def update_weights(self, weights, version: int) -> int:
        import os

        from ray.exceptions import OutOfMemoryError

        if self.fail == "always_exit" or (self.fail == "exit" and self._first_call()):
            os._exit(1)
        if self.fail == "oom" and self._first_call():
            raise OutOfMemoryError("1 worker(s) were killed due to the node running low on memory")
        assert weights == {"w": 1.0}  # the ObjectRef arrives resolved
        self.version = version
        return version

    def run(self, part):
        if self.fail == "oom" and self._first_call():
            from ray.exceptions import OutOfMemoryError

            raise OutOfMemoryError("1 worker(s) were killed due to the node running low on memory")
        return [(self.version, item) for item in part]

    def ready(self) -> int:
        from ray.exceptions import OutOfMemoryError

        if self.fail == "always_oom" or (self.fail == "oom" and self._first_call(".ready")):
            raise OutOfMemoryError("1 worker(s) were killed due to the node running low on memory")
        return self.version


@pytest.mark.slow
@pytest.mark.parametrize("fail", ["exit", "oom"])
def test_a_worker_that_dies_while_loading_is_sent_the_weights_again(ray_local, tmp_path, fail):
    cls = ray_local.remote(max_restarts=1)(LoadingWorker)
    workers = [cls.remote("never", str(tmp_path / "a")), cls.remote(fail, str(tmp_path / "b"))]
    versions, restarts = load_weights_into(workers, ray_local.put({"w": 1.0}), 5, timeout_s=120)
    assert versions == [5, 5] and restarts == 1
    assert ray_local.get([w.ready.remote() for w in workers]) == [5, 5]  # the restarted one holds version 5


@pytest.mark.slow
def test_a_worker_that_keeps_dying_while_loading_raises_after_max_attempts(ray_local, tmp_path):
    from ray.exceptions import RayActorError

    worker = ray_local.remote(max_restarts=-1)(LoadingWorker).remote("always_exit", str(tmp_path / "a"))
    with pytest.raises(RayActorError):
        load_weights_into([worker], ray_local.put({"w": 1.0}), 5, timeout_s=120, max_attempts=2)


@pytest.mark.slow
def test_waiting_for_an_oom_killed_actor_gives_up_after_oom_wait_s(ray_local, tmp_path):
    import time

    from ray.exceptions import OutOfMemoryError

    from actors.lifecycle import ActorNotRestartedError, wait_restarted

    worker = ray_local.remote(LoadingWorker).remote("always_oom", str(tmp_path / "a"))
    t0 = time.monotonic()
    with pytest.raises(ActorNotRestartedError, match="ray.max_restarts") as info:
        wait_restarted(worker, 120, "test worker", poll_s=0.2, oom_wait_s=2.0)
    assert 2.0 <= time.monotonic() - t0 < 30  # bounded by oom_wait_s, not by the 120 s deadline
    assert isinstance(info.value.__cause__, OutOfMemoryError) and "test worker" in str(info.value)


@pytest.mark.slow
def test_an_oom_killed_rollout_part_is_rerun(ray_local, tmp_path):
    worker = ray_local.remote(max_restarts=1)(LoadingWorker).remote("oom", str(tmp_path / "a"))
    results, faults = run_parts([worker], [[1, 2]], lambda w, p: w.run.remote(p), 120, "test rollouts",
                                resync=lambda w: None)
    assert results == [[(0, 1), (0, 2)]] and faults["rollout_worker_deaths"] == 1
