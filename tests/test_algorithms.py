"""Tests for algorithms/: expected values are computed by hand (arithmetic in the comments)."""

from __future__ import annotations

import ast
import inspect
import math
import typing
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGS,
    AlgorithmConfig,
    aggregate,
    compute_advantages,
    entropy_from_logits,
    entropy_loss,
    gae,
    get_advantage_estimator,
    get_kl_estimator,
    get_loss_agg,
    group_indices,
    group_mean_baseline_advantages,
    grpo_advantages,
    kl_estimate,
    kl_loss,
    kl_penalized_rewards,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    nll_loss,
    policy_loss,
    register_advantage_estimator,
    reinforce_pp_advantages,
    rloo_advantages,
    terminal_rewards,
    value_loss,
)
from algorithms.config import AdvantageEstimator, KLEstimator, LossAgg
from tests.algorithm_presets import RECIPE_PRESETS

NAN = float("nan")
FAST = settings(max_examples=25, deadline=None)


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


# --------------------------------------------------------------------------- package hygiene


def test_no_heavy_imports():
    heavy = {"ray", "vllm", "deepspeed", "transformers"}
    for path in (Path(__file__).resolve().parents[1] / "algorithms").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & heavy, f"{path.name} imports {names}"


# --------------------------------------------------------------------------- masked


def test_masked_reductions_by_hand():
    x = t([[1.0, 2.0, 1e9], [3.0, NAN, NAN]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    close(masked_sum(x, m), 6.0)  # 1 + 2 + 3
    close(masked_mean(x, m), 2.0)  # 6 / 3
    close(masked_mean(x, m, dim=1), [1.5, 3.0])
    close(masked_var(x, m), 1.0)  # ((1-2)^2 + 0 + (3-2)^2) / (3 - 1)
    close(masked_var(x, m, unbiased=False), 2.0 / 3.0)
    w = masked_whiten(x, m)
    close(w, [[-1.0 / math.sqrt(2 / 3), 0.0, 0.0], [1.0 / math.sqrt(2 / 3), 0.0, 0.0]])


def test_masked_empty_mask_gives_zero_not_nan():
    x = t([[NAN, 1.0]])
    m = torch.zeros(1, 2)
    for value in (masked_sum(x, m), masked_mean(x, m), masked_var(x, m), masked_whiten(x, m).sum()):
        assert value.item() == 0.0
    close(masked_mean(t([[1.0, 2.0], [5.0, 6.0]]), t([[0, 0], [1, 0]]), dim=1), [0.0, 5.0])


def test_masked_shape_error_names_argument():
    with pytest.raises(ValueError, match="`mask` has shape"):
        masked_mean(torch.zeros(2, 3), torch.ones(2, 4))


# --------------------------------------------------------------------------- KL, logits


def test_kl_estimators_by_hand():
    logp, ref = t([[-1.0, -2.0]]), t([[-1.5, -1.0]])  # log-ratio = [0.5, -1.0]
    close(kl_estimate(logp, ref, "k1"), [[0.5, -1.0]])
    close(kl_estimate(logp, ref, "k2"), [[0.125, 0.5]])  # 0.5 * 0.25, 0.5 * 1
    # k3 = exp(-lr) + lr - 1: exp(-0.5) - 0.5 = 0.1065307; exp(1) - 2 = 0.7182818
    close(kl_estimate(logp, ref, "k3"), [[0.1065307, 0.7182818]])
    with pytest.raises(ValueError, match="unknown `kl_estimator` 'k4'; registered: k1, k2, k3"):
        kl_estimate(logp, ref, "k4")


def test_kl_masked_positions_are_zero_and_nan_free():
    logp, ref = t([[-1.0, NAN]]), t([[-1.5, 0.0]])
    out = kl_estimate(logp, ref, "k3", loss_mask=t([[1, 0]]))
    close(out, [[0.1065307, 0.0]])


@FAST
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=8), st.lists(st.floats(-50, 50), min_size=1, max_size=8))
def test_k3_non_negative_and_finite(a, b):
    n = min(len(a), len(b))
    k3 = kl_estimate(t([a[:n]]), t([b[:n]]), "k3")
    assert torch.isfinite(k3).all() and (k3 >= 0).all()


def test_logprobs_and_entropy_from_logits():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [1000.0, 0.0, -1000.0, 0.0]]], dtype=torch.bfloat16)
    labels = torch.tensor([[2, 0]])
    lp = logprobs_from_logits(logits, labels)
    assert lp.dtype == torch.float32
    close(lp, [[math.log(0.25), 0.0]])  # uniform over 4; a 1000-logit gap is a sure token
    close(entropy_from_logits(logits), [[math.log(4.0), 0.0]])
    banned = torch.tensor([[0.0, 0.0, -math.inf]], requires_grad=True)  # -inf logits: no NaN
    h = entropy_from_logits(banned)
    h.sum().backward()
    close(h.detach(), [math.log(2.0)])
    assert torch.isfinite(banned.grad).all()
    with pytest.raises(ValueError, match="`labels`"):
        logprobs_from_logits(logits, labels.int())


# --------------------------------------------------------------------------- terminal rewards, group ids


def test_terminal_rewards_last_policy_token():
    mask = t([[1, 1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    out = terminal_rewards(t([1.0, 2.0, 3.0]), mask)
    # row 0: last mask-1 token is index 4 (an observation/padding follows); row 2 has none: nothing
    close(out, [[0, 0, 0, 0, 1, 0, 0], [0, 2, 0, 0, 0, 0, 0], [0] * 7])


def test_group_indices_first_appearance():
    assert group_indices(["b", "a", "b", ("x", 1)]).tolist() == [0, 1, 0, 2]
    assert group_indices(torch.tensor([7, 7, 3])).tolist() == [0, 0, 1]


# --------------------------------------------------------------------------- GAE


def test_gae_masked_span_in_the_middle_by_hand():
    # Row 0: turn (t0, t1) | observation (t2, t3) | turn (t4, t5); reward 1 on t5.  The reward 100
    # and the NaN/9 values at the observation must be ignored.  Policy sub-sequence:
    # V = [.5, .4, .6, .7], r = [0, 0, 0, 1]; gamma = .9, lam = .8, gamma*lam = .72.
    #   t5: delta = 1 + .9*0 - .7 = .3                   A = .3
    #   t4: delta = 0 + .9*.7 - .6 = .03                 A = .03 + .72*.3 = .246
    #   t1: delta = 0 + .9*.6 - .4 = .14 (next = t4)     A = .14 + .72*.246 = .31712
    #   t0: delta = 0 + .9*.4 - .5 = -.14                A = -.14 + .72*.31712 = .0883264
    # Row 1: 3 policy tokens then padding; V = 0, r = 2 on t2:
    #   A = [2*.72^2, 2*.72, 2] = [1.0368, 1.44, 2]
    rewards = t([[0, 0, 100, 0, 0, 1], [0, 0, 2, 0, 0, 0]])
    values = t([[0.5, 0.4, NAN, 9.0, 0.6, 0.7], [0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    close(adv, [[0.0883264, 0.31712, 0, 0, 0.246, 0.3], [1.0368, 1.44, 2.0, 0, 0, 0]])
    close(ret, [[0.5883264, 0.71712, 0, 0, 0.846, 1.0], [1.0368, 1.44, 2.0, 0, 0, 0]])  # A + V
    assert not adv.requires_grad and torch.isfinite(adv).all()


def test_gae_lam_one_is_discounted_return_minus_value_across_span():
    # lam = 1: return of policy token k (of 4) = .9^(3-k) * 1 = [.729, .81, .9, 1]; the token
    # right before the observation (t1) gets .81, not 0 (resetting at the span would give 0).
    rewards = t([[0, 0, 0, 0, 0, 1]])
    values = t([[0.5, 0.4, 9.0, 9.0, 0.6, 0.7]])
    mask = t([[1, 1, 0, 0, 1, 1]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=1.0)
    close(ret, [[0.729, 0.81, 0, 0, 0.9, 1.0]])
    close(adv, [[0.229, 0.41, 0, 0, 0.3, 0.3]])  # return - value


def _reference_gae(rewards, values, mask, gamma, lam):
    """Plain python GAE over the list of policy positions of one row."""
    pos = [i for i, m in enumerate(mask) if m]
    adv = [0.0] * len(mask)
    running = 0.0
    for k in reversed(range(len(pos))):
        nxt = values[pos[k + 1]] if k + 1 < len(pos) else 0.0
        running = rewards[pos[k]] + gamma * nxt - values[pos[k]] + gamma * lam * running
        adv[pos[k]] = running
    return adv


@FAST
@given(
    st.lists(st.tuples(st.booleans(), st.floats(-2, 2), st.floats(-2, 2)), min_size=1, max_size=12),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_gae_matches_reference(tokens, gamma, lam):
    mask, rewards, values = (list(c) for c in zip(*tokens))
    adv, ret = gae(t([rewards]), t([values]), torch.tensor([mask]), gamma, lam)
    expected = _reference_gae(rewards, values, mask, gamma, lam)
    close(adv[0], expected, atol=1e-4)
    close(ret[0], [a + v if m else 0.0 for a, v, m in zip(expected, values, mask)], atol=1e-4)


def test_gae_errors_name_argument():
    with pytest.raises(ValueError, match="`values`"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="`gamma`"):
        gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), gamma=1.5)


# --------------------------------------------------------------------------- group estimators

IDS = ["q1", "q2", "q1", "q2", "q2"]  # interleaved; q1 has 2 samples, q2 has 3
REWARDS = [1.0, 0.0, 0.0, 1.0, 2.0]
MASK = t([[1, 0, 1], [1, 1, 1], [1, 1, 0], [0, 0, 1], [1, 0, 0]])


def test_grpo_by_hand_interleaved_string_groups():
    # q1 = {1, 0}: mean .5, unbiased std = sqrt((.25 + .25) / 1) = .7071068 -> +-.5/.7071068 = +-.7071068
    # q2 = {0, 1, 2}: mean 1, unbiased std = sqrt((1 + 0 + 1) / 2) = 1 -> -1, 0, 1
    adv = grpo_advantages(t(REWARDS), IDS, MASK, eps=0.0)
    seq = torch.tensor([0.7071068, -1.0, -0.7071068, 0.0, 1.0])
    close(adv, seq[:, None] * MASK)


def test_dr_grpo_and_group_mean_by_hand():
    # r - group mean: q1 mean .5, q2 mean 1 -> [.5, -1, -.5, 0, 1]
    expected = torch.tensor([0.5, -1.0, -0.5, 0.0, 1.0])[:, None] * MASK
    close(grpo_advantages(t(REWARDS), IDS, MASK, scale_by_std=False), expected)
    close(group_mean_baseline_advantages(t(REWARDS), IDS, MASK), expected)


def test_rloo_by_hand():
    # q1: 1 - 0 = 1; 0 - 1 = -1.  q2: 0 - (1+2)/2 = -1.5; 1 - (0+2)/2 = 0; 2 - (0+1)/2 = 1.5
    close(rloo_advantages(t(REWARDS), IDS, MASK), torch.tensor([1.0, -1.5, -1.0, 0.0, 1.5])[:, None] * MASK)


def test_group_degenerate_cases_give_zero_not_nan():
    mask = torch.ones(4, 2)
    equal = t([0.1, 0.1, 0.1, 0.7])  # group "a" all equal (mean has rounding error), "b" size 1
    ids = ["a", "a", "a", "b"]
    for adv in (
        grpo_advantages(equal, ids, mask),
        grpo_advantages(equal, ids, mask, eps=0.0),
        grpo_advantages(equal, ids, mask, scale_by_std=False),
        rloo_advantages(equal, ids, mask),
        group_mean_baseline_advantages(equal, ids, mask),
    ):
        assert torch.equal(adv, torch.zeros(4, 2))


def test_group_errors_name_argument():
    with pytest.raises(ValueError, match="`group_ids`"):
        grpo_advantages(t([1.0, 0.0]), ["a"], torch.ones(2, 2))
    with pytest.raises(ValueError, match="`seq_rewards`"):
        grpo_advantages(t([1.0, NAN]), ["a", "a"], torch.ones(2, 2))
    with pytest.raises(ValueError, match="`seq_rewards`"):
        grpo_advantages(t([1.0, 0.0, 1.0]), ["a", "a", "a"], torch.ones(2, 2))


@FAST
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(-5, 5)), min_size=1, max_size=16))
@example(samples=[(0, -4.140625), (0, -4.140426207424808)])  # float32 centring left a mean of 1.7e-3
def test_grpo_zero_group_mean(samples):
    ids = [g for g, _ in samples]
    rewards = t([r for _, r in samples])
    mask = torch.ones(len(ids), 1)
    for adv in (grpo_advantages(rewards, ids, mask)[:, 0], rloo_advantages(rewards, ids, mask)[:, 0]):
        assert torch.isfinite(adv).all()
        for g in set(ids):
            members = adv[torch.tensor([i == g for i in ids])]
            assert abs(members.mean().item()) < 1e-4


# --------------------------------------------------------------------------- Reinforce++, KL in reward


def test_reinforce_pp_return_to_go_across_span_and_whitening():
    # gamma = .5.  Row 0 policy tokens t0, t3, t4 with r = [0, -.1, 1] (5 on the observation is
    # ignored): G4 = 1, G3 = -.1 + .5*1 = .4, G0 = 0 + .5*.4 = .2.  Row 1: G1 = 2, G0 = .5*2 = 1.
    rewards = t([[0, 5, 0, -0.1, 1], [0, 2, 0, 0, 0]])
    mask = t([[1, 0, 0, 1, 1], [1, 1, 0, 0, 0]])
    adv, ret = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    close(ret, [[0.2, 0, 0, 0.4, 1.0], [1.0, 2.0, 0, 0, 0]])
    # Whitening over the 5 policy tokens: mean = 4.6/5 = .92, population var = (.72^2 + .52^2 +
    # .08^2 + .08^2 + 1.08^2)/5 = 1.968/5 = .3936.
    s = math.sqrt(0.3936)
    close(adv, [[-0.72 / s, 0, 0, -0.52 / s, 0.08 / s], [0.08 / s, 1.08 / s, 0, 0, 0]], atol=1e-4)
    assert abs(masked_mean(adv, mask).item()) < 1e-6
    assert abs(masked_var(adv, mask, unbiased=False).item() - 1.0) < 1e-4
    raw, _ = reinforce_pp_advantages(rewards, mask, gamma=0.5, whiten=False)
    close(raw, ret)


def test_kl_penalized_rewards_by_hand():
    # k1 = logp - ref = [.5, (masked), -1]; reward 1 on the last policy token (t2):
    # [0 - .1*.5, 0, 1 - .1*(-1)] = [-.05, 0, 1.1]
    out = kl_penalized_rewards(t([1.0]), t([[-1.0, NAN, -2.0]]), t([[-1.5, 0.0, -1.0]]), t([[1, 0, 1]]), 0.1, "k1")
    close(out, [[-0.05, 0.0, 1.1]])


# --------------------------------------------------------------------------- dispatcher


def test_compute_advantages_grpo_matches_grpo_advantages():
    cfg = AlgorithmConfig(advantage_estimator="grpo")
    adv, _ = compute_advantages(cfg, t(REWARDS), MASK, group_ids=IDS)
    close(adv, grpo_advantages(t(REWARDS), IDS, MASK))
    with pytest.raises(ValueError, match="`group_ids`"):
        compute_advantages(cfg, t(REWARDS), MASK)


def test_compute_advantages_gae_with_kl_in_reward():
    cfg = AlgorithmConfig(advantage_estimator="gae", kl_in_reward=True, kl_estimator="k1", kl_coef=0.1,
                          whiten_advantages=False)
    mask, values = t([[1, 0, 1]]), t([[0.0, 0.0, 0.0]])
    logp, ref = t([[-1.0, 0.0, -2.0]]), t([[-1.5, 0.0, -1.0]])
    adv, ret = compute_advantages(cfg, t([1.0]), mask, values=values, logprobs=logp, ref_logprobs=ref)
    # token rewards [-.05, 0, 1.1] (see above), gamma = lam = 1, V = 0: A = [1.05, 0, 1.1]
    close(adv, [[1.05, 0.0, 1.1]])
    close(ret, [[1.05, 0.0, 1.1]])
    with pytest.raises(ValueError, match="`values`"):
        compute_advantages(cfg, t([1.0]), mask, logprobs=logp, ref_logprobs=ref)


# --------------------------------------------------------------------------- registries


@pytest.mark.parametrize(
    ("registry", "literal"),
    [(ADVANTAGE_ESTIMATORS, AdvantageEstimator), (LOSS_AGGS, LossAgg), (KL_ESTIMATORS, KLEstimator)],
)
def test_registries_match_config_literals(registry, literal):
    assert set(registry) == set(typing.get_args(literal))


def test_registered_functions_share_one_signature():
    adv_params = {tuple(inspect.signature(fn).parameters) for fn in ADVANTAGE_ESTIMATORS.values()}
    assert adv_params == {("cfg", "seq_rewards", "loss_mask", "group_ids", "values", "logprobs", "ref_logprobs")}
    assert {tuple(inspect.signature(fn).parameters) for fn in LOSS_AGGS.values()} == {
        ("loss_tokens", "mask", "norm_len", "divisor")
    }


def test_registry_lookups_and_errors():
    assert get_advantage_estimator("gae") is ADVANTAGE_ESTIMATORS["gae"]
    assert get_loss_agg("token_mean") is LOSS_AGGS["token_mean"]
    assert get_kl_estimator("k3") is KL_ESTIMATORS["k3"]
    with pytest.raises(ValueError, match="unknown `advantage_estimator` 'ppo'; registered: dr_grpo, gae, group_mean, "):
        get_advantage_estimator("ppo")
    with pytest.raises(ValueError, match="unknown `loss_agg` 'sum'; registered: seq_mean_token_mean, "):
        get_loss_agg("sum")
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_advantage_estimator("grpo")(lambda *args, **kwargs: None)
    grpo = ADVANTAGE_ESTIMATORS["grpo"]
    assert register_advantage_estimator("grpo")(grpo) is grpo  # the same function again: no-op


def test_compute_advantages_calls_a_user_registered_estimator():
    def ones(cfg, seq_rewards, loss_mask, *, group_ids, values, logprobs, ref_logprobs):
        assert group_ids == IDS and values is None
        return torch.ones(loss_mask.shape), torch.zeros(loss_mask.shape)

    register_advantage_estimator("ones")(ones)
    try:
        # "ones" is not in the AdvantageEstimator Literal, so build the config without validation.
        cfg = AlgorithmConfig.model_construct(advantage_estimator="ones", whiten_advantages=False)
        adv, ret = compute_advantages(cfg, t(REWARDS), MASK, group_ids=IDS)
    finally:
        del ADVANTAGE_ESTIMATORS["ones"]
    close(adv, torch.ones(MASK.shape))
    close(ret, torch.zeros(MASK.shape))


# --------------------------------------------------------------------------- aggregation


def test_aggregation_modes_by_hand():
    losses = t([[1, 2, 3, 1e9], [4, NAN, NAN, NAN], [NAN, NAN, NAN, NAN]])
    mask = t([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # row 2 has no policy token: excluded
    close(aggregate(losses, mask, "token_mean"), 2.5)  # (1+2+3+4) / 4
    close(aggregate(losses, mask, "seq_mean_token_mean"), 3.0)  # (6/3 + 4/1) / 2
    close(aggregate(losses, mask, "seq_mean_token_sum"), 5.0)  # (6 + 4) / 2
    close(aggregate(losses, mask, "seq_mean_token_sum", norm_len=4), 1.25)  # (6/4 + 4/4) / 2
    close(aggregate(losses, mask, "token_mean", divisor=8), 1.25)  # 10 / 8
    close(aggregate(losses, torch.zeros(3, 4), "seq_mean_token_mean"), 0.0)
    with pytest.raises(ValueError, match="unknown `loss_agg` 'sum'; registered: seq_mean_token_mean, "):
        aggregate(losses, mask, "sum")


# --------------------------------------------------------------------------- policy loss


def _lp(ratios) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs requiring grad, old_logprobs) with the given ratios, old = -1."""
    old = torch.full((1, len(ratios)), -1.0)
    return (old + torch.log(t([ratios]))).requires_grad_(), old


def test_policy_loss_ratio_one_is_minus_mean_advantage():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, -3.0]], requires_grad=True)
    adv, mask = t([[1, 2, 3], [4, 0, 0]]), t([[1, 1, 1], [1, 0, 0]])
    loss, m = policy_loss(logp, logp.detach().clone(), adv, mask)
    close(loss, -2.5)  # -(1 + 2 + 3 + 4) / 4
    assert m["clip_frac"] == 0.0 and m["approx_kl"] == pytest.approx(0.0) and m["ratio_mean"] == pytest.approx(1.0)


def test_policy_loss_clipping_by_hand():
    # ratio 1.5, A = 2, eps = .2: -min(1.5*2, 1.2*2) = -2.4; clipped -> zero gradient
    logp, old = _lp([1.5])
    loss, m = policy_loss(logp, old, t([[2.0]]), t([[1]]), clip_eps=0.2)
    close(loss, -2.4)
    assert m["clip_frac"] == 1.0 and m["ratio_max"] == pytest.approx(1.5)
    assert m["approx_kl"] == pytest.approx(0.5 - math.log(1.5))  # ratio - 1 - log ratio
    loss.backward()
    assert logp.grad.item() == 0.0
    # clip-higher: upper bound 1 + .28 -> -1.28 * 1
    logp, old = _lp([1.5])
    close(policy_loss(logp, old, t([[1.0]]), t([[1]]), clip_eps=0.2, clip_eps_high=0.28)[0], -1.28)


def test_nll_loss_by_hand_and_unclipped_where_the_ppo_surrogate_stops():
    """The warm start's loss: -mean log p over policy tokens, whose gradient stays -1/n per token however far
    the probability has risen; the PPO surrogate with advantage 1 has none past ratio 1 + clip_eps."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -9.0, -9.0]], requires_grad=True)
    mask = t([[1, 1, 1], [1, 0, 0]])
    loss, m = nll_loss(logp, mask)
    close(loss, (1.0 + 2.0 + 0.5 + 3.0) / 4)
    assert m["token_prob_mean"] == pytest.approx(sum(math.exp(x) for x in (-1.0, -2.0, -0.5, -3.0)) / 4)
    loss.backward()
    assert torch.allclose(logp.grad, -mask / 4)
    risen, old = _lp([1.5])  # a token whose probability rose 1.5x during the pass
    nll_loss(risen, t([[1]]))[0].backward()
    assert risen.grad.item() == pytest.approx(-1.0)
    risen, old = _lp([1.5])
    policy_loss(risen, old, t([[1.0]]), t([[1]]), clip_eps=0.2)[0].backward()
    assert risen.grad.item() == 0.0
    assert nll_loss(logp.detach(), torch.zeros(2, 3))[0].item() == 0.0  # no policy token: 0


def test_algorithm_policy_loss_option():
    assert AlgorithmConfig().policy_loss == "ppo_clip" and AlgorithmConfig(policy_loss="nll").policy_loss == "nll"
    with pytest.raises(ValidationError, match="policy_loss"):
        AlgorithmConfig(policy_loss="sft")


def test_policy_loss_negative_advantage_by_hand():
    # A = -1: ratio 1.5 -> max(1.5, 1.2) = 1.5 (not clipped); ratio .5 -> max(.5, .8) = .8 (clipped)
    logp, old = _lp([1.5, 0.5])
    loss, m = policy_loss(logp, old, t([[-1.0, -1.0]]), t([[1, 1]]), agg="seq_mean_token_sum")
    close(loss, 2.3)  # 1.5 + .8 over one sequence
    assert m["clip_frac"] == 0.5 and m["ratio_min"] == pytest.approx(0.5)


def test_policy_loss_dual_clip_by_hand():
    # ratio 5, A = -1: plain PPO gives max(5, 1.2) = 5; dual clip c = 3 caps it at -c*A = 3
    logp, old = _lp([5.0])
    close(policy_loss(logp, old, t([[-1.0]]), t([[1]]))[0], 5.0)
    loss, m = policy_loss(logp, old, t([[-1.0]]), t([[1]]), dual_clip=3.0)
    close(loss, 3.0)
    assert m["dual_clip_frac"] == 1.0 and m["clip_frac"] == 0.0
    loss.backward()
    assert logp.grad.item() == 0.0


def test_policy_loss_masked_garbage_does_not_leak_and_grad_only_on_policy_tokens():
    logp = torch.tensor([[-1.0, NAN, -2.0, -1e9]], requires_grad=True)
    old = t([[-1.0, NAN, -2.0, 5.0]])
    adv = t([[1.0, 1e9, -2.0, NAN]])
    mask = t([[1, 0, 1, 0]])
    loss, m = policy_loss(logp, old, adv, mask)
    close(loss, 0.5)  # ratios 1: -(1 - 2) / 2
    assert all(math.isfinite(v) for v in m.values())
    loss.backward()
    # d/dlogp of -A * ratio / 2 at ratio 1 = -A / 2 -> [-.5, 0, 1, 0]
    close(logp.grad, [[-0.5, 0.0, 1.0, 0.0]])


def test_policy_loss_bf16_inputs_and_empty_mask():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    loss, m = policy_loss(logp, logp.detach(), t([[1.0, 3.0]]).bfloat16(), t([[1, 1]]))
    assert loss.dtype == torch.float32
    close(loss, -2.0)
    loss.backward()
    assert logp.grad.dtype == torch.bfloat16
    # nothing to learn from: loss 0 (still differentiable), metrics 0, no NaN
    logp = torch.tensor([[NAN, NAN]], requires_grad=True)
    loss, m = policy_loss(logp, t([[0.0, 0.0]]), t([[1.0, 1.0]]), torch.zeros(1, 2), agg="seq_mean_token_mean")
    loss.backward()
    assert loss.item() == 0.0 and set(m.values()) == {0.0} and torch.equal(logp.grad, torch.zeros(1, 2))


def test_policy_loss_errors_name_argument():
    with pytest.raises(ValueError, match="`advantages`"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))
    with pytest.raises(ValueError, match="`dual_clip`"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), dual_clip=0.5)


# --------------------------------------------------------------------------- value, KL and entropy losses


def test_value_loss_clipping_by_hand():
    # token 0: V = 1, V_old = .5, R = 2: V - V_old = .5 -> clamp .2 -> V_clip = .7;
    #   (1-2)^2 = 1, (.7-2)^2 = 1.69 -> max 1.69 (clipped branch)
    # token 1: V = 0, V_old = .5, R = .4: V_clip = .3; (0-.4)^2 = .16, (.3-.4)^2 = .01 -> .16
    # loss = .5 * (1.69 + .16) / 2 = .4625; token 2 is masked garbage
    values = torch.tensor([[1.0, 0.0, NAN]], requires_grad=True)
    loss, m = value_loss(values, t([[0.5, 0.5, NAN]]), t([[2.0, 0.4, 1e9]]), t([[1, 1, 0]]), clip_eps=0.2)
    close(loss, 0.4625)
    assert m["vf_clip_frac"] == 0.5
    loss.backward()
    # token 0 uses the clipped branch (V_clip is constant beyond the clamp) -> 0;
    # token 1: d/dV .5*(V - R)^2 / 2 = (0 - .4) / 2 = -.2
    close(values.grad, [[0.0, -0.2, 0.0]])
    loss, m = value_loss(values, t([[0.5, 0.5, NAN]]), t([[2.0, 0.4, 1e9]]), t([[1, 1, 0]]), clip_eps=None)
    close(loss, 0.29)  # .5 * (1 + .16) / 2
    assert m["vf_clip_frac"] == 0.0


def test_kl_and_entropy_losses():
    logp = torch.tensor([[-1.0, -2.0, NAN]], requires_grad=True)
    ref, mask = t([[-1.5, -1.0, 0.0]]), t([[1, 1, 0]])
    loss = kl_loss(logp, ref, mask, "k3")
    close(loss, (0.1065307 + 0.7182818) / 2)
    loss.backward()
    # d k3 / d logp = 1 - exp(ref - logp): 1 - exp(-.5) = .3934693, 1 - e = -1.7182818; / 2 tokens
    close(logp.grad, [[0.3934693 / 2, -1.7182818 / 2, 0.0]])
    close(entropy_loss(t([[1.0, 3.0, NAN], [2.0, NAN, NAN]]), t([[1, 1, 0], [1, 0, 0]]), "seq_mean_token_mean"), 2.0)


# --------------------------------------------------------------------------- config


def test_config_defaults_and_presets():
    cfg = AlgorithmConfig()
    assert cfg.advantage_estimator == "grpo" and not cfg.needs_critic and not cfg.should_whiten
    assert cfg.upper_clip_eps == 0.2
    s3 = AlgorithmConfig(**RECIPE_PRESETS["s3"])
    assert s3.needs_critic and s3.kl_in_reward and s3.kl_estimator == "k1" and s3.should_whiten
    assert AlgorithmConfig(**RECIPE_PRESETS["eval_rar"]).loss_agg == "seq_mean_token_mean"
    assert AlgorithmConfig(**{**RECIPE_PRESETS["r1_searcher"], "kl_coef": 0.0}).kl_coef == 0.0
    for preset in RECIPE_PRESETS.values():
        AlgorithmConfig(**preset)  # every preset validates


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"clip_eps": 1.5}, "clip_eps"),
        ({"clip_eps": 0.0}, "clip_eps"),
        ({"gamma": 1.1}, "gamma"),
        ({"lam": -0.1, "advantage_estimator": "gae"}, "lam"),
        ({"kl_coef": -0.001}, "kl_coef"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"value_clip_eps": 0.0}, "value_clip_eps"),
        ({"lam": 0.95}, "lam"),  # lam without a critic
        ({"norm_len": 512}, "norm_len"),  # norm_len without seq_mean_token_sum
        ({"advantage_estimator": "ppo"}, "advantage_estimator"),
        ({"clip_eps": "0.2"}, "clip_eps"),  # strict: no coercion
        ({"clip": 0.2}, "clip"),  # unknown key
    ],
)
def test_config_validation_names_field(kwargs, field):
    with pytest.raises(ValidationError, match=field):
        AlgorithmConfig(**kwargs)


def test_config_validates_assignment():
    cfg = AlgorithmConfig(advantage_estimator="gae", lam=0.95)
    with pytest.raises(ValidationError, match="dual_clip"):
        cfg.dual_clip = 0.5
