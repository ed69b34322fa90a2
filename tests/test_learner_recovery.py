"""A dead learner rank during a step (`pipelines.run_loop`): the loop rebuilds the learners through
`recover_learners`, goes back to the step it returns (the last checkpoint), redoes the steps since in
order, logs each step's metrics (the redone rows later, so they win), and gives up after
`train.max_learner_restarts`. Scripted trainer, no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.learner.group import LearnerRankError
from tests.test_graceful_stop import ScriptedTrainer, run


class DyingRankTrainer(ScriptedTrainer):
    """Its learner "dies" during the steps in `die_at` (0-based, once each unless `always`)."""

    def __init__(self, run_dir: Path, total: int, die_at=(), save_every: int = 0, max_restarts: int = 2,
                 always: bool = False):
        super().__init__(run_dir, total, save_every=save_every)
        self.cfg.train.max_learner_restarts = max_restarts
        self.die_at, self.always, self.stepped, self.recoveries = set(die_at), always, [], []

    def step(self, step: int) -> dict[str, float]:
        self.stepped.append(step)
        if step in self.die_at:
            if not self.always:
                self.die_at.discard(step)
            raise LearnerRankError(f"policy learner: a rank died during update (step {step})")
        return super().step(step)

    def recover_learners(self, error: Exception, step: int) -> int:
        if len(self.recoveries) >= self.cfg.train.max_learner_restarts:
            raise error
        back = max(self.saved, default=0)
        self.recoveries.append((step, back))
        return back


def test_dead_rank_goes_back_to_last_checkpoint_and_redoes_steps(tmp_path):
    trainer = DyingRankTrainer(tmp_path, total=5, die_at=[3], save_every=2)
    assert run(trainer) is None
    assert trainer.recoveries == [(3, 2)]
    assert trainer.stepped == [0, 1, 2, 3, 2, 3, 4]  # step 3 (0-based) died; back to checkpoint step-2
    assert trainer.logged == [1, 2, 3, 3, 4, 5] and trainer.saved == [2, 4, 5]


def test_dead_rank_without_checkpoint_starts_over(tmp_path):
    trainer = DyingRankTrainer(tmp_path, total=3, die_at=[1])
    assert run(trainer) is None
    assert trainer.stepped == [0, 1, 0, 1, 2] and trainer.logged == [1, 1, 2, 3]


def test_rank_that_keeps_dying_fails_the_run_after_max_restarts(tmp_path):
    trainer = DyingRankTrainer(tmp_path, total=3, die_at=[1], always=True, max_restarts=2)
    with pytest.raises(LearnerRankError, match="a rank died"):
        run(trainer)
    assert len(trainer.recoveries) == 2
