"""`train.warm_start`: rejection-sampling fine-tuning on the untrained policy's best episodes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from algorithms import AlgorithmConfig
from configs import load_config
from pipelines.train import question_visits
from pipelines.warm_start import (kept_episodes, kept_questions, supervised_algorithm, supervised_batch, warm_start,
                                  warm_start_questions)


def episode(reward, mask=(1, 1, 0, 1), group="q0"):
    n = len(mask)
    return {"prompt_ids": [2, 5, 6], "response_ids": list(range(10, 10 + n)), "loss_mask": list(mask),
            "logprobs": [0.0] * n, "group_id": group, "reward": reward}


def test_kept_episodes_beat_the_threshold_and_hold_policy_tokens():
    trajs = [episode(0.2), episode(0.0), episode(-0.1), episode(None), episode(0.5, mask=(0, 0, 0, 0))]
    assert kept_episodes(trajs, 0.0) == [trajs[0]]  # s3: a gain over naive RAG, strictly
    assert kept_episodes(trajs, -0.5) == trajs[:3]


def test_supervised_batch_fills_whole_mini_batches_with_advantage_one_on_policy_tokens():
    trajs = [episode(0.3, group="a"), episode(0.4, mask=(1, 0, 1), group="b"), episode(0.9, group="c")]
    batch = supervised_batch(trajs, mini_batch_size=4, pad_token_id=0, epochs=2)
    assert batch.size == 8  # 3 x 2 epochs = 6, cycled up to 8
    assert batch.group_ids == ["a", "b", "c", "a", "b", "c", "a", "b"]
    assert torch.equal(batch.advantages, batch.loss_mask) and batch.old_logprobs is not None
    with pytest.raises(ValueError, match="no trajectories"):
        supervised_batch([], 4, 0)


def test_the_supervised_pass_has_no_kl_entropy_or_skipping():
    algo = supervised_algorithm(AlgorithmConfig(kl_coef=0.001, entropy_coef=0.01, clip_eps=0.2))
    assert (algo.kl_coef, algo.entropy_coef, algo.skip_zero_advantage, algo.clip_eps) == (0.0, 0.0, False, 0.2)


def test_warm_start_config_and_visits():
    cfg = load_config("configs/s3_learn_cpu.yaml", ["train.warm_start={questions: 32, samples: 4}"])
    assert cfg.train.warm_start.min_reward == 0.0 and cfg.train.warm_start.epochs == 1
    assert question_visits(cfg, 0, 20) == 0  # the dev curve starts at the untrained policy
    assert question_visits(cfg, 2, 20) == 2 * 16 + 20  # the questions the warm start trained on, once it ran
    assert question_visits(cfg, 2) == question_visits(load_config("configs/s3_learn_cpu.yaml"), 2) == 32
    questions = [{"id": str(i)} for i in range(100)]
    assert warm_start_questions(questions, 10, seed=0) == warm_start_questions(questions, 10, seed=0)
    assert len(warm_start_questions(questions[:5], 10, seed=0)) == 5


class FakePolicy:
    """The policy LearnerGroup's surface the warm start and the checkpoints use, recorded."""

    def __init__(self):
        self.updated, self.synced, self.saved = [], [], []

    def update(self, batch, algorithm, lr=None):
        self.updated.append(batch.size)
        return {"policy_loss": 1.0, "optimizer_steps": 1.0}

    def sync_weights(self, workers, version):
        self.synced.append(version)
        return {}

    def save_hf(self, directory):
        self.saved.append(directory)

    def save_checkpoint(self, directory):
        (Path(directory) / "policy").mkdir(parents=True)

    def load_checkpoint(self, directory):
        pass


def warm_trainer(tmp_path, cfg, rewards):
    """A Trainer stand-in whose rollout gives question i's samples the rewards `rewards[i]` (group `q<i>`)."""
    def rollout(examples, options, n, temperature, seed, expert=False):
        return [{**episode(rewards[int(ex["id"])][k], group=f"q{ex['id']}"), "finish_reason": "answer"}
                for ex in examples for k in range(n)]

    return SimpleNamespace(cfg=cfg, run_dir=tmp_path, policy=FakePolicy(), critic=None, reference=None, workers=[],
                           weight_version=0, warm_questions=0.0, pad_token_id=0, rollout=rollout, tracker=None,
                           snapshot=None, dev_f1={},
                           questions=lambda file: [{"id": str(i)} for i in range(len(rewards))],
                           training_questions=no_learnable_selection)


def no_learnable_selection(file, options):
    """The warm start draws from the whole training pool: the learnable questions are chosen after it, by the
    warm-started policy (a selection by the untrained policy once left the warm start 12 demonstrations)."""
    raise AssertionError("the warm start asked for the learnable questions")


def test_the_visits_count_the_questions_the_warm_start_kept_and_survive_resume(tmp_path):
    """`train/question_visits` once counted `warm_start.questions` (192 in the main job) while 126 were
    kept; the warm start now counts the questions with a kept episode, and a checkpoint carries the count."""
    from pipelines.trainer_checkpoint import load_checkpoint, save_checkpoint

    cfg = load_config("configs/s3_learn_cpu.yaml", ["train.warm_start={questions: 4, samples: 2}"])
    assert kept_questions([episode(1, group="a"), episode(1, group="a"), episode(1, group="b")]) == 2
    # q0: both samples kept, q1: one, q2 and q3: none -> 3 episodes of 2 questions, of the 4 tried
    trainer = warm_trainer(tmp_path, cfg, [(0.5, 0.4), (0.5, 0.0), (0.0, 0.0), (-1.0, 0.0)])
    out = warm_start(trainer)
    assert (out["warm_start/episodes"], out["warm_start/kept"], out["warm_start/kept_questions"]) == (8.0, 3.0, 2.0)
    assert trainer.warm_questions == 2.0 and trainer.policy.updated
    assert question_visits(cfg, 1, trainer.warm_questions) == 16 + 2  # not 16 + 4

    save_checkpoint(trainer, 1)
    resumed = warm_trainer(tmp_path, cfg, [])
    assert load_checkpoint(resumed, tmp_path / "checkpoints" / "step-1") == 1
    assert resumed.warm_questions == 2.0  # the warm start does not run again on --resume
    state_file = tmp_path / "checkpoints" / "step-1" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["warm_start_questions"]  # a checkpoint from before the count was saved: the count its run logged
    state_file.write_text(json.dumps(state))
    load_checkpoint(resumed, tmp_path / "checkpoints" / "step-1")
    assert resumed.warm_questions == 4.0

    nothing = warm_trainer(tmp_path / "none", cfg, [(0.0, 0.0)] * 4)
    assert warm_start(nothing)["warm_start/kept_questions"] == 0.0
    assert nothing.warm_questions == 0.0 and not nothing.policy.updated  # nothing trained, nothing visited


def test_expert_demonstrations_dropped_for_a_turn_over_the_limit_are_counted_and_named(tmp_path, caplog):
    """An expert turn longer than `rollout.max_new_tokens_per_turn` demonstrates nothing; the warm start counts
    those episodes (`warm_start/turn_over_limit`) and names the limit, instead of leaving them to look like
    questions the expert could not answer."""
    from actors.rollout.agent_loop import EXPERT_TURN_OVER_LIMIT, NO_DEMONSTRATION

    cfg = load_config("configs/s3_learn_cpu.yaml", ["train.warm_start={source: expert, questions: 3}"])
    trainer = warm_trainer(tmp_path, cfg, [(1.0,), (0.0,), (0.0,)])
    reasons = {"0": "complete", "1": EXPERT_TURN_OVER_LIMIT, "2": NO_DEMONSTRATION}
    trainer.rollout = lambda examples, options, n, temperature, seed, expert=False: [
        {**episode(1.0 if ex["id"] == "0" else None, group=f"q{ex['id']}"), "finish_reason": reasons[ex["id"]]}
        for ex in examples]
    with caplog.at_level("WARNING", logger="pipelines.warm_start"):
        out = warm_start(trainer)
    assert (out["warm_start/kept"], out["warm_start/turn_over_limit"]) == (1.0, 1.0)
    assert "1 of 3 expert demonstrations were dropped" in caplog.text
    assert f"rollout.max_new_tokens_per_turn ({cfg.rollout.max_new_tokens_per_turn})" in caplog.text
