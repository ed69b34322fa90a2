"""A dead learner rank during a step (`pipelines.run_loop`): the loop rebuilds the learners through
`recover_learners`, goes back to the step it returns (the last checkpoint), redoes the steps since in
order, logs each step's metrics (the redone rows later, so they win), and gives up after
`train.max_learner_restarts`; with `train.learner_recovery: snapshot` only the failed step is redone
(`pipelines.learner_recovery`: the snapshot, its fallbacks). Scripted trainers and fake groups, no Ray."""

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


# ----------------------------------------------------------------------------- learner_recovery: snapshot


class FakeGroup:
    """A LearnerGroup's save/load/sync surface on files: `save_checkpoint` writes <dir>/<role>/deepspeed/state."""

    def __init__(self, role: str = "policy", unreadable: bool = False):
        self.role, self.unreadable = role, unreadable
        self.saved, self.loaded, self.synced, self.stopped = [], [], [], False

    def save_checkpoint(self, directory: str, hf: bool = True) -> str:
        state = Path(directory) / self.role / "deepspeed" / "state"
        state.mkdir(parents=True)
        (state / "hf").write_text(str(hf))
        self.saved.append((directory, hf))
        return str(state.parent.parent)

    def load_checkpoint(self, directory: str) -> None:
        if self.unreadable or not (Path(directory) / self.role / "deepspeed" / "state").is_dir():
            raise FileNotFoundError(f"{self.role}: no checkpoint at {directory}")
        self.loaded.append(directory)

    def sync_weights(self, workers, version: int) -> dict:
        self.synced.append(version)
        return {}

    def shutdown(self) -> None:
        self.stopped = True


def fake_trainer(tmp_path: Path, snapshot=None, unreadable: bool = False, critic: bool = True):
    from collections import Counter
    from types import SimpleNamespace

    trainer = SimpleNamespace(
        cfg=SimpleNamespace(train=SimpleNamespace(max_learner_restarts=2)), run_dir=tmp_path / "run",
        faults=Counter(), learner_restarts=0, workers=["w0"], snapshot=snapshot, weight_version=7,
        policy=FakeGroup(), critic=FakeGroup("critic") if critic else None, built=[], resumed=[])

    def start_learners():
        trainer.policy = FakeGroup(unreadable=unreadable)
        trainer.critic = FakeGroup("critic", unreadable=unreadable) if critic else None
        trainer.built.append((trainer.policy, trainer.critic))

    def resume(checkpoint):
        trainer.resumed.append(checkpoint)
        trainer.weight_version = int(checkpoint.name.split("-")[1])
        return trainer.weight_version

    trainer.start_learners, trainer.resume = start_learners, resume
    (tmp_path / "run").mkdir(parents=True)
    return trainer


def test_snapshot_keeps_only_the_newest_state_without_hf_weights_and_removes_itself(tmp_path):
    from pipelines.learner_recovery import LearnerSnapshot

    stale = tmp_path / "searchrl-snapshot-run-1" / "step-9"
    stale.mkdir(parents=True)  # left by an earlier, killed process of the same run
    snap = LearnerSnapshot(tmp_path, "run-1")
    assert not stale.exists() and snap.path is None
    policy, critic = FakeGroup(), FakeGroup("critic")
    snap.save(1, [policy, critic])
    snap.save(2, [policy, critic])
    assert snap.step == 2 and sorted(p.name for p in snap.dir.iterdir()) == ["step-2"]
    assert policy.saved == [(str(snap.dir / "step-1"), False), (str(snap.dir / "step-2"), False)]
    snap.remove()
    assert not snap.dir.exists() and snap.path is None


def test_recovery_from_a_snapshot_redoes_only_the_failed_step(tmp_path):
    from pipelines.learner_recovery import LearnerSnapshot, recover_learners

    snap = LearnerSnapshot(tmp_path / "shm", "run")
    snap.save(5, [FakeGroup(), FakeGroup("critic")])
    trainer = fake_trainer(tmp_path, snap)
    old_policy = trainer.policy
    assert recover_learners(trainer, LearnerRankError("rank died"), step=5) == 5
    assert old_policy.stopped and trainer.policy is not old_policy
    assert trainer.policy.loaded == trainer.critic.loaded == [str(snap.dir / "step-5")]
    assert trainer.policy.synced == [5] and trainer.weight_version == 5 and trainer.resumed == []
    assert trainer.faults == {"learner_restarts": 1, "steps_redone": 0}


def test_unreadable_snapshot_falls_back_to_the_checkpoint_or_the_starting_model(tmp_path):
    from pipelines.learner_recovery import LearnerSnapshot, recover_learners

    snap = LearnerSnapshot(tmp_path / "shm", "run")
    snap.save(5, [FakeGroup(), FakeGroup("critic")])
    trainer = fake_trainer(tmp_path, snap, unreadable=True)  # rebuilt ranks on a node without the snapshot
    (trainer.run_dir / "checkpoints" / "step-4" / "policy" / "deepspeed" / "state").mkdir(parents=True)
    (trainer.run_dir / "checkpoints" / "step-4" / "trainer_state.json").write_text('{"step": 4}')
    assert recover_learners(trainer, LearnerRankError("rank died"), step=5) == 4
    assert trainer.resumed == [trainer.run_dir / "checkpoints" / "step-4"] and trainer.faults["steps_redone"] == 1

    trainer = fake_trainer(tmp_path / "b", snap, unreadable=True)  # no checkpoint either
    assert recover_learners(trainer, LearnerRankError("rank died"), step=5) == 0
    assert len(trainer.built) == 2  # rebuilt again: the half-loaded snapshot is not trained on
    assert trainer.policy.synced == [0] and trainer.faults["steps_redone"] == 5


def test_without_snapshot_or_checkpoint_recovery_starts_over_and_gives_up_after_the_limit(tmp_path):
    from pipelines.learner_recovery import recover_learners

    trainer = fake_trainer(tmp_path, critic=False)
    for _ in range(2):
        assert recover_learners(trainer, LearnerRankError("rank died"), step=3) == 0
    with pytest.raises(LearnerRankError, match="rank died"):
        recover_learners(trainer, LearnerRankError("rank died"), step=3)
    assert trainer.faults == {"learner_restarts": 3, "steps_redone": 6}


class SnapshotTrainer(DyingRankTrainer):
    """Recovers from a snapshot taken after every step: back to the failed step itself."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.snapshot, self.snapshots = object(), []

    def snapshot_learners(self, step: int) -> None:
        self.snapshots.append(step)

    def recover_learners(self, error: Exception, step: int) -> int:
        self.recoveries.append((step, max(self.snapshots[-1:] + self.saved[-1:], default=0)))  # the newer
        return self.recoveries[-1][1]


def test_loop_with_snapshots_redoes_only_the_failed_step(tmp_path):
    trainer = SnapshotTrainer(tmp_path, total=5, die_at=[2, 3], save_every=2)
    assert run(trainer) is None
    assert trainer.stepped == [0, 1, 2, 2, 3, 3, 4] and trainer.recoveries == [(2, 2), (3, 3)]
    assert trainer.snapshots == [1, 3]  # none at checkpoint steps 2, 4 and 5: the checkpoint is as new
    assert trainer.saved == [2, 4, 5] and trainer.logged == [1, 2, 3, 4, 5]


def test_a_newer_checkpoint_wins_over_the_snapshot_and_removes_it(tmp_path):
    from types import SimpleNamespace

    from pipelines.learner_recovery import LearnerSnapshot, recover_learners
    from pipelines.train import Trainer

    snap = LearnerSnapshot(tmp_path / "shm", "run")
    snap.save(3, [FakeGroup(), FakeGroup("critic")])
    trainer = fake_trainer(tmp_path, snap)
    (trainer.run_dir / "checkpoints" / "step-4" / "policy" / "deepspeed" / "state").mkdir(parents=True)
    (trainer.run_dir / "checkpoints" / "step-4" / "trainer_state.json").write_text('{"step": 4}')
    assert recover_learners(trainer, LearnerRankError("rank died"), step=4) == 4
    assert trainer.resumed == [trainer.run_dir / "checkpoints" / "step-4"] and trainer.policy.loaded == []

    owner = SimpleNamespace(run_dir=tmp_path / "run2", policy=FakeGroup(), critic=None, tracker=None, dev_f1={},
                            snapshot=snap, cfg=SimpleNamespace(train=SimpleNamespace(keep_checkpoints=1, keep_every=0)))
    Trainer.save(owner, 5)  # the real save: checkpoint, then the older snapshot goes
    assert (owner.run_dir / "checkpoints" / "step-5" / "trainer_state.json").is_file()
    assert snap.path is None and not snap.dir.exists()
