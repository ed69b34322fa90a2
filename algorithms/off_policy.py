"""Off-policy corrections: token weights between the proximal and the behaviour policy.

The behaviour policy mu sampled the tokens: the rollout engine, with weights that may be older than
the learner's (asynchronous training) or in another precision (vLLM bf16 against an fp32 learner).
The PPO ratio is taken against the proximal policy pi_prox: the learner's own log-probs of the
same tokens before this update (`old_logprobs`).  The behaviour weight of token t is
``w_t = pi_prox(a_t) / mu(a_t) = exp(proximal_logprob_t - behaviour_logprob_t)`` and multiplies the
token's clipped surrogate loss (:func:`algorithms.losses.policy_loss`, ``token_weights``):

* ``"tis"``: truncated importance sampling, ``min(w_t, cap)`` (Yao et al. 2025, "Your Efficient RL
  Framework Secretly Brings You Off-Policy RL Training"; verl / SkyRL's TIS, cap 2 there).
* ``"decoupled"``: decoupled PPO (AReaL, Fu et al. 2025, Eq. 5), ``w_t`` where ``w_t <= cap`` and 0
  elsewhere: a token too far off-policy is dropped rather than down-weighted (AReaL's
  ``behav_imp_weight_cap``).
* ``"none"``: every weight is 1 (today's on-policy update).

Pure functions over ``[B, T]`` tensors with a loss mask, like the rest of :mod:`algorithms`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .masked import as_bool_mask, check_2d, check_same_shape, masked_count, masked_sum, upcast, zero_masked

OffPolicyCorrection = Literal["none", "tis", "decoupled"]
CORRECTIONS: tuple[str, ...] = ("none", "tis", "decoupled")
_LOG_W_CLAMP = 20.0  # exp(20) ~ 5e8: far past any cap, and finite in fp32


def behaviour_weights(
    proximal_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    loss_mask: Tensor,
    correction: OffPolicyCorrection = "tis",
    cap: float = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token behaviour weights ``[B, T]`` for ``policy_loss(..., token_weights=...)``.

    Args:
        proximal_logprobs: ``[B, T]`` float, log pi_prox(a_t): the learner's log-probs before the update.
        behaviour_logprobs: ``[B, T]`` float, log mu(a_t): the rollout engine's, as it sampled.
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        correction: ``"tis"``, ``"decoupled"`` or ``"none"`` (module docstring).
        cap: the truncation (tis) or drop (decoupled) threshold on ``w_t``, > 0.

    Returns:
        ``(weights, metrics)``: fp32 (fp64 for fp64 inputs) weights, detached, 0 where the mask is 0;
        python-float metrics over mask-1 tokens, measured before truncation: ``is_weight_mean``,
        ``is_weight_max`` and ``is_truncated_frac`` (share of tokens with ``w_t > cap``: capped by
        tis, dropped by decoupled); all 0 for an empty mask.

    Raises:
        ValueError: unknown ``correction``, ``cap <= 0``, or tensors of other shapes than the mask.
    """
    func = "behaviour_weights"
    if correction not in CORRECTIONS:
        raise ValueError(f"{func}: correction must be one of {CORRECTIONS}, got {correction!r}")
    if not cap > 0:
        raise ValueError(f"{func}: cap must be > 0 (e.g. 2.0), got {cap}")
    check_2d(func, "loss_mask", loss_mask)
    check_same_shape(func, ("loss_mask", loss_mask), ("proximal_logprobs", proximal_logprobs),
                     ("behaviour_logprobs", behaviour_logprobs))
    mask = as_bool_mask(loss_mask)
    with torch.no_grad():
        log_w = zero_masked(upcast(proximal_logprobs.detach()) - upcast(behaviour_logprobs.detach()), mask)
        w = torch.exp(log_w.clamp(-_LOG_W_CLAMP, _LOG_W_CLAMP))
        over = (w > cap) & mask
        if correction == "none":
            weights = torch.ones_like(w)
        elif correction == "tis":
            weights = w.clamp(max=cap)
        else:
            weights = torch.where(over, torch.zeros_like(w), w)
        weights = zero_masked(weights, mask)
        count = masked_count(mask).clamp(min=1)
        any_token = mask.any()
        stats = torch.stack([
            masked_sum(w, mask) / count,
            torch.where(any_token, torch.where(mask, w, torch.zeros_like(w)).max(), 0.0),
            masked_sum(over.to(w.dtype), mask) / count,
        ]).tolist()
    return weights, dict(zip(("is_weight_mean", "is_weight_max", "is_truncated_frac"), stats))
