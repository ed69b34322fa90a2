"""SIGTERM / SIGINT during training: stop at a safe point, keep a checkpoint, say how to resume.

A step's learner state changes only in its update and weight-sync phases. A signal in any other
phase (rollout, log-probs and advantages, dev evaluation, between steps) aborts the step at once: the
learners still hold the state after the last completed step, which is saved. A signal during the
update, the weight sync or a checkpoint lets that phase finish (no half-applied update is ever saved),
then the run stops. A second signal stops at once: actors still busy (a learner mid-update answers its
shutdown only when the update ends) get `FORCED_SHUTDOWN_S` and are killed, and the last checkpoint on
disk is then the resume point.
Whatever happens, the process exits within `STOP_TIMEOUT_S` of the first signal (`cluster.exit_deadline`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

from actors.lifecycle import SHUTDOWN_TIMEOUT_S

log = logging.getLogger(__name__)

# Phases (Trainer.on_phase names) during which the learners are not being changed.
ABORTABLE_PHASES = frozenset({"start", "rollout+score", "logprobs+advantages", "dev evaluation", "next step",
                              "rebuilding learners", "selecting learnable questions"})


# Seconds from the first signal to exit: the update or sync in flight, a checkpoint, the actors' shutdown
# (`cluster.exit_deadline`; SEARCHRL_STOP_TIMEOUT_S overrides). A CPU update takes 1-2 minutes here.
STOP_TIMEOUT_S = 600.0

# Seconds the actors get to shut down after a second signal ("stop now"): a learner in the middle of an
# update answers its shutdown only when the update ends (minutes on a CPU), so it is killed instead.
FORCED_SHUTDOWN_S = 5.0


class StopRequested(Exception):
    """Raised in the training loop when a stop signal arrives.

    Attributes:
        signum: the signal (signal.SIGTERM or signal.SIGINT).
        clean: True when the learners hold the state after the last completed step (safe to save).
    """

    def __init__(self, signum: int, clean: bool):
        super().__init__(f"{signal.Signals(signum).name} received")
        self.signum, self.clean = signum, clean


def stop_request(error: BaseException) -> StopRequested | None:
    """The `StopRequested` behind `error`: `error` itself, or the exception it was raised from. Ray's
    Cython core runs signal handlers inside its own calls (`ray.wait`, `ray.get` check signals while
    they block); a handler's exception then comes out as `SystemError: <cyfunction CoreWorker.wait>
    returned a result with an exception set`, caused by the StopRequested (seen on SIGINT mid-rollout).
    Returns None when no StopRequested is in the chain."""
    for _ in range(8):  # a short chain: the error, its cause, maybe one more
        if isinstance(error, StopRequested):
            return error
        error = error.__cause__ or error.__context__
        if error is None:
            return None
    return None


class TrainingStopped(Exception):
    """A run stopped by a signal after cleaning up (raised by `pipelines.train.train`).

    Attributes:
        signum: the signal that stopped it; `exit_status` is 128 + signum, the shell's convention.
        run_dir: the run directory (`--resume` it).
        completed_steps: training steps whose update finished.
        checkpoint: the checkpoint a resume continues from, or None when none was written yet.
    """

    def __init__(self, signum: int, run_dir, completed_steps: int, checkpoint):
        self.signum, self.run_dir = signum, run_dir
        self.completed_steps, self.checkpoint = completed_steps, checkpoint
        super().__init__(self.message())

    @property
    def exit_status(self) -> int:
        return 128 + int(self.signum)

    def message(self) -> str:
        name = signal.Signals(self.signum).name
        if self.checkpoint is None:
            return (f"stopped by {name} after {self.completed_steps} completed steps with no checkpoint; "
                    f"start the run again (nothing to resume in {self.run_dir})")
        return (f"stopped by {name} after {self.completed_steps} completed steps; checkpoint {self.checkpoint}; "
                f"resume: .venv/bin/python -m scripts.train --resume {self.run_dir}")


class GracefulStop:
    """Signal handlers for one training loop (use as a context manager; see the module docstring).

    `phase` is set by the loop as it moves on; `check()` raises `StopRequested` at the end of a step
    when a signal arrived during a phase that had to finish first. Installed only in the main thread
    (Python delivers signals there); elsewhere it is inert.
    """

    def __init__(self) -> None:
        self.phase = "start"
        self.signum: int | None = None
        self.forced = False  # a second signal arrived: stop now, killing what is still busy

    @property
    def shutdown_timeout_s(self) -> float:
        """Seconds each actor gets to shut down: `FORCED_SHUTDOWN_S` after a second signal, else the default
        `actors.lifecycle.SHUTDOWN_TIMEOUT_S`."""
        return FORCED_SHUTDOWN_S if self.forced else SHUTDOWN_TIMEOUT_S

    def handle(self, signum: int, frame) -> None:
        """The signal handler. Raises StopRequested now, unless the learners are changing (first signal)."""
        first = self.signum is None
        self.signum, self.forced = signum, not first
        if first:  # the stop itself is bounded, even when the cluster no longer answers
            from cluster.exit_deadline import arm, stop_timeout_s

            arm(stop_timeout_s(STOP_TIMEOUT_S), 128 + int(signum), signal.Signals(signum).name)
        if self.phase in ABORTABLE_PHASES:
            raise StopRequested(signum, clean=True)
        if not first:
            raise StopRequested(signum, clean=False)
        log.warning("%s: finishing the %s phase, then a checkpoint and stop (signal again to stop now, "
                    "without a checkpoint)", signal.Signals(signum).name, self.phase)

    def check(self) -> None:
        """Raise StopRequested (clean) if a signal arrived while a phase had to finish."""
        if self.signum is not None:
            raise StopRequested(self.signum, clean=True)

    @contextlib.contextmanager
    def installed(self) -> Iterator[GracefulStop]:
        """Install the handlers for SIGTERM and SIGINT, restoring the previous ones on exit."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self.handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
