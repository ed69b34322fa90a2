"""A training run survives its rollout worker being killed between steps (tiny Gemma policy on the
transformers backend, the real retrieval pool): Ray restarts the worker with its starting weights,
the step notices the episodes came from old weights, re-syncs the worker, re-runs its part, and the
step's batch holds each (question, sample) pair once; `faults/*` metrics record it. Slow: a 2-step run."""

from __future__ import annotations

import json

import pytest

from tests.test_train import _tiny_run


@pytest.mark.slow
def test_killed_rollout_worker_is_restarted_resynced_and_rerun(small_index, tiny_gemma_dir, tmp_path, monkeypatch):
    import ray

    from pipelines import train as train_mod

    original = train_mod.Trainer.rollout
    killed = []

    def rollout(self, examples, recipe_options, n, temperature, seed):
        if self.weight_version == 1 and not killed:  # step 2: the worker dies before its call
            ray.kill(self.workers[0], no_restart=False)
            killed.append(1)
        return original(self, examples, recipe_options, n, temperature, seed)

    monkeypatch.setattr(train_mod.Trainer, "rollout", rollout)
    cfg = _tiny_run("configs/r1_searcher_cpu.yaml", small_index, tiny_gemma_dir, tmp_path, "train.total_steps=2",
                    "train.stages=[]", "train.eval_questions=0", "rollout.num_workers=1")
    run_dir = train_mod.train(cfg, progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert killed and [r["step"] for r in rows] == [1, 2]
    recovered = rows[1]["faults/rollout_stale_parts"] + rows[1]["faults/rollout_worker_deaths"]
    assert rows[0]["faults/rollout_stale_parts"] == 0 and recovered >= 1, rows[1]  # restarted and seen, or died mid-call
    assert rows[1]["rollout/episodes"] == 4  # 2 questions x 2 samples, none lost or duplicated


@pytest.mark.slow
def test_killed_learner_rank_rebuilds_from_checkpoint_and_redoes_the_step(small_index, tiny_gemma_dir, tmp_path,
                                                                          monkeypatch):
    import ray

    from pipelines import train as train_mod

    original = train_mod.Trainer.step
    killed = []

    def step(self, step):
        if step == 1 and not killed:  # the rank dies during step 2, after the step-1 checkpoint
            ray.kill(self.policy.actors[0])
            killed.append(1)
        return original(self, step)

    monkeypatch.setattr(train_mod.Trainer, "step", step)
    cfg = _tiny_run("configs/r1_searcher_cpu.yaml", small_index, tiny_gemma_dir, tmp_path, "train.total_steps=2",
                    "train.stages=[]", "train.eval_questions=0", "train.save_every=1")
    run_dir = train_mod.train(cfg, progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert killed and [r["step"] for r in rows] == [1, 2]  # step 2 redone once, never half-applied
    assert rows[1]["faults/learner_restarts"] == 1 and rows[1]["faults/steps_redone"] == 0, rows[1]
    assert (run_dir / "checkpoints" / "step-2").is_dir()


@pytest.mark.slow
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
