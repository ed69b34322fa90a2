"""The learners' state after the last completed step, for `train.learner_recovery: snapshot`.

After every step that writes no checkpoint, each learner group writes its DeepSpeed state (weights,
optimizer, scheduler, RNG and update counter; every rank its shard, no Hugging Face copy) under
`train.snapshot_dir` (`/dev/shm` by default: memory, not disk). When a rank dies, the rebuilt learners
load the newer of the snapshot and the last checkpoint, so only the failed step is redone, where the
on-disk checkpoint (`train.save_every`) alone would redo every step since. Only the newest snapshot is
kept, and a checkpoint removes it (it is older then). The folder is per node: when rebuilt ranks land
on a node without it, loading fails and the trainer falls back to the last checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class LearnerSnapshot:
    """The newest in-memory snapshot of one run's learner groups.

    Args:
        root: `train.snapshot_dir`.
        run_name: the run directory's name; the snapshot lives in `<root>/searchrl-snapshot-<run_name>/step-<n>`.
            A folder left there by an earlier process of the same run (killed, then resumed) is removed.
    """

    def __init__(self, root: str | Path, run_name: str):
        self.dir = Path(root) / f"searchrl-snapshot-{run_name}"
        self.step: int | None = None
        self.remove()

    @property
    def path(self) -> Path | None:
        """The newest snapshot's folder, or None before the first."""
        return None if self.step is None else self.dir / f"step-{self.step}"

    def save(self, step: int, groups: Sequence[Any]) -> float:
        """Write every group's state after `step` completed steps (`LearnerGroup.save_checkpoint(...,
        hf=False)`), then drop the previous snapshot. Returns the seconds it took."""
        t0 = time.perf_counter()
        previous, target = self.path, self.dir / f"step-{step}"
        for group in groups:
            group.save_checkpoint(str(target), hf=False)
        self.step = step
        if previous is not None and previous != target:
            shutil.rmtree(previous, ignore_errors=True)
        return time.perf_counter() - t0

    def load(self, groups: Sequence[Any]) -> int | None:
        """Load the newest snapshot into freshly built `groups`. Returns its step, or None when there is
        none or a rank cannot read it (e.g. the rebuilt ranks run on another node): the caller then
        falls back to the last checkpoint, which overwrites whatever was loaded."""
        if self.path is None:
            return None
        try:
            for group in groups:
                group.load_checkpoint(str(self.path))
        except Exception as e:  # noqa: BLE001 - FileNotFoundError inside a rank arrives wrapped by Ray
            log.warning("learner snapshot %s could not be loaded (%s: %s); using the last checkpoint",
                        self.path, type(e).__name__, e)
            return None
        return self.step

    def remove(self) -> None:
        """Delete this run's snapshot folder (at the end of the run, and at its start)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.step = None


def rebuild_learners(trainer: Any) -> None:
    """Stop both learner groups of `trainer` (a `pipelines.train.Trainer`) and start fresh ones."""
    for group in (trainer.policy, trainer.critic):
        if group is not None:
            group.shutdown()  # a dead rank's shutdown fails (logged); the others leave the process group
    trainer.policy = trainer.critic = None
    trainer.start_learners()


def recover_learners(trainer: Any, error: Exception, step: int) -> int:
    """After a learner rank died during `step` (0-based): rebuild both groups, load the snapshot
    (`train.learner_recovery: snapshot`) when it is newer than the last checkpoint, else that
    checkpoint, else keep the starting model; give the rollout workers those weights. Returns the step
    to go on from (the snapshot's or checkpoint's, at best the failed step itself; or 0). Counts
    `faults/learner_restarts` and `faults/steps_redone`.

    Raises:
        `error`: more than `train.max_learner_restarts` recoveries in this run.
    """
    from pipelines.checkpoints import checkpoint_step, last_checkpoint

    trainer.faults["learner_restarts"] += 1
    trainer.learner_restarts += 1
    if trainer.learner_restarts > trainer.cfg.train.max_learner_restarts:
        raise error
    rebuild_learners(trainer)
    snapshot = trainer.snapshot
    groups = [g for g in (trainer.policy, trainer.critic) if g is not None]
    checkpoint = last_checkpoint(trainer.run_dir)
    saved = checkpoint_step(checkpoint) if checkpoint is not None else -1
    newer = snapshot is not None and snapshot.step is not None and snapshot.step > saved
    back_to = snapshot.load(groups) if newer else None
    source: Any = snapshot.path if back_to is not None else None
    if back_to is None and checkpoint is not None:  # loads, syncs the workers; overwrites a failed snapshot load
        back_to, source = trainer.resume(checkpoint), checkpoint
    else:
        if back_to is None:
            if newer:  # the snapshot failed to load, maybe half-way: start clean
                rebuild_learners(trainer)
            back_to, source = 0, "the starting model"
        trainer.policy.sync_weights(trainer.workers, version=back_to)
        trainer.weight_version = back_to
    trainer.faults["steps_redone"] += step - back_to
    if getattr(trainer, "stream", None) is not None:  # fully: what the lost updates trained is generated again
        trainer.stream.rewind(back_to)
    log.warning("%s; learners rebuilt (%d/%d), going on from step %d (%s)", error, trainer.learner_restarts,
                trainer.cfg.train.max_learner_restarts, back_to, source)
    return back_to
