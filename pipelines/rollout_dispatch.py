"""A step's rollout batch over rollout workers that may die: each worker's part is re-run on a live
(or restarted, re-synced) worker when its actor dies, and the finished batch is checked to hold every
(question, sample) pair exactly once.

A part is a list of questions run with `n` samples each on one worker. Sampling seeds depend on the
question, the sample index and the turn only (`actors.rollout.agent_loop`), so a re-run part yields
the same (question, sample) pairs it would have yielded on the dead worker, and nothing the dead
worker produced ever reaches the batch (its call raised), so nothing is duplicated.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

WAIT_SLICE_S = 1.0
"""Longest single `ray.wait` (seconds): a signal's handler (the stop on SIGTERM) runs between waits; one
wait for a whole rollout part (minutes) held a second SIGTERM back until the part came in (measured)."""


class EpisodeSetError(RuntimeError):
    """A rollout batch lost or duplicated (question, sample) pairs; names them."""


def run_parts(workers: Sequence[Any], parts: Sequence[Sequence[Any]], submit: Callable[[Any, Sequence[Any]], Any],
              timeout_s: float | None, what: str, resync: Callable[[Any], Any] | None = None,
              stale: Callable[[Any], bool] | None = None, max_attempts: int = 3) -> tuple[list[Any], Counter]:
    """Run `parts[i]` on `workers[i % len(workers)]` with `submit(worker, part) -> ObjectRef` and
    return each part's result, in part order, with fault counts.

    When a worker's actor dies (Ray's `RayActorError` / `ActorUnavailableError`, or `OutOfMemoryError`: Ray's
    memory monitor killed it; `actors.lifecycle.actor_death_errors`), its part goes to
    the live worker with the fewest parts in flight; when every worker has died, to the dead one
    itself (Ray restarts it under `max_restarts`; once it answers `ready()`, which a worker must have),
    after `resync(worker)` gave it the current weights. A part whose result is `stale(result)` (episodes sampled with older
    weights: its worker died and restarted between calls, unseen) is re-run on the same worker after
    `resync`. Counts: "rollout_worker_deaths", "rollout_parts_rerun", "rollout_stale_parts".

    Args:
        timeout_s: deadline in seconds for the whole batch (None: none).
        what: the work, for errors ("rollout workers: 16 episodes").
        max_attempts: tries per part before its last error is raised.

    Raises:
        actors.lifecycle.RemoteTimeoutError: not done within `timeout_s`.
        RayActorError / ActorUnavailableError / OutOfMemoryError: a part failed `max_attempts` times.
        Whatever else a worker raised (a bug in an episode is not retried).
    """
    import ray
    from actors.lifecycle import RemoteTimeoutError, actor_death_errors, wait_restarted

    if not workers:
        raise ValueError(f"{what}: no rollout workers")
    faults: Counter = Counter()
    results: list[Any] = [None] * len(parts)
    pending: dict[Any, tuple[int, int, int]] = {}  # ref -> (part, worker, attempt)
    dead: set[int] = set()

    def send(i: int, w: int, attempt: int) -> None:
        pending[submit(workers[w], parts[i])] = (i, w, attempt)

    for i in range(len(parts)):
        send(i, i % len(workers), 1)
    t0 = time.monotonic()
    while pending:
        left = None if timeout_s is None else timeout_s - (time.monotonic() - t0)
        # Wait in slices of WAIT_SLICE_S: Python runs signal handlers (SIGTERM's stop) only between calls.
        done, _ = ray.wait(list(pending), num_returns=1,
                           timeout=WAIT_SLICE_S if left is None else max(0.0, min(left, WAIT_SLICE_S)))
        if not done and (left is None or left > WAIT_SLICE_S):
            continue
        if not done:
            raise RemoteTimeoutError(f"{what}: {len(pending)} of {len(parts)} parts unfinished after "
                                     f"{time.monotonic() - t0:.0f} s (deadline {timeout_s:.0f} s, ray.call_timeout_s)")
        i, w, attempt = pending.pop(done[0])
        try:
            result = ray.get(done[0])
            if stale is None or not stale(result):
                results[i] = result
                continue
            faults["rollout_stale_parts"] += 1
            if attempt >= max_attempts or resync is None:
                raise RuntimeError(f"{what}: worker {w} still returns episodes of old weights after "
                                   f"{attempt} tries; check its log")
            log.warning("%s: worker %d sampled with old weights (restarted?); re-syncing and re-running", what, w)
            resync(workers[w])
            send(i, w, attempt + 1)
            continue
        except actor_death_errors() as e:
            faults["rollout_worker_deaths"] += 1
            if attempt >= max_attempts:
                raise
            dead.add(w)
            error = f"{type(e).__name__}"
        load = Counter(wi for _, wi, _ in pending.values())
        live = [j for j in range(len(workers)) if j not in dead]
        target = min(live, key=lambda j: load[j]) if live else w
        log.warning("%s: worker %d died (%s); re-running its part (%d items) on worker %d", what, w, error,
                    len(parts[i]), target)
        if target in dead and resync is not None:
            # Ray refuses calls to an actor it is still restarting (ActorUnavailableError): wait for it first.
            wait_restarted(workers[target], left, f"{what}: restarted worker {target}")
            resync(workers[target])  # a restarted worker starts from the initial weights
            dead.discard(target)
        faults["rollout_parts_rerun"] += 1
        send(i, target, attempt + 1)
    return results, faults


def check_episodes(trajs: Sequence[Mapping[str, Any]], examples: Sequence[Mapping[str, Any]], n: int) -> None:
    """Check that `trajs` holds each (question, sample index) of `examples` x range(`n`) exactly once.

    Raises:
        EpisodeSetError: pairs lost or duplicated (the first few named).
    """
    from actors.rollout.agent_loop import group_id_of

    want = Counter((group_id_of(e), s) for e in examples for s in range(n))
    got = Counter((str(t["group_id"]), int(t["sample_index"])) for t in trajs)
    lost = sorted((want - got).elements())
    duplicated = sorted((got - want).elements())
    if lost or duplicated:
        raise EpisodeSetError(f"rollout batch: {len(lost)} (question, sample) pairs lost {lost[:5]}, "
                              f"{len(duplicated)} duplicated or unexpected {duplicated[:5]}")

