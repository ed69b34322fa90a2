"""Fully asynchronous rollouts (`train.async_mode: fully`): the workers generate continuously while the
learner updates, and each step trains on the groups that finished first within the staleness bound.

The run's questions form one fixed sequence of groups, a group being one question's
`samples_per_prompt` episodes (what GRPO normalizes over): step s's questions (`batch_indices`) under
step s's stage options, in step order. `RolloutStream` keeps up to `in_flight` groups generating (one
`RolloutWorker.run` call each), starting a group of step s only once the learner has reached version
s − `max_staleness`. New weights go to the workers while groups are in flight: the engine loads them
between its steps and the rest of each running episode samples from them (a partial rollout, its
tokens tagged with both versions: `Trajectory.token_versions`).

`take(version)` returns the first `questions_per_step` groups to finish (completion order: a long
episode no longer holds up a step) whose oldest token is at most `max_staleness` versions behind the
learner's `version`; a group older than that is dropped and generated again (counted: `requeued`
groups, `dropped` episodes). A taken batch is `commit`ted after its update, or `put_back` when the
update failed; `rewind(step)` puts back everything committed from `step` on (the learners went back to
an older snapshot or checkpoint), so every (question, sample) trains exactly once in the run's lineage.

What a stop keeps: a checkpoint saves the committed groups (`ledger`), not the episodes in flight or
finished but untaken; a resumed run generates those again, on the checkpoint's weights. The set of
groups is the same as without the stop; the order in which they reach a step is completion order,
with or without one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


def version_span(traj: dict[str, Any]) -> tuple[int, int]:
    """(oldest, newest) policy version of an episode's policy tokens: the oldest from `token_versions`
    (each token's version when its turn's request started), the newest also from turns whose weights
    changed in flight (`weight_version_end`). An episode with no policy token spans its start version."""
    start = int(traj.get("weight_version") or 0)
    versions = [int(v) for v, m in zip(traj.get("token_versions") or [], traj.get("loss_mask") or []) if m]
    ends = [int(t.get("weight_version_end", t.get("weight_version", start))) for t in traj.get("turns") or []
            if isinstance(t, dict)]
    oldest = min(versions, default=start)
    return oldest, max([*versions, *ends, oldest])


def staleness(trajs: Sequence[dict[str, Any]], learner_version: int) -> list[int]:
    """Policy versions between each episode's oldest token and the learner's `learner_version`."""
    return [learner_version - version_span(t)[0] for t in trajs]


@dataclass(frozen=True)
class Group:
    """One question's episodes to generate: `key` = (0-based step it was scheduled for, index in the
    step), the example, the step's recipe options and sampling seed."""

    key: tuple[int, int]
    example: dict[str, Any]
    options: dict[str, Any]
    seed: int


@dataclass
class StreamStats:
    """Counters since the last `take_stats()`: groups generated again for staleness or a failed call,
    episodes dropped, failed calls, seconds the learner waited in `take`, and seconds the workers had
    nothing to generate (the staleness bound held them back, or the sequence ran out)."""

    requeued: int = 0
    dropped: int = 0
    failed_calls: int = 0
    learner_idle_s: float = 0.0
    rollout_idle_s: float = 0.0


@dataclass
class _Done:
    group: Group
    trajs: list[dict[str, Any]]


class RolloutStream:
    """Continuous generation of a fixed sequence of groups on the rollout workers (see the module docstring).

    Args:
        groups: the run's groups in sequence order (`Group`).
        submit: `submit(worker, group)` → a Ray ObjectRef of the group's trajectories (a `run` call).
        workers: rollout worker handles; calls go round-robin to the one with the fewest in flight.
        questions_per_step: groups per taken batch.
        max_staleness: largest learner version − oldest token version a batch may hold (>= 1).
        in_flight: groups generating at once (the engines batch their episodes).
        learner_version: the learner's version at the start (the resume step).
        committed: group keys already trained (a resume), never generated again.
        on_failure: `on_failure(worker, error)` after a failed call (the group is generated again); the
            worker gets no call until `take`'s `resync(worker)` has run in the learner's thread.
        wait, get: `wait(refs, timeout_s)` → the refs done, `get(ref)` → its result (raising its error);
            Ray's `ray.wait` / `ray.get` when None (tests pass futures).
        check: `check(group, trajs)` → the trajectories to keep; raising counts as a failed call.
    """

    def __init__(self, groups: Sequence[Group], submit: Callable[[Any, Group], Any], workers: Sequence[Any],
                 questions_per_step: int, max_staleness: int, in_flight: int, learner_version: int = 0,
                 committed: Sequence[tuple[int, int]] = (), on_failure: Callable[[Any, Exception], None] | None = None,
                 wait: Callable[[list, float], list] | None = None, get: Callable[[Any], Any] | None = None,
                 check: Callable[[Group, list], list] | None = None):
        if max_staleness < 1:
            raise ValueError(f"train.max_staleness must be >= 1 in fully async mode, got {max_staleness}")
        skip = {tuple(k) for k in committed}
        self._by_key = {g.key: g for g in groups}
        self._todo = [g for g in groups if g.key not in skip]  # front = next to start
        self._submit, self._workers = submit, list(workers)
        self.questions_per_step, self.max_staleness = questions_per_step, max_staleness
        self.in_flight = max(1, in_flight)
        self.version = learner_version
        self.ledger: dict[int, list[tuple[int, int]]] = {}  # step -> keys trained in it (this run's lineage)
        self._running: dict[Any, tuple[Group, Any, int]] = {}  # ObjectRef -> (group, worker, epoch)
        self._paused: list[Any] = []  # workers whose call failed: no calls until resynced
        self._epoch = 0  # +1 at each rewind: what older weights of a discarded lineage sampled is generated again
        self._done: list[_Done] = []
        self._taken: dict[int, list[_Done]] = {}
        self._on_failure = on_failure
        if wait is None or get is None:
            import ray

            wait = wait or (lambda refs, timeout_s: ray.wait(refs, num_returns=1, timeout=timeout_s)[0])
            get = get or ray.get
        self._wait, self._get = wait, get
        self._check = check or (lambda group, trajs: trajs)
        self.stats = StreamStats()
        self._cv = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="rollout-stream", daemon=True)
        self._thread.start()

    # -- the learner's side ---------------------------------------------------------------------------
    def set_version(self, version: int) -> None:
        """The learner (and, after the sync, the workers) now hold `version`: later groups may start."""
        with self._cv:
            self.version = version
            self._cv.notify_all()

    def take(self, step: int, timeout_s: float | None = None,
             resync: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
        """The trajectories of the first `questions_per_step` groups to finish within the staleness
        bound for 0-based `step` (the learner at version `step`), waiting for them. While it waits,
        `resync(worker)` gives each worker whose call failed the current weights (in this thread: the
        learners take one caller at a time), and the worker gets calls again.

        Raises:
            TimeoutError: not enough groups within `timeout_s` seconds.
            RuntimeError: the sequence ran out before a full batch, or the stream's thread failed.
        """
        t = time.monotonic()
        with self._cv:
            while True:
                if self._error is not None:
                    raise RuntimeError(f"rollout stream failed: {self._error!r}") from self._error
                if self._paused and resync is not None:
                    paused, self._paused = self._paused, []
                    self._cv.release()
                    try:
                        for worker in paused:
                            resync(worker)
                    finally:
                        self._cv.acquire()
                    self._cv.notify_all()
                self._drop_stale(step)
                if len(self._done) >= self.questions_per_step:
                    break
                if not self._todo and not self._running:
                    raise RuntimeError(f"rollout stream: {len(self._done)} groups left for step {step + 1}, "
                                       f"{self.questions_per_step} needed")
                left = None if timeout_s is None else timeout_s - (time.monotonic() - t)
                if left is not None and left <= 0:
                    raise TimeoutError(f"rollout stream: step {step + 1} got {len(self._done)} of "
                                       f"{self.questions_per_step} groups within {timeout_s:.0f} s")
                self._cv.wait(timeout=1.0 if left is None else min(left, 1.0))
            batch, self._done = self._done[: self.questions_per_step], self._done[self.questions_per_step:]
            self._taken[step] = batch
            self.stats.learner_idle_s += time.monotonic() - t
        return [traj for done in batch for traj in done.trajs]

    def commit(self, step: int) -> None:
        """Step `step`'s update went through: its groups are trained.

        Raises:
            RuntimeError: a group was trained before (exactly once is broken).
        """
        with self._cv:
            keys = [d.group.key for d in self._taken.pop(step, [])]
            trained = {k for ks in self.ledger.values() for k in ks}
            twice = sorted(set(keys) & trained) + sorted(k for k in set(keys) if keys.count(k) > 1)
            if twice:
                raise RuntimeError(f"rollout stream: groups trained twice in step {step + 1}: {twice}")
            self.ledger[step] = keys

    def put_back(self, step: int) -> None:
        """Step `step`'s update failed: its groups go back to the front of the finished ones."""
        with self._cv:
            self._done[:0] = self._taken.pop(step, [])
            self._cv.notify_all()

    def rewind(self, step: int) -> None:
        """The learners went back to `step` completed steps: the groups committed in steps >= `step`
        (their updates are gone), and every group finished or in flight (sampled by weights of the
        discarded lineage, or soon stale), are generated again, first; the learner version is `step` again."""
        with self._cv:
            again = [k for s in sorted(self.ledger) if s >= step for k in self.ledger.pop(s)]
            for s in [s for s in self._taken if s >= step]:
                again += [d.group.key for d in self._taken.pop(s)]
            again += [d.group.key for d in self._done] + [g.key for g, _, _ in self._running.values()]
            self._done = []
            self._epoch += 1  # results of the calls in flight are dropped on arrival
            self._todo[:0] = [self._by_key[k] for k in sorted(set(again))]
            self.version = step
            self._cv.notify_all()

    def committed(self) -> list[tuple[int, int]]:
        """Keys of every group trained so far (what a checkpoint saves)."""
        with self._cv:
            return sorted(k for keys in self.ledger.values() for k in keys)

    def take_stats(self) -> dict[str, float]:
        """`async/*` counters since the last call (see `StreamStats`)."""
        with self._cv:
            s, self.stats = self.stats, StreamStats()
        return {"async/requeued": float(s.requeued), "async/dropped": float(s.dropped),
                "async/failed_calls": float(s.failed_calls), "async/learner_idle_s": s.learner_idle_s,
                "async/rollout_idle_s": s.rollout_idle_s}

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop starting groups and end the thread (calls in flight are left to their workers)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout_s)

    # -- the stream's thread --------------------------------------------------------------------------
    def _drop_stale(self, step: int) -> None:
        """Finished groups whose oldest token is more than `max_staleness` behind version `step` go back
        to the front of the queue (caller holds the lock)."""
        keep = []
        for done in self._done:
            if max(staleness(done.trajs, step), default=0) > self.max_staleness:
                self.stats.requeued += 1
                self.stats.dropped += len(done.trajs)
                self._todo.insert(0, done.group)
            else:
                keep.append(done)
        self._done = keep

    def _startable(self) -> Group | None:
        """The next group the staleness bound lets start (caller holds the lock)."""
        if self._todo and self._todo[0].key[0] <= self.version + self.max_staleness:
            return self._todo.pop(0)
        return None

    def _loop(self) -> None:
        idle_since: float | None = None
        try:
            while True:
                with self._cv:
                    if self._stop:
                        return
                    ready_workers = [w for w in self._workers if all(w is not p for p in self._paused)]
                    while (ready_workers and len(self._running) < self.in_flight
                           and (group := self._startable()) is not None):
                        worker = min(ready_workers, key=lambda w: sum(1 for _, v, _ in self._running.values() if v is w))
                        self._running[self._submit(worker, group)] = (group, worker, self._epoch)
                    if not self._running and idle_since is None:
                        idle_since = time.monotonic()
                    elif self._running and idle_since is not None:
                        self.stats.rollout_idle_s += time.monotonic() - idle_since
                        idle_since = None
                    refs = list(self._running)
                if not refs:
                    with self._cv:
                        self._cv.wait(timeout=0.5)
                    continue
                ready = self._wait(refs, 0.5)
                for ref in ready:
                    with self._cv:
                        group, worker, epoch = self._running.pop(ref, (None, None, None))
                    if group is None or epoch != self._epoch:  # dropped by a rewind (already queued again)
                        continue
                    try:
                        trajs = self._check(group, self._get(ref))
                    except Exception as e:  # noqa: BLE001 - a dead worker or a failed episode: generate it again
                        log.warning("rollout stream: group %s failed on a worker (%s); generating it again",
                                    group.key, type(e).__name__)
                        with self._cv:
                            self.stats.failed_calls += 1
                            self.stats.requeued += 1
                            self._todo.insert(0, group)
                            if all(worker is not p for p in self._paused):
                                self._paused.append(worker)
                        if self._on_failure is not None:
                            self._on_failure(worker, e)
                        continue
                    with self._cv:
                        self._done.append(_Done(group, trajs))
                        self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - surfaced to the learner by take()
            with self._cv:
                self._error = e
                self._cv.notify_all()
