"""`ActorSet`: the one owner of actors' lifecycles: start with resources, wait for ready with a
deadline, shut down and free what they held.

Pipelines create their actors through an `ActorSet` and call `stop()` in `finally`: every actor's
`shutdown()` (engines and DeepSpeed ranks free /dev/shm and GPU memory there) runs before it is
killed, newest first, so an actor never outlives what it depends on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

log = logging.getLogger(__name__)


SHUTDOWN_TIMEOUT_S = 120.0
"""Seconds `ActorSet.stop` waits for the actors' `shutdown` calls in all before it kills them (a vLLM engine or a
DeepSpeed rank tears down in seconds when idle; a busy one answers only after its call in flight)."""


class ActorSet:
    """Actors started together and stopped together. Import-light: Ray is imported on use."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self._classes: dict[tuple, Any] = {}

    def start(self, cls: type, *args: Any, num_cpus: float = 1.0, num_gpus: float = 0.0,
              max_concurrency: int | None = 1000, **kwargs: Any) -> Any:
        """Start `cls(*args, **kwargs)` as a Ray actor with `num_cpus` / `num_gpus` (logical
        reservations) and keep its handle. `max_concurrency`: concurrent calls (async actors).
        Ray options (name, max_restarts, scheduling_strategy, ...) go in `kwargs` as `options=`."""
        import ray

        options = dict(kwargs.pop("options", {}))
        key = (cls, num_cpus, num_gpus, max_concurrency)
        if key not in self._classes:
            remote_opts: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
            if max_concurrency is not None:
                remote_opts["max_concurrency"] = max_concurrency
            self._classes[key] = ray.remote(**remote_opts)(cls)
        actor_cls = self._classes[key]
        handle = (actor_cls.options(**options) if options else actor_cls).remote(*args, **kwargs)
        self.handles.append(handle)
        return handle

    def adopt(self, handle: Any) -> Any:
        """Own an actor started elsewhere (e.g. `start_retrieval_pool`); returns it."""
        self.handles.append(handle)
        return handle

    @staticmethod
    def wait_ready(handles: Iterable[Any], timeout_s: float = 600.0, what: str = "actors") -> list[Any]:
        """Call `ready()` on every handle and wait at most `timeout_s` seconds for all of them.

        Raises:
            TimeoutError: not ready in time (usually: the cluster lacks the resources to place them,
                or a model is still downloading); names `what`.
        """
        import ray

        refs = [h.ready.remote() for h in handles]
        try:
            return ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s: check that the cluster has the CPUs/GPUs "
                               "the config reserves (`python -m scripts.ops.cluster_check`) and the actors' logs") from e

    def stop(self, handles: Sequence[Any] | None = None, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Shut down, then kill `handles` (default: all). `shutdown()` is called on all of them at
        once (the ranks of one process group leave it together) and waited for at most `timeout_s`
        seconds in all; a failure is logged and the rest still stop. Handles whose class has no
        `shutdown` are only killed."""
        import ray

        targets = list(reversed(self.handles)) if handles is None else list(handles)
        pending = [(h, h.shutdown.remote()) for h in targets if hasattr(h, "shutdown")]
        deadline = time.monotonic() + timeout_s
        for h, ref in pending:
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except Exception as e:  # noqa: BLE001 - report and keep stopping the others
                log.warning("shutdown of %s failed: %s: %s", _name(h), type(e).__name__, e)
        for h in targets:
            try:
                ray.kill(h)
            except Exception as e:  # noqa: BLE001
                log.warning("kill of %s failed: %s: %s", _name(h), type(e).__name__, e)
        ids = {id(h) for h in targets}
        self.handles = [h for h in self.handles if id(h) not in ids]


WAIT_SLICE_S = 1.0
"""Seconds `get_within` blocks in one `ray.wait`, so that signal handlers run between slices."""


class RemoteTimeoutError(TimeoutError):
    """A remote call did not finish within its deadline (`get_within`); names what and how long."""


OOM_RESTART_WAIT_S = 300.0
"""Seconds `wait_restarted` keeps asking an actor that Ray's memory monitor killed (a rollout worker with its vLLM
engine starts in under a minute here)."""


class ActorNotRestartedError(RuntimeError):
    """An actor that Ray's memory monitor killed did not come back within `OOM_RESTART_WAIT_S` (`wait_restarted`):
    it has used its `max_restarts` (`ray.max_restarts`), or cannot start again. Names the actor and the fix."""


def actor_death_errors() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call whose actor's process died or is restarting: `RayActorError` (with
    `ActorDiedError` and `ActorUnavailableError`) and `OutOfMemoryError`, which Ray raises instead when its
    memory monitor killed the process (seen here: a rollout worker killed during a weight sync).
    An actor with `max_restarts` left comes back after either; `wait_restarted` waits for it."""
    from ray.exceptions import OutOfMemoryError, RayActorError

    return (RayActorError, OutOfMemoryError)


def restarted_by_ray() -> bool:
    """Whether the calling Ray actor's process is one Ray started again after a death (its `max_restarts`), by
    `RuntimeContext.was_current_actor_reconstructed`; False outside a Ray actor, or when the GCS does not answer
    (logged). A restart between calls (the memory monitor killing an idle rollout worker during the learner's
    update) is seen by no caller; the restarted actor counts itself with this."""
    try:
        import ray

        if not ray.is_initialized():
            return False
        context = ray.get_runtime_context()
        return context.get_actor_id() is not None and bool(context.was_current_actor_reconstructed)
    except Exception as e:  # noqa: BLE001 - a count, never a reason for the actor not to start
        log.warning("could not ask Ray whether this actor was restarted: %s", e)
        return False


def get_within(refs: Any, timeout_s: float | None, what: str) -> Any:
    """`ray.get(refs)` with a deadline of `timeout_s` seconds (None: wait for ever), failing fast:
    the first failed ref raises at once, while the others may still be running (a dead learner rank
    leaves its peers blocked in a collective; waiting for them would take the collective's timeout).

    Args:
        refs: one ObjectRef or a list of them.
        what: the actor(s) and the work, for the error (e.g. "rollout workers: 16 episodes").

    Raises:
        RemoteTimeoutError: not done within `timeout_s`; the message names `what` and the seconds waited.
        Whatever a remote call raised (Ray's RayActorError for a dead actor, RayTaskError otherwise).
    """
    import ray

    single = not isinstance(refs, list)
    pending = [refs] if single else list(refs)
    t0 = time.monotonic()
    while pending:
        left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - t0))
        # In slices: a blocking ray.wait without a timeout never returns to Python, so a signal handler
        # (a second SIGTERM: stop now, pipelines.graceful_stop) waited for the whole learner update.
        done, pending = ray.wait(pending, num_returns=1, timeout=WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S))
        if not done and (left is None or left > WAIT_SLICE_S):
            continue
        if not done:
            raise RemoteTimeoutError(f"{what}: no result after {time.monotonic() - t0:.0f} s (deadline "
                                     f"{timeout_s:.0f} s, ray.call_timeout_s); see the actors' logs")
        ray.get(done)  # raises the remote error now
    out = ray.get([refs] if single else refs)
    return out[0] if single else out


def _name(handle: Any) -> str:
    return repr(handle)  # Ray's repr names the class and the actor id


def wait_restarted(handle: Any, timeout_s: float | None, what: str, poll_s: float = 1.0,
                   oom_wait_s: float | None = None) -> Any:
    """Wait until an actor answers `ready()`, also while Ray is restarting it (`max_restarts`): a call to a
    restarting actor fails at once with `ActorUnavailableError` (seen in the chaos run: a weight sync sent to a
    rollout worker killed 3 s earlier), so it is asked again every `poll_s` seconds. After Ray's memory monitor
    killed it, a call fails with the kill's `OutOfMemoryError` instead (seen: `ready()` sent to a rollout
    worker killed during a weight sync); that is asked again for up to `oom_wait_s` seconds (default
    `OOM_RESTART_WAIT_S`), not `timeout_s`, since an actor with no restarts left answers the same for ever.

    Returns:
        What `ready()` returned.
    Raises:
        RemoteTimeoutError: not ready within `timeout_s` seconds (None: no deadline); names `what`.
        RayActorError: the actor died for good (no restarts left).
        ActorNotRestartedError: still the memory monitor's error after `oom_wait_s` seconds (from the
            `OutOfMemoryError`).
    """
    from ray.exceptions import ActorUnavailableError, OutOfMemoryError

    oom_wait_s = OOM_RESTART_WAIT_S if oom_wait_s is None else oom_wait_s
    t0 = time.monotonic()
    while True:
        left = None if timeout_s is None else timeout_s - (time.monotonic() - t0)
        if left is not None and left <= 0:
            raise RemoteTimeoutError(f"{what}: not ready after {time.monotonic() - t0:.0f} s (deadline "
                                     f"{timeout_s:.0f} s, ray.call_timeout_s); see the actor's log")
        try:
            return get_within(handle.ready.remote(), left, what)
        except ActorUnavailableError:
            time.sleep(poll_s)
        except OutOfMemoryError as e:
            waited = time.monotonic() - t0
            if waited >= oom_wait_s:
                raise ActorNotRestartedError(
                    f"{what}: {_name(handle)} still answers Ray's OutOfMemoryError {waited:.0f} s after its memory "
                    "monitor killed it: it has no restarts left or cannot start again. Each kill uses one of "
                    "ray.max_restarts (a run resumes with a larger ray.max_restarts=N); or lower the node's "
                    "memory use (docs/reliability.md)") from e
            time.sleep(poll_s)
