"""One-step off-policy training (`train.async_mode: one_step`): step n+1's rollout runs while step n's
update does.

The rollout workers still hold the weights step n sampled with when step n's update starts, so the
rollout started then samples step n+1's episodes one policy version behind the learner (staleness
1: SkyRL's and verl's one-step off-policy mode). The learner's update and the rollout overlap; the
weights go to the workers once both are done. Step n+1 then trains on those episodes with the
learner's own log-probs as the proximal policy and the engine's as the behaviour policy
(`algorithm.off_policy_correction` weighs the gap; `algorithms.off_policy`).

A rollout started ahead is held in memory only: a checkpoint does not save it, and a resumed run
generates that step's episodes again (the same questions and sampling seeds, on the checkpoint's
weights).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class RolloutAhead:
    """At most one rollout in flight in a background thread, for a known step.

    `start(step, run)` calls `run()` (a blocking rollout returning the step's episodes) in the thread;
    `wait()` blocks until it is done; `take(step)` returns its episodes when it was started for `step`
    (re-raising its error in the caller's thread), else None (nothing started, or for another step:
    the caller rolls out itself).
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-ahead")
        self._pending: tuple[int, Future] | None = None
        self.last_run_s = 0.0

    def start(self, step: int, run: Callable[[], list[dict]]) -> None:
        """Start `run()` for 0-based `step`; a rollout still in flight is waited for and dropped first.
        `last_run_s` then holds how long `run()` took (seconds), for the rollout's idle time."""
        self.wait()

        def timed() -> list[dict]:
            t = time.perf_counter()
            try:
                return run()
            finally:
                self.last_run_s = time.perf_counter() - t

        self._pending = (step, self._pool.submit(timed))

    def wait(self) -> float:
        """Block until the rollout in flight (if any) is done; returns the seconds waited."""
        if self._pending is None:
            return 0.0
        t = time.perf_counter()
        self._pending[1].exception()  # waits; an error is re-raised by take()
        return time.perf_counter() - t

    def take(self, step: int) -> list[dict] | None:
        """The episodes of the rollout started for `step` (waiting for it), or None.

        Raises:
            Exception: whatever the rollout raised (a timeout, a dead worker past its retries).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        started_for, future = pending
        if started_for != step:  # e.g. learners rebuilt from an older snapshot: that step is rolled out again
            future.exception()
            return None
        return future.result()

    def close(self) -> None:
        """Drop the rollout in flight without waiting (the run is stopping)."""
        self._pending = None
        self._pool.shutdown(wait=False, cancel_futures=True)


def staleness_metrics(trajectories: Sequence[dict[str, Any]], learner_version: int) -> dict[str, float]:
    """`async/staleness_max` and `async/staleness_mean`: policy versions between each episode's oldest
    token (`pipelines.rollout_stream.version_span`) and the learner's `learner_version` it trains with;
    `async/partial_episodes`: episodes whose tokens came from more than one version (weights changed
    while they ran)."""
    from pipelines.rollout_stream import version_span

    spans = [version_span(t) for t in trajectories] or [(learner_version, learner_version)]
    lags = [learner_version - lo for lo, _ in spans]
    return {"async/staleness_max": float(max(lags)), "async/staleness_mean": sum(lags) / len(lags),
            "async/partial_episodes": float(sum(hi > lo for lo, hi in spans))}
