"""One-step off-policy training (`train.async_mode: one_step`): the next rollout runs during the update,
one version behind, on the same questions as a synchronous run; RolloutAhead's contract."""

from __future__ import annotations

import json
import threading
import time

import pytest

from pipelines.rollout_ahead import RolloutAhead, staleness_metrics
from tests.test_train import _rollouts, _rows, _tiny_run


def test_rollout_ahead_runs_in_the_background_and_hands_over_its_step():
    ahead = RolloutAhead()
    gate = threading.Event()
    ahead.start(3, lambda: (gate.wait(10), [{"qid": "a"}])[1])
    time.sleep(0.05)
    gate.set()  # the caller's thread went on meanwhile
    assert ahead.wait() >= 0.0
    assert ahead.take(3) == [{"qid": "a"}]
    assert ahead.take(3) is None  # handed over once

    ahead.start(4, lambda: [{"qid": "b"}])
    assert ahead.take(5) is None  # started for another step: the caller rolls out itself

    def fail():
        raise TimeoutError("rollout workers: 8 episodes")

    ahead.start(6, fail)
    with pytest.raises(TimeoutError, match="8 episodes"):
        ahead.take(6)
    ahead.start(7, fail)
    assert ahead.take(2) is None  # an error of a rollout nobody takes is not raised
    ahead.close()


def test_async_mode_off_survives_yaml():
    """YAML reads a bare `off` as false; the config still means the synchronous loop."""
    from configs.loader import load_config

    assert load_config("configs/main_cpu.yaml", ["train.async_mode=off"]).train.async_mode == "off"
    assert load_config("configs/main_cpu.yaml", ["train.async_mode=one_step"]).train.async_mode == "one_step"
    cfg = load_config("configs/main_cpu.yaml", ["train.async_mode=fully", "train.max_staleness=2"]).train
    assert (cfg.async_mode, cfg.max_staleness, cfg.in_flight_groups) == ("fully", 2, None)


def test_the_console_line_shows_the_async_figures():
    from pipelines.train_metrics import step_summary

    line = step_summary({"rollout/reward_mean": 0.25, "async/staleness_max": 1.0, "async/requeued": 2.0,
                         "async/partial_episodes": 3.0, "async/learner_idle_s": 4.2, "async/rollout_idle_s": 0.4})
    assert line.endswith("| stale 1 requeued 2 partial 3 idle learner 4s rollout 0s")
    assert "stale" not in step_summary({"rollout/reward_mean": 0.25})  # off mode


def test_staleness_counts_versions_behind_the_learner():
    trajs = [{"weight_version": 3}, {"weight_version": 2}, {"weight_version": 3}, {"weight_version": 3}]
    assert staleness_metrics(trajs, 3) == {"async/staleness_max": 1.0, "async/staleness_mean": 0.25,
                                           "async/partial_episodes": 0.0}
    assert staleness_metrics([], 0) == {"async/staleness_max": 0.0, "async/staleness_mean": 0.0,
                                        "async/partial_episodes": 0.0}
    # a partial rollout: its first turn sampled by version 1, its second started on version 2
    partial = {"weight_version": 1, "token_versions": [1, 1, 1, 2], "loss_mask": [1, 1, 0, 1],
               "turns": [{"weight_version": 1, "weight_version_end": 2}, {"weight_version": 2, "weight_version_end": 2}]}
    assert staleness_metrics([partial, {"weight_version": 2}], 3) == {
        "async/staleness_max": 2.0, "async/staleness_mean": 1.5, "async/partial_episodes": 1.0}


@pytest.mark.slow
@pytest.mark.heavy
def test_one_step_trains_the_same_questions_one_version_behind(ray_local, small_index, tiny_gemma_dir, tmp_path):
    from pipelines.train import train

    runs = {}
    for mode in ("off", "one_step"):
        cfg = _tiny_run("configs/search_r1_cpu.yaml", small_index, tiny_gemma_dir, tmp_path / mode,
                        f"train.async_mode={mode}", "algorithm.off_policy_correction=tis", "train.total_steps=3",
                        "train.eval_questions=0", "train.save_every=0")
        runs[mode] = train(cfg, progress=False)
    rows = _rows(runs["one_step"])[-3:]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]  # step 1 is rolled out before any update
    assert all(r["async/learner_idle_s"] >= 0 and r["actor/is_weight_mean"] > 0 for r in rows)
    assert "async/staleness_max" not in _rows(runs["off"])[-1]
    for step, version in ((2, 0), (3, 1)):  # sampled by the weights before the previous update
        episodes = _rollouts(runs["one_step"] / "rollouts" / f"step-{step}.jsonl.gz")
        assert {e["weight_version"] for e in episodes} == {version}
        same = _rollouts(runs["off"] / "rollouts" / f"step-{step}.jsonl.gz")
        key = sorted((e["group_id"], e["sample_index"]) for e in episodes)
        assert key == sorted((e["group_id"], e["sample_index"]) for e in same)  # nothing lost or doubled


@pytest.mark.slow
def test_fully_async_trains_every_group_once_within_the_bound(ray_local, small_index, tiny_gemma_dir, tmp_path):
    """fully: the run trains exactly the (question, sample) pairs a synchronous run schedules for its
    steps (`pipelines.chaos_checks.check_run` against `batch_indices`), each once, no batch past
    max_staleness, the tokens tagged with the versions that sampled them, and its checkpoint keeps the
    groups it trained for a resume."""
    from pipelines.chaos_checks import check_run
    from pipelines.train import train

    cfg = _tiny_run("configs/search_r1_cpu.yaml", small_index, tiny_gemma_dir, tmp_path / "fully",
                    "train.async_mode=fully", "train.max_staleness=1", "algorithm.off_policy_correction=tis",
                    "train.total_steps=4", "train.eval_questions=0", "train.save_every=2", "train.keep_checkpoints=2")
    run = train(cfg, progress=False)
    rows = _rows(run)[-4:]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["async/staleness_max"] <= 1 for r in rows) and all("async/requeued" in r for r in rows)
    assert all(r["async/rollout_idle_s"] >= 0 and r["async/learner_idle_s"] >= 0 for r in rows)
    for step in range(1, 5):
        for e in _rollouts(run / "rollouts" / f"step-{step}.jsonl.gz"):
            assert len(e["token_versions"]) == len(e["response_ids"])
            assert step - 1 - min(v for v, m in zip(e["token_versions"], e["loss_mask"]) if m) <= 1
    check = check_run(run, cfg, 4)  # each scheduled (question, sample) once, none lost
    assert check.ok and check.lost == check.duplicated == 0, check
    state = json.loads((run / "checkpoints" / "step-2" / "trainer_state.json").read_text())
    assert len(state["stream_committed"]) == 2 * 2  # 2 steps x 2 questions
