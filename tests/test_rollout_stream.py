"""pipelines.rollout_stream (train.async_mode: fully) without Ray: futures stand in for the workers' calls."""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import pytest

from pipelines.rollout_stream import Group, RolloutStream, staleness, version_span


def test_version_span_reads_token_and_turn_versions():
    traj = {"weight_version": 3, "token_versions": [3, 3, 4, 4], "loss_mask": [1, 0, 1, 1],
            "turns": [{"weight_version": 3, "weight_version_end": 3}, {"weight_version": 4, "weight_version_end": 5}]}
    assert version_span(traj) == (3, 5)  # the second turn's request saw an in-flight update to 5
    assert version_span({"weight_version": 2, "token_versions": [], "loss_mask": []}) == (2, 2)
    assert version_span({"weight_version": 1, "token_versions": [0, 1], "loss_mask": [0, 1]}) == (1, 1)  # masked out
    assert staleness([traj, {"weight_version": 1}], 6) == [3, 5]


class FakeWorkers:
    """Each call returns `n` trajectories of its group, sampled at the version the workers hold when
    it starts; `delays[key]` seconds late; `fail` keys raise once."""

    def __init__(self, n=2, delays=None, fail=(), stale_first=()):
        self.n, self.delays, self.fail, self.stale_first = n, dict(delays or {}), set(fail), set(stale_first)
        self.version, self.started, self.pool = 0, [], ThreadPoolExecutor(max_workers=16)
        self.lock = threading.Lock()

    def submit(self, worker, group: Group) -> Future:
        with self.lock:
            self.started.append(group.key)
            version = self.version
            if group.key in self.stale_first:  # sampled by old weights the first time
                self.stale_first.discard(group.key)
                version = 0
        fail = group.key in self.fail
        self.fail.discard(group.key)

        def run():
            time.sleep(self.delays.get(group.key, 0.01))
            if fail:
                raise RuntimeError("worker died")
            return [{"group_id": f"g{group.key}", "sample_index": i, "key": group.key, "weight_version": version,
                     "token_versions": [version] * 3, "loss_mask": [1, 1, 1], "turns": []} for i in range(self.n)]

        return self.pool.submit(run)


def _eventually(predicate, timeout_s=20.0):
    """Poll `predicate` until it holds (AssertionError after `timeout_s`): a loaded CI machine may be slow."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _stream(workers, steps=3, per_step=2, max_staleness=1, in_flight=2, **kw):
    groups = [Group((s, j), {"id": f"q{s}{j}"}, {}, s) for s in range(steps) for j in range(per_step)]
    return RolloutStream(groups, workers.submit, ["w0", "w1"], per_step, max_staleness, in_flight,
                         wait=lambda refs, t: list(wait(refs, timeout=t, return_when=FIRST_COMPLETED).done),
                         get=lambda f: f.result(), **kw)


def _train(stream, workers, steps):
    batches = []
    for step in range(steps):
        trajs = stream.take(step, timeout_s=20)
        batches.append(sorted({t["key"] for t in trajs}))
        assert max(staleness(trajs, step)) <= stream.max_staleness
        stream.commit(step)
        workers.version = step + 1
        stream.set_version(step + 1)
    return batches


def test_every_group_trains_exactly_once_in_completion_order():
    workers = FakeWorkers(delays={(0, 0): 1.0})  # a long episode: it must not hold up step 1
    stream = _stream(workers, max_staleness=2)  # (0, 0) ends 1-2 versions behind: within the bound
    try:
        batches = _train(stream, workers, 3)
    finally:
        stream.close()
    assert batches[0] == [(0, 1), (1, 0)]  # (0, 0) was still running; step 1's group finished first
    assert sorted(k for b in batches for k in b) == [(s, j) for s in range(3) for j in range(2)]
    assert stream.committed() == [(s, j) for s in range(3) for j in range(2)]
    assert workers.started.count((0, 0)) == 1  # nothing generated twice


def test_the_staleness_bound_holds_back_starts():
    workers = FakeWorkers()
    stream = _stream(workers, steps=4, max_staleness=1, in_flight=8)
    try:
        _eventually(lambda: len(workers.started) >= 4)  # steps 0 and 1's groups
        time.sleep(0.3)  # time to start more, were any allowed
        assert {k[0] for k in workers.started} == {0, 1}  # version 0: steps 0 and 1 only
        stream.set_version(2)
        _eventually(lambda: {k[0] for k in workers.started} == {0, 1, 2, 3})
        assert stream.take_stats()["async/rollout_idle_s"] > 0  # nothing could start for a while
    finally:
        stream.close()


def test_a_group_past_the_bound_is_dropped_and_generated_again():
    workers = FakeWorkers(stale_first={(2, 0)})
    stream = _stream(workers, max_staleness=1)
    try:
        _train(stream, workers, 2)
        trajs = stream.take(2, timeout_s=20)  # step 3, the learner at version 2: (2, 0)'s first try was 2 behind
        assert {t["key"] for t in trajs} == {(2, 0), (2, 1)} and max(staleness(trajs, 2)) <= 1
        stats = stream.take_stats()
        assert stats["async/requeued"] == 1 and stats["async/dropped"] == 2
        assert workers.started.count((2, 0)) == 2
    finally:
        stream.close()


def test_a_failed_call_is_generated_again_and_reported():
    failed = []
    workers = FakeWorkers(fail={(0, 1)})
    stream = _stream(workers, on_failure=lambda worker, error: failed.append((worker, str(error))))
    try:
        batches = _train(stream, workers, 3)
    finally:
        stream.close()
    assert sorted(k for b in batches for k in b) == [(s, j) for s in range(3) for j in range(2)]
    assert len(failed) == 1 and "worker died" in failed[0][1]


def test_put_back_and_rewind_keep_exactly_once():
    workers = FakeWorkers()
    stream = _stream(workers)
    try:
        first = {t["key"] for t in stream.take(0, timeout_s=20)}
        stream.put_back(0)  # the update failed: the same groups come back
        assert {t["key"] for t in stream.take(0, timeout_s=20)} == first
        stream.commit(0)
        stream.set_version(1)
        stream.take(1, timeout_s=20)
        stream.commit(1)
        stream.rewind(1)  # learners back to after step 1... then back to after step 0
        assert stream.version == 1 and sorted(k for ks in stream.ledger.values() for k in ks) == sorted(first)
        workers.version = 1
        batches = _train_from(stream, workers, 1, 3)
        trained = sorted(first) + sorted(k for b in batches for k in b)
        assert sorted(trained) == [(s, j) for s in range(3) for j in range(2)]
        with pytest.raises(RuntimeError, match="trained twice"):
            stream._taken[5] = stream._taken.get(5, []) + [type("D", (), {"group": Group((0, 0), {}, {}, 0)})()]
            stream.commit(5)
    finally:
        stream.close()


def _train_from(stream, workers, start, end):
    batches = []
    for step in range(start, end):
        trajs = stream.take(step, timeout_s=20)
        batches.append(sorted({t["key"] for t in trajs}))
        stream.commit(step)
        workers.version = step + 1
        stream.set_version(step + 1)
    return batches


def test_take_reports_a_short_sequence_and_a_timeout():
    workers = FakeWorkers(delays={(0, 0): 5.0, (0, 1): 5.0})
    stream = _stream(workers, steps=1)
    try:
        with pytest.raises(TimeoutError, match="got 0 of 2 groups"):
            stream.take(0, timeout_s=0.5)
    finally:
        stream.close()
    with pytest.raises(ValueError, match="max_staleness must be >= 1"):
        _stream(FakeWorkers(), max_staleness=0)


def test_a_failed_worker_gets_no_call_until_take_resyncs_it():
    workers = FakeWorkers(fail={(0, 0)})
    calls = []
    orig = workers.submit
    workers.submit = lambda worker, group: (calls.append(worker), orig(worker, group))[1]
    stream = _stream(workers, steps=3)
    try:
        _eventually(lambda: len(calls) >= 5)  # steps 0-1 and one retry: (0, 0) failed on w0, the rest went to w1
        first_fail = calls.index("w0")
        assert "w0" not in calls[first_fail + 1:]
        resynced = []
        stream.take(0, timeout_s=20, resync=resynced.append)
        assert resynced == ["w0"]
    finally:
        stream.close()
