"""Off-policy corrections (algorithms.off_policy): hand-computed weights and their effect on the policy loss."""

from __future__ import annotations

import math

import pydantic
import pytest
import torch

from algorithms import AlgorithmConfig, behaviour_weights, policy_loss

LOG = math.log
# Two sequences, three tokens; the last token of row 1 is masked (an observation or padding).
PROX = torch.tensor([[LOG(0.5), LOG(0.25), LOG(0.9)], [LOG(0.3), LOG(0.6), 123.0]])
BEHAV = torch.tensor([[LOG(0.25), LOG(0.5), LOG(0.3)], [LOG(0.3), LOG(0.2), -7.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float32)
# pi_prox / mu per token: 2, 0.5, 3 | 1, 3, (masked)


def test_weights_by_hand():
    tis, m = behaviour_weights(PROX, BEHAV, MASK, "tis", cap=2.5)
    torch.testing.assert_close(tis, torch.tensor([[2.0, 0.5, 2.5], [1.0, 2.5, 0.0]]))
    assert m["is_weight_mean"] == pytest.approx((2 + 0.5 + 3 + 1 + 3) / 5)
    assert m["is_weight_max"] == pytest.approx(3.0)
    assert m["is_truncated_frac"] == pytest.approx(2 / 5)
    dec, _ = behaviour_weights(PROX, BEHAV, MASK, "decoupled", cap=2.5)
    torch.testing.assert_close(dec, torch.tensor([[2.0, 0.5, 0.0], [1.0, 0.0, 0.0]]))
    none, _ = behaviour_weights(PROX, BEHAV, MASK, "none")
    torch.testing.assert_close(none, MASK)
    empty, m0 = behaviour_weights(PROX, BEHAV, torch.zeros_like(MASK), "tis")
    assert not empty.any() and m0 == {"is_weight_mean": 0.0, "is_weight_max": 0.0, "is_truncated_frac": 0.0}


def test_on_policy_tokens_weigh_one():
    w, m = behaviour_weights(PROX, PROX.clone(), MASK, "tis", cap=2.0)
    torch.testing.assert_close(w, MASK)
    assert m["is_truncated_frac"] == 0.0 and m["is_weight_max"] == pytest.approx(1.0)


def test_weighted_policy_loss_and_gradient_by_hand():
    """At ratio 1 the token loss is -A; weighted by w and token-averaged over the 5 policy tokens.
    Its gradient in each log-prob is -A * w / 5 (the ratio's derivative is the ratio, 1)."""
    adv = torch.tensor([[1.0, -1.0, 2.0], [0.5, 1.0, 9.0]])
    w, _ = behaviour_weights(PROX, BEHAV, MASK, "tis", cap=2.5)
    logprobs = PROX.clone().requires_grad_(True)
    loss, _ = policy_loss(logprobs, PROX, adv, MASK, token_weights=w)
    expected = -(1 * 2 + (-1) * 0.5 + 2 * 2.5 + 0.5 * 1 + 1 * 2.5) / 5
    assert float(loss.detach()) == pytest.approx(expected)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -(adv * w) / 5)
    plain = policy_loss(PROX.clone(), PROX, adv, MASK)[0]
    unit = policy_loss(PROX.clone(), PROX, adv, MASK, token_weights=torch.ones_like(MASK))[0]
    assert float(plain) == float(unit)


def test_config_and_bad_input():
    assert AlgorithmConfig().off_policy_correction == "none"
    assert AlgorithmConfig(off_policy_correction="decoupled", is_cap=5.0).is_cap == 5.0
    with pytest.raises(pydantic.ValidationError, match="off_policy_correction"):
        AlgorithmConfig(off_policy_correction="vtrace")
    with pytest.raises(pydantic.ValidationError, match="is_cap"):
        AlgorithmConfig(is_cap=0.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        behaviour_weights(PROX, BEHAV, MASK, "tis", cap=-1.0)
    with pytest.raises(ValueError, match="correction must be one of"):
        behaviour_weights(PROX, BEHAV, MASK, "vtrace")
    with pytest.raises(ValueError, match="token_weights"):
        policy_loss(PROX, PROX, PROX, MASK, token_weights=torch.ones(2, 2))
