"""`pipelines.chaos_checks.check_run` on run directories written here: it counts lost and duplicated
(question, sample) pairs, notices a step with other questions than an uninterrupted run takes, a
step without metrics, and sums the `faults/*` metrics. Reads the real pack's train split."""

from __future__ import annotations

import gzip
import json

import pytest

from configs import load_config
from pipelines.chaos_checks import check_run, expected_questions


@pytest.fixture
def cfg(data_dir):
    return load_config("configs/s3_cpu.yaml", [f"data.dir={data_dir}", "train.questions_per_step=2",
                                               "rollout.samples_per_prompt=2", "train.stages=[]"])


def _write(run_dir, step, pairs, faults=0.0):
    (run_dir / "rollouts").mkdir(parents=True, exist_ok=True)
    with gzip.open(run_dir / "rollouts" / f"step-{step}.jsonl.gz", "wt") as f:
        for g, s in pairs:
            f.write(json.dumps({"group_id": g, "sample_index": s}) + "\n")
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "faults/rollout_worker_deaths": faults}) + "\n")


def _pairs(cfg, step):
    return [(q, s) for q in expected_questions(cfg, step) for s in range(2)]


def test_clean_run_passes_and_faults_are_summed(cfg, tmp_path):
    for step in (1, 2, 3):
        _write(tmp_path, step, _pairs(cfg, step), faults=1.0)
    check = check_run(tmp_path, cfg, 3)
    assert check.ok and check.faults == {"faults/rollout_worker_deaths": 3.0}
    assert expected_questions(cfg, 1) != expected_questions(cfg, 2)  # the order is per step


def test_lost_duplicated_reordered_and_missing_steps_are_found(cfg, tmp_path):
    _write(tmp_path, 1, _pairs(cfg, 1)[1:])  # one pair lost
    _write(tmp_path, 2, _pairs(cfg, 2) + _pairs(cfg, 2)[:1])  # one duplicated
    _write(tmp_path, 3, _pairs(cfg, 4))  # step 4's questions at step 3: the data order broke
    check = check_run(tmp_path, cfg, 4)
    assert (check.lost, check.duplicated, check.same_order, check.missing_steps) == (1 + 4, 1 + 4, False, [4])
    assert not check.ok


def test_fully_async_is_checked_over_the_whole_run(data_dir, tmp_path):
    """fully: a step may train groups scheduled for other steps (completion order); over the run each
    scheduled group (group_id "<question>#<0-based step>") trains once with every sample."""
    cfg = load_config("configs/s3_cpu.yaml", [f"data.dir={data_dir}", "train.questions_per_step=2",
                                              "rollout.samples_per_prompt=2", "train.stages=[]",
                                              "train.async_mode=fully"])
    groups = [(f"{q}#{step - 1}", s) for step in (1, 2, 3) for q in expected_questions(cfg, step) for s in range(2)]
    order = [groups[4:8], groups[0:4], groups[8:12]]  # step 2's groups finished first
    good = tmp_path / "good"
    for step, pairs in enumerate(order, start=1):
        _write(good, step, pairs)
    assert check_run(good, cfg, 3).ok
    bad = tmp_path / "bad"
    _write(bad, 1, groups[0:4])
    _write(bad, 2, groups[0:2] + groups[4:6])  # two pairs trained twice, so two others never
    _write(bad, 3, groups[8:12])
    check = check_run(bad, cfg, 3)
    assert (check.lost, check.duplicated, check.same_order) == (2, 2, True) and not check.ok
