"""Every `advantage_estimator` branch of `compute_advantages`, against numbers worked out by hand.

One batch for the group estimators: groups "a" (rewards 1, 0) and "b" (0.5, 0.5); rows have an
observation in the middle (row 0), padding (rows 1-2) or neither (row 3), 8 policy tokens in all.
"""

from __future__ import annotations

import math

import pytest
import torch

from algorithms import AlgorithmConfig, compute_advantages

REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.5])
IDS = ["a", "a", "b", "b"]
MASK = torch.tensor([[1, 0, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])


def per_row(*row_values: float) -> torch.Tensor:
    """Each row's value on its policy tokens, 0 elsewhere."""
    return torch.tensor(row_values)[:, None] * MASK


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), atol=1e-5, rtol=1e-5)


def run(**cfg):
    return compute_advantages(AlgorithmConfig(**cfg), REWARDS, MASK, group_ids=IDS)


def test_grpo_divides_by_the_unbiased_group_std():
    # group a: mean .5, unbiased std sqrt((.25 + .25) / 1) = 1/sqrt(2): (1 - .5) * sqrt(2) = .7071; group b: 0
    adv, _ = run(advantage_estimator="grpo", grpo_eps=0.0)
    close(adv, per_row(0.5 * math.sqrt(2), -0.5 * math.sqrt(2), 0, 0))


def test_dr_grpo_is_the_centred_reward_with_the_token_sum_loss():
    # Dr.GRPO §3.2: r - group mean, no std; loss_agg seq_mean_token_sum unless set otherwise.
    cfg = AlgorithmConfig(advantage_estimator="dr_grpo")
    assert cfg.loss_agg == "seq_mean_token_sum" and not cfg.should_whiten
    adv, ret = run(advantage_estimator="dr_grpo")
    close(adv, per_row(0.5, -0.5, 0, 0))
    close(ret, adv)
    assert AlgorithmConfig(advantage_estimator="dr_grpo", loss_agg="token_mean").loss_agg == "token_mean"
    assert AlgorithmConfig(advantage_estimator="grpo").loss_agg == "token_mean"


def test_rloo_is_the_reward_minus_the_others_mean():
    # group a: 1 - 0 = 1 and 0 - 1 = -1; group b: .5 - .5 = 0. Not whitened.
    adv, _ = run(advantage_estimator="rloo")
    close(adv, per_row(1, -1, 0, 0))


def test_group_mean_is_centred_then_whitened_over_the_batch():
    # R1-Searcher's Reinforce++ baseline: scores .5, -.5, 0, 0 on 2 + 2 + 1 + 3 tokens; over the 8 tokens
    # mean 0, population var (4 x .25) / 8 = .125, so .5 / sqrt(.125) = sqrt(2).
    adv, ret = run(advantage_estimator="group_mean", kl_coef=0.0)
    close(adv, per_row(math.sqrt(2), -math.sqrt(2), 0, 0))
    close(ret, per_row(0.5, -0.5, 0, 0))  # the un-whitened return-to-go


def test_group_mean_with_kl_in_the_reward():
    # k1 KL of 1 on every policy token, beta = 0.1: each token's reward drops by .1, so the return-to-go
    # (gamma 1) of a row's token is its score minus .1 x (policy tokens from it to the end).
    logp, ref = MASK.float(), torch.zeros(4, 3)
    cfg = AlgorithmConfig(advantage_estimator="group_mean", kl_coef=0.1, kl_estimator="k1", kl_in_reward=True,
                          whiten_advantages=False)
    adv, _ = compute_advantages(cfg, REWARDS, MASK, group_ids=IDS, logprobs=logp, ref_logprobs=ref)
    close(adv, torch.tensor([[0.5 - 0.2, 0, 0.5 - 0.1], [-0.5 - 0.2, -0.5 - 0.1, 0], [-0.1, 0, 0], [-0.3, -0.2, -0.1]]))


def test_reinforce_pp_return_to_go_across_an_observation_with_kl_then_whitening():
    # Reinforce++ (Hu 2025): row 0 = tokens t0, t1, [observation], t3, reward 1; row 1 = two tokens, reward 0.
    # k1 = logp - ref = .2, -.4, (masked), .6 on row 0, 0 on row 1; beta = .1, gamma = .5:
    # token rewards -.02, .04, -, 1 - .06 = .94; G3 = .94, G1 = .04 + .5 x .94 = .51, G0 = -.02 + .5 x .51 = .235.
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]])
    logp = torch.tensor([[0.2, -0.4, 9.0, 0.6], [0.0, 0.0, 0.0, 0.0]])
    cfg = AlgorithmConfig(advantage_estimator="reinforce_pp", gamma=0.5, kl_coef=0.1, kl_estimator="k1",
                          kl_in_reward=True)
    assert cfg.should_whiten
    adv, ret = compute_advantages(cfg, torch.tensor([1.0, 0.0]), mask, logprobs=logp, ref_logprobs=torch.zeros(2, 4))
    close(ret, torch.tensor([[0.235, 0.51, 0, 0.94], [0, 0, 0, 0]]))
    # whitened over the 5 policy tokens: mean 1.685 / 5 = .337
    g = [0.235, 0.51, 0.94, 0.0, 0.0]
    mean = sum(g) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in g) / 5)
    z = [(x - mean) / std for x in g]
    close(adv, torch.tensor([[z[0], z[1], 0, z[2]], [z[3], z[4], 0, 0]]))
    with pytest.raises(ValueError, match="kl_in_reward=True needs"):
        compute_advantages(cfg, torch.tensor([1.0, 0.0]), mask)
