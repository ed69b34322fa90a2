"""A training run survives its rollout worker or a learner rank being killed (tiny Gemma policy on the
transformers backend, the real retrieval pool): the dead actor is rebuilt, its step's work redone once, and
`faults/*` metrics record it. Slow: a 3-step and a 2-step run."""

from __future__ import annotations

import json

import pytest

from tests.test_train import _tiny_run


@pytest.mark.slow
def test_killed_rollout_worker_then_learner_rank_are_rebuilt_and_their_steps_redone(small_index, tiny_gemma_dir,
                                                                                     tmp_path, monkeypatch):
    """One 3-step run, three faults (one run instead of three: each fault's checks are as they were alone).
    Step 1's weight sync: the rollout worker dies as the weights are sent; Ray restarts it and the weights
    are sent again (a long run once ended there). Step 2: the only rollout worker dies before its call; Ray
    restarts it with its starting weights, the step sees the stale episodes, re-syncs it and re-runs its part, and the batch holds each (question, sample) once.
    Step 3: a learner rank dies after the step-2 checkpoint; the learners are rebuilt from it and step 3 is
    redone once, never half-applied."""
    import ray

    from actors.learner.group import LearnerGroup
    from pipelines import train as train_mod

    original_rollout, original_step = train_mod.Trainer.rollout, train_mod.Trainer.step
    original_sync = LearnerGroup.sync_weights
    killed = []

    def sync_weights(self, rollout_workers, version):
        if version == 1 and "sync" not in killed:  # step 1's sync: the worker dies as it is sent the weights
            ray.kill(rollout_workers[0], no_restart=False)
            killed.append("sync")
        return original_sync(self, rollout_workers, version)

    def rollout(self, examples, recipe_options, n, temperature, seed):
        if self.weight_version == 1 and "worker" not in killed:  # step 2: the worker dies before its call
            ray.kill(self.workers[0], no_restart=False)
            killed.append("worker")
        return original_rollout(self, examples, recipe_options, n, temperature, seed)

    def step(self, step):
        if step == 2 and "rank" not in killed:  # the rank dies during step 3, after the step-2 checkpoint
            ray.kill(self.policy.actors[0])
            killed.append("rank")
        return original_step(self, step)

    monkeypatch.setattr(train_mod.Trainer, "rollout", rollout)
    monkeypatch.setattr(train_mod.Trainer, "step", step)
    monkeypatch.setattr(LearnerGroup, "sync_weights", sync_weights)
    cfg = _tiny_run("configs/r1_searcher_cpu.yaml", small_index, tiny_gemma_dir, tmp_path, "train.total_steps=3",
                    "train.stages=[]", "train.eval_questions=0", "rollout.num_workers=1", "train.save_every=1")
    run_dir = train_mod.train(cfg, progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert killed == ["sync", "worker", "rank"] and [r["step"] for r in rows] == [1, 2, 3]  # step 3 redone once
    assert rows[0]["faults/rollout_worker_deaths"] == 1, rows[0]  # the sync's death: waited for, weights sent again
    recovered = rows[1]["faults/rollout_stale_parts"] + rows[1]["faults/rollout_worker_deaths"]
    assert rows[0]["faults/rollout_stale_parts"] == 0 and recovered >= 1, rows[1]  # restarted and seen, or died mid-call
    assert rows[1]["rollout/episodes"] == 4  # 2 questions x 2 samples, none lost or duplicated
    # each restarted worker process counts itself once, whether a call saw the death or not
    assert [r["faults/rollout_worker_restarts"] for r in rows] == [1, 1, 0], rows
    assert rows[2]["faults/learner_restarts"] == 1 and rows[2]["faults/steps_redone"] == 0, rows[2]
    assert (run_dir / "checkpoints" / "step-3").is_dir()


@pytest.mark.slow
@pytest.mark.heavy  # an option (the soak config's); CI keeps the default, checkpoint recovery (above)
def test_killed_learner_rank_rebuilds_from_the_in_memory_snapshot(small_index, tiny_gemma_dir, tmp_path, monkeypatch):
    """`train.learner_recovery: snapshot` and no checkpoint before the end: the rank dies during step
    2, the rebuilt learners load the snapshot of step 1 and only step 2 is redone (from the last
    checkpoint, there being none, the run would start over); the snapshot folder is gone afterwards."""
    import ray

    from pipelines import train as train_mod

    original = train_mod.Trainer.step
    killed, snapshot_dirs = [], []

    def step(self, step):
        if step == 1 and not killed:
            snapshot_dirs.append(sorted(p.name for p in self.snapshot.dir.iterdir()))
            ray.kill(self.policy.actors[0])
            killed.append(1)
        return original(self, step)

    monkeypatch.setattr(train_mod.Trainer, "step", step)
    cfg = _tiny_run("configs/r1_searcher_cpu.yaml", small_index, tiny_gemma_dir, tmp_path, "train.total_steps=2",
                    "train.stages=[]", "train.eval_questions=0", "train.save_every=0",
                    "train.learner_recovery=snapshot", f"train.snapshot_dir={tmp_path / 'shm'}")
    run_dir = train_mod.train(cfg, progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert killed and snapshot_dirs == [["step-1"]]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["faults/learner_restarts"] == 1 and rows[1]["faults/steps_redone"] == 0, rows[1]
    assert not (run_dir / "checkpoints" / "step-1").exists() and (run_dir / "checkpoints" / "step-2").is_dir()
    assert not any((tmp_path / "shm").iterdir())  # the run removed its snapshot
