"""SIGTERM/SIGINT during training (pipelines/graceful_stop.py, pipelines/train.run_loop): abort a step
whose learners are untouched, let an update finish, checkpoint the last completed step, never save a
half-applied update, and say how to resume. Real signals sent to this process; a scripted trainer."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.checkpoints import STATE_FILE
from pipelines.graceful_stop import GracefulStop, StopRequested, TrainingStopped
from pipelines.run_loop import run_loop


class ScriptedTrainer:
    """The parts of `pipelines.train.Trainer` that `run_loop` uses; `signal_at` = (step, phase, count):
    send SIGTERM `count` times to this process when that step reaches that phase."""

    def __init__(self, run_dir: Path, total: int, signal_at=None, save_every: int = 0):
        self.cfg = SimpleNamespace(train=SimpleNamespace(recipe="r1_searcher", total_steps=total, stages=[],
                                                         eval_every=0, save_every=save_every))
        self.run_dir, self.progress, self.signal_at = run_dir, False, signal_at
        self.on_phase = lambda phase: None
        self.updates, self.saved, self.logged = 0, [], []
        self.tracker = SimpleNamespace(log=lambda m, step: self.logged.append(step))

    def _phase(self, step: int, phase: str) -> None:
        self.on_phase(phase)
        if self.signal_at and self.signal_at[:2] == (step, phase):
            for _ in range(self.signal_at[2]):
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in the main thread

    def step(self, step: int) -> dict[str, float]:
        self._phase(step, "rollout+score")
        self._phase(step, "update")
        self.updates += 1
        self._phase(step, "weight sync")
        return {"step": float(step + 1)}

    def evaluate_dev(self, step: int) -> dict[str, float]:
        self._phase(step - 1, "dev evaluation")
        return {}

    def save(self, step: int) -> Path:
        path = self.run_dir / "checkpoints" / f"step-{step}"
        path.mkdir(parents=True)
        (path / STATE_FILE).write_text(json.dumps({"step": step}))
        self.saved.append(step)
        return path


def run(trainer: ScriptedTrainer, start: int = 0) -> TrainingStopped | None:
    stop = GracefulStop()
    with stop.installed():
        try:
            run_loop(trainer, start, stop)
        except TrainingStopped as e:
            return e
    return None


def test_signal_during_rollout_aborts_the_step_and_checkpoints_the_last_completed(tmp_path):
    trainer = ScriptedTrainer(tmp_path, total=5, signal_at=(2, "rollout+score", 1))
    stopped = run(trainer)
    assert stopped is not None and stopped.completed_steps == 2 and trainer.updates == 2
    assert trainer.saved == [2] and trainer.logged == [1, 2]
    assert stopped.checkpoint == tmp_path / "checkpoints" / "step-2"
    assert stopped.exit_status == 128 + signal.SIGTERM
    assert f"--resume {tmp_path}" in stopped.message() and "SIGTERM" in stopped.message()


def test_signal_during_update_lets_it_finish_then_checkpoints_that_step(tmp_path):
    trainer = ScriptedTrainer(tmp_path, total=5, signal_at=(1, "update", 1))
    stopped = run(trainer)
    assert stopped.completed_steps == 2 and trainer.updates == 2  # the update was not cut
    assert trainer.saved == [2] and trainer.logged == [1, 2]


def test_second_signal_during_update_stops_without_saving_a_half_update(tmp_path):
    trainer = ScriptedTrainer(tmp_path, total=5, signal_at=(1, "update", 2), save_every=1)
    stopped = run(trainer)
    assert trainer.updates == 1 and trainer.saved == [1]  # step 2's update never counted, never saved
    assert stopped.checkpoint == tmp_path / "checkpoints" / "step-1"


def test_a_second_signal_kills_busy_actors_instead_of_waiting_for_their_shutdown():
    """A learner in the middle of an update answers its shutdown call only when the update ends (minutes on a
    CPU): after a second signal ("stop now") the trainer gives every actor `FORCED_SHUTDOWN_S`, then kills it."""
    from pipelines.graceful_stop import FORCED_SHUTDOWN_S
    from pipelines.train import Trainer

    stop = GracefulStop()
    stop.phase = "update"
    stop.handle(signal.SIGTERM, None)
    assert not stop.forced  # the first lets the update finish
    with pytest.raises(StopRequested):
        stop.handle(signal.SIGTERM, None)
    assert stop.forced and FORCED_SHUTDOWN_S <= 10

    waits = []
    trainer = Trainer.__new__(Trainer)  # only what close() touches
    trainer.ahead = trainer.stream = trainer.critic = trainer.snapshot = None
    trainer.policy = SimpleNamespace(shutdown=lambda timeout_s: waits.append(("policy", timeout_s)))
    trainer.actors = SimpleNamespace(stop=lambda timeout_s: waits.append(("actors", timeout_s)))
    trainer.close(FORCED_SHUTDOWN_S)
    assert waits == [("policy", FORCED_SHUTDOWN_S), ("actors", FORCED_SHUTDOWN_S)]


def test_no_checkpoint_written_when_the_last_completed_step_is_saved(tmp_path):
    trainer = ScriptedTrainer(tmp_path, total=5, signal_at=(2, "rollout+score", 1), save_every=2)
    stopped = run(trainer)
    assert trainer.saved == [2] and stopped.checkpoint.name == "step-2"


def test_signal_before_any_step_has_nothing_to_resume(tmp_path):
    trainer = ScriptedTrainer(tmp_path, total=3, signal_at=(0, "rollout+score", 1))
    stopped = run(trainer)
    assert stopped.completed_steps == 0 and stopped.checkpoint is None and trainer.saved == []
    assert "nothing to resume" in stopped.message()


def test_signal_during_dev_evaluation_logs_the_step_and_checkpoints_it(tmp_path):
    trainer = ScriptedTrainer(tmp_path, total=3, signal_at=(2, "dev evaluation", 1))
    stopped = run(trainer)
    assert stopped.completed_steps == 3 and trainer.logged == [1, 2, 3] and trainer.saved == [3]


def test_a_run_without_signals_is_unchanged(tmp_path):
    trainer = ScriptedTrainer(tmp_path, total=3)
    assert run(trainer) is None and trainer.updates == 3 and trainer.saved == [3]


def test_handlers_are_restored_and_phase_rules():
    before = signal.getsignal(signal.SIGTERM)
    stop = GracefulStop()
    with stop.installed():
        assert signal.getsignal(signal.SIGTERM) == stop.handle
        stop.phase = "update"
        stop.handle(signal.SIGTERM, None)  # first signal mid-update: remembered, no raise
        with pytest.raises(StopRequested) as e:
            stop.check()
        assert e.value.clean
        with pytest.raises(StopRequested) as e:
            stop.handle(signal.SIGINT, None)
        assert not e.value.clean
    assert signal.getsignal(signal.SIGTERM) == before


class StopInsideRayTrainer(ScriptedTrainer):
    """Step `at` fails the way a signal handler's exception leaves Ray's Cython core (`ray.wait`): a
    SystemError caused by the StopRequested (seen on SIGINT during a real rollout)."""

    def __init__(self, run_dir: Path, total: int, at: int, cause: bool = True):
        super().__init__(run_dir, total)
        self.at, self.cause = at, cause

    def step(self, step: int) -> dict[str, float]:
        if step == self.at:
            self._phase(step, "rollout+score")
            error = SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set")
            if not self.cause:
                raise error
            try:
                raise StopRequested(signal.SIGINT, clean=True)
            except StopRequested as e:
                raise error from e
        return super().step(step)


def test_a_stop_raised_inside_rays_core_still_stops_cleanly(tmp_path):
    from pipelines.graceful_stop import stop_request

    trainer = StopInsideRayTrainer(tmp_path, total=5, at=2)
    stopped = run(trainer)
    assert isinstance(stopped, TrainingStopped) and stopped.signum == signal.SIGINT
    assert stopped.completed_steps == 2 and trainer.saved == [2] and trainer.logged == [1, 2]
    assert stop_request(ValueError("x")) is None

    with pytest.raises(SystemError):  # a SystemError with no stop behind it is a real error
        run(StopInsideRayTrainer(tmp_path / "b", total=5, at=1, cause=False))
