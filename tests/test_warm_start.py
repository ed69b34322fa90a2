"""`train.warm_start` (issue 39): rejection-sampling fine-tuning on the untrained policy's best episodes."""

from __future__ import annotations

import pytest
import torch

from algorithms import AlgorithmConfig
from configs import load_config
from pipelines.train import question_visits
from pipelines.warm_start import kept_episodes, supervised_algorithm, supervised_batch, warm_start_questions


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
    assert question_visits(cfg, 0) == 0  # the dev curve starts at the untrained policy
    assert question_visits(cfg, 2) == 2 * 16 + 32  # the warm start's questions count once it ran
    assert question_visits(load_config("configs/s3_learn_cpu.yaml"), 2) == 32
    questions = [{"id": str(i)} for i in range(100)]
    assert warm_start_questions(questions, 10, seed=0) == warm_start_questions(questions, 10, seed=0)
    assert len(warm_start_questions(questions[:5], 10, seed=0)) == 5
