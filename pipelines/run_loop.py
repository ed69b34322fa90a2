"""The training run's step loop: steps with metrics, dev evaluation and checkpoints; a stop signal
(`pipelines.graceful_stop`) finishes or aborts the step and checkpoints; a dead learner rank rebuilds
the learners from the newest snapshot or checkpoint (`Trainer.recover_learners`) and the loop goes on
from there."""

from __future__ import annotations

import logging
from typing import Any

from pipelines.checkpoints import last_checkpoint, name_best_checkpoint, record_warm_start_dev
from pipelines.graceful_stop import GracefulStop, StopRequested, TrainingStopped, stop_request
from pipelines.train_metrics import step_summary

log = logging.getLogger(__name__)


def dev_eval_steps(total: int, eval_every: int, start_step: int = 0) -> list[int]:
    """When the run evaluates on dev: completed-step counts, ascending, each once. 0 (before any
    update, the untrained policy's score) when `eval_every` > 0 and the run starts fresh
    (`start_step` 0: a resumed run evaluated step 0 already); every multiple of `eval_every` in
    (`start_step`, `total`]; and `total` always (`eval_every` 0 = only at the end). Empty when
    `start_step >= total`: no step is left to run.

    Raises:
        ValueError: a negative argument.
    """
    if min(total, eval_every, start_step) < 0:
        raise ValueError(f"dev_eval_steps({total}, {eval_every}, {start_step}): arguments must be >= 0")
    if start_step >= total:
        return []
    due = {total}
    if eval_every:
        due.update(range(eval_every * (start_step // eval_every + 1), total + 1, eval_every))
        if start_step == 0:
            due.add(0)
    return sorted(due)


def run_loop(trainer: Any, start_step: int, stop: GracefulStop | None = None) -> None:
    """Steps `start_step` … end with metrics, evaluation and checkpoints. The dev evaluation runs
    after the steps `dev_eval_steps` names; its step 0 (before any update, only in a
    fresh run) is a metrics row of its own, logged at step 0. `stop` (its handlers
    installed by the caller) aborts or finishes the running step on SIGTERM/SIGINT. `trainer`: a
    `pipelines.train.Trainer` (or an object with its step/evaluate_dev/save/tracker/recover_learners).

    Raises:
        TrainingStopped: after a stop signal, once the last completed step is checkpointed (when the
            learners were not mid-update) and its metrics logged.
    """
    from tqdm import tqdm

    from actors.learner.group import LearnerRankError
    from pipelines.step_schedule import total_steps

    cfg, total, stop = trainer.cfg, total_steps(trainer.cfg), stop or GracefulStop()
    dev_due = set(dev_eval_steps(total, cfg.train.eval_every, start_step))
    searches = getattr(trainer, "searches", True)  # False: the step line names a select-only recipe's numbers
    bar = tqdm(total=total, initial=start_step, desc=f"train {cfg.train.recipe}", unit="step",
               disable=not trainer.progress, dynamic_ncols=True)
    last = ""  # the previous step's summary, shown beside the running phase
    completed = saved = start_step  # steps whose update finished; the newest checkpoint on disk
    pending: dict[str, float] | None = None  # a completed step's metrics not yet logged

    def show(phase: str) -> None:
        stop.phase = phase
        bar.set_postfix_str(f"{phase}{' | ' + last if last else ''}")

    trainer.on_phase = show
    try:
        if 0 in dev_due and getattr(cfg.train, "eval_untrained", True):  # the untrained policy's score: the curve's start
            show("dev evaluation")
            dev = trainer.evaluate_dev(0)
            if dev:  # {} with train.eval_questions 0: no row
                trainer.tracker.log(dev, step=0)
            stop.check()
        if start_step == 0 and getattr(cfg.train, "warm_start", None) is not None:  # before step 1 of a fresh run only
            warm = trainer.warm_start()
            if 0 in dev_due and warm.get("warm_start/kept"):  # the warm start only: the dev curve's second point
                show("dev evaluation")
                warm.update(trainer.evaluate_dev(0, warm_started=True))
                if "dev/answer_f1" in warm:  # weighed against the RL checkpoints by `checkpoints/best`
                    record_warm_start_dev(trainer.run_dir, warm["dev/answer_f1"])
                    name_best_checkpoint(trainer.run_dir)
            trainer.tracker.log(warm, step=0)
            stop.check()
        step = start_step
        while step < total:
            try:
                metrics = trainer.step(step)
            except LearnerRankError as e:  # no half-applied update: rebuild, go back to the snapshot or checkpoint
                show("rebuilding learners")
                step = completed = trainer.recover_learners(e, step)
                saved = min(saved, step)  # a snapshot's step may be newer than the last checkpoint
                bar.n = step
                bar.refresh()
                continue
            step += 1
            completed = done = step
            pending = metrics
            checkpoint_due = done == total or bool(cfg.train.save_every and done % cfg.train.save_every == 0)
            if getattr(trainer, "snapshot", None) is not None and not checkpoint_due:  # a checkpoint supersedes it
                show("snapshot")
                trainer.snapshot_learners(done)
            if done in dev_due:
                show("dev evaluation")
                metrics.update(trainer.evaluate_dev(done))
            trainer.tracker.log(metrics, step=done)
            pending, last = None, step_summary(metrics, searches)
            if checkpoint_due:
                show("checkpoint")
                trainer.save(done)
                saved = done
            show("done" if done == total else "next step")
            bar.update(1)
            stop.check()
    except (StopRequested, SystemError) as raised:  # SystemError: a StopRequested from inside Ray's core
        e = stop_request(raised)
        if e is None:
            raise
        log.warning("%s after %d completed steps: stopping", e, completed)
        if pending is not None:
            trainer.tracker.log(pending, step=completed)
        if e.clean and completed > saved:
            show("checkpoint")
            try:
                trainer.save(completed)
            except (StopRequested, SystemError) as second:  # a second signal: the newest complete checkpoint stays
                if stop_request(second) is None:
                    raise
                log.warning("second signal: the checkpoint of step %d was abandoned", completed)
        raise TrainingStopped(e.signum, trainer.run_dir, completed, last_checkpoint(trainer.run_dir)) from None
    finally:
        trainer.on_phase = lambda phase: None
        bar.close()
