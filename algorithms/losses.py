"""Policy, value, KL and entropy losses over response tokens, and their aggregation.

All inputs are ``[B, T]`` response-token tensors with a ``loss_mask`` ``[B, T]`` (bool or float,
non-zero = 1) that is 1 on policy-generated tokens and 0 on environment tokens (retrieved
documents between turns) and padding.  Masked positions are removed with ``torch.where``
before any arithmetic, so garbage there (NaN log-probs, 1e9 advantages) reaches neither the
loss nor the gradient, and the gradient at masked positions is exactly 0.

Every loss is to be *minimised*; the learner combines them, e.g.
``pg + kl_coef * kl_loss(...) - entropy_coef * entropy_loss(...) + vf_coef * value_loss(...)``.

The ``loss_agg`` modes of :func:`aggregate` live in the ``LOSS_AGGS`` registry.  To add one, write
``fn(loss_tokens, mask, norm_len, divisor) -> 0-d tensor`` (``loss_tokens`` ``[B, T]`` fp32/fp64
with garbage allowed at mask-0 positions, ``mask`` ``[B, T]`` bool), decorate it with
``@register_loss_agg("name")`` and add ``"name"`` to ``LossAgg`` in ``algorithms/config.py``
(see :mod:`algorithms.registry`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import KLEstimator, LossAgg
from .kl import kl_estimate
from .masked import as_bool_mask, check_2d, check_same_shape, masked_count, masked_sum, upcast, zero_masked
from .registry import LOSS_AGGS as LOSS_AGGS  # re-export: the registry filled below
from .registry import get_loss_agg, register_loss_agg

# Bound on |log ratio| before exp(): keeps the ratio finite in low precision; beyond it the
# clipped objective is flat anyway.
_LOG_RATIO_CLAMP = 20.0


# ----------------------------------------------------------------------------- aggregations (LOSS_AGGS)


@register_loss_agg("token_mean")
def _token_mean(loss_tokens: Tensor, mask: Tensor, norm_len: float | None, divisor: float | Tensor | None) -> Tensor:
    total = masked_sum(loss_tokens, mask)
    count = masked_count(mask).clamp(min=1).to(total.dtype) if divisor is None else divisor
    return total / count


def _mean_over_sequences(row_loss: Tensor, row_count: Tensor, divisor: float | Tensor | None) -> Tensor:
    """Mean of ``row_loss`` ``[B]`` over the rows with at least one policy token (or ``/ divisor``)."""
    has_tokens = row_count > 0
    total = zero_masked(row_loss, has_tokens).sum()
    count = has_tokens.sum().clamp(min=1).to(total.dtype) if divisor is None else divisor
    return total / count


@register_loss_agg("seq_mean_token_mean")
def _seq_mean_token_mean(
    loss_tokens: Tensor, mask: Tensor, norm_len: float | None, divisor: float | Tensor | None
) -> Tensor:
    row_sum = masked_sum(loss_tokens, mask, dim=1)
    row_count = masked_count(mask, dim=1)
    return _mean_over_sequences(row_sum / row_count.clamp(min=1).to(row_sum.dtype), row_count, divisor)


@register_loss_agg("seq_mean_token_sum")
def _seq_mean_token_sum(
    loss_tokens: Tensor, mask: Tensor, norm_len: float | None, divisor: float | Tensor | None
) -> Tensor:
    row_sum = masked_sum(loss_tokens, mask, dim=1)
    row_loss = row_sum if norm_len is None else row_sum / norm_len
    return _mean_over_sequences(row_loss, masked_count(mask, dim=1), divisor)


def aggregate(
    loss_tokens: Tensor,
    loss_mask: Tensor,
    mode: LossAgg = "token_mean",
    norm_len: float | None = None,
    divisor: float | Tensor | None = None,
) -> Tensor:
    """Reduce per-token losses ``[B, T]`` to a scalar over the mask-1 tokens.

    * ``"token_mean"``: ``sum_{i,t} m l / sum_{i,t} m`` (every policy token of the batch weighs
      the same; DAPO, verl/OpenRLHF default).
    * ``"seq_mean_token_mean"``: ``1/G sum_i (1/|o_i| sum_t m l)`` (GRPO paper, DeepSeekMath
      Eq. 3; Eval-RAR Eq. 6).
    * ``"seq_mean_token_sum"``: ``1/G sum_i (sum_t m l) / norm_len`` (Dr.GRPO, Liu et al. 2025,
      Eq. 4: a constant ``norm_len``, e.g. the max response length, instead of ``|o_i|``;
      ``norm_len=None`` divides by 1).

    Sequences without any mask-1 token are left out of the sequence means (G counts only
    sequences with tokens).  An all-zero mask gives 0 (still attached to the graph).

    Args:
        loss_tokens: ``[B, T]`` float per-token losses (garbage allowed at masked positions).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        mode: a name in ``LOSS_AGGS``: the three modes above, or one added with
            ``@register_loss_agg`` (see :mod:`algorithms.registry`).
        norm_len: constant per-sequence divisor for ``"seq_mean_token_sum"`` (> 0).
        divisor: replaces the final divisor (token count for ``"token_mean"``, sequence count
            for the ``seq_*`` modes); pass the count over the *global* batch (all micro-batches
            and data-parallel ranks) so that micro-batch losses add up to the global loss.

    Returns:
        0-d fp32 tensor (fp64 for fp64 inputs).

    Raises:
        ValueError: unknown ``mode`` (the message lists the registered ones), mismatched shapes, or
            ``norm_len`` given for a mode other than ``"seq_mean_token_sum"`` or <= 0.
    """
    check_2d("aggregate", "loss_tokens", loss_tokens)
    check_same_shape("aggregate", ("loss_tokens", loss_tokens), ("loss_mask", loss_mask))
    agg_fn = get_loss_agg(mode)
    if norm_len is not None and (mode != "seq_mean_token_sum" or norm_len <= 0):
        raise ValueError(
            f"aggregate: `norm_len` must be > 0 and is only used with mode='seq_mean_token_sum', got {norm_len}"
        )
    mask = as_bool_mask(loss_mask)
    loss_tokens = upcast(loss_tokens)  # a bf16 sum over ~1e6 tokens would lose the small terms
    return agg_fn(loss_tokens, mask, norm_len, divisor)


def _check_token_inputs(func: str, loss_mask: Tensor, **tensors: Tensor) -> None:
    check_2d(func, "loss_mask", loss_mask)
    check_same_shape(func, ("loss_mask", loss_mask), *tensors.items())


def _masked_stats(
    mask: Tensor,
    means: dict[str, Tensor],
    maxima: dict[str, Tensor] | None = None,
    minima: dict[str, Tensor] | None = None,
) -> dict[str, float]:
    """Masked means / maxima / minima of ``[B, T]`` tensors as python floats, one device sync.

    Every metric is 0 when the mask is empty.
    """
    maxima, minima = maxima or {}, minima or {}
    count = masked_count(mask).clamp(min=1)
    values = [masked_sum(v.float(), mask) / count for v in means.values()]
    any_token = mask.any()
    big = torch.finfo(torch.float32).max
    for v in maxima.values():
        values.append(torch.where(any_token, torch.where(mask, v.float(), -big).max(), 0.0))
    for v in minima.values():
        values.append(torch.where(any_token, torch.where(mask, v.float(), big).min(), 0.0))
    return dict(zip([*means, *maxima, *minima], torch.stack(values).tolist()))


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    agg: LossAgg = "token_mean",
    norm_len: float | None = None,
    divisor: float | Tensor | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate loss (to minimise), with optional clip-higher and dual clip.

    ``ratio = exp(logprobs - old_logprobs)`` (log-ratio clamped to [-20, 20]);
    ``l_t = -min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * A)``
    (Schulman et al. 2017, Eq. 7; s3 Eq. 2; the inner term of Eval-RAR Eq. 6).  With
    ``dual_clip = c > 1`` (Ye et al. 2020) tokens with ``A < 0`` use ``min(l_t, -c * A)``, which
    bounds the loss when the ratio explodes.  Then ``aggregate(l, loss_mask, agg)``.

    Args:
        logprobs: ``[B, T]`` float, current policy log-probs (requires grad).
        old_logprobs: ``[B, T]`` float, rollout-policy log-probs (treated as constants).
        advantages: ``[B, T]`` float (treated as constants).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        clip_eps: lower (and default upper) clip epsilon in (0, 1).
        clip_eps_high: upper clip epsilon > 0 (DAPO "clip-higher"); None = ``clip_eps``.
        dual_clip: dual-clip constant > 1, or None.
        agg, norm_len, divisor: see :func:`aggregate`.
        token_weights: ``[B, T]`` float constants multiplying each token's loss before aggregation:
            the behaviour weights of an off-policy correction
            (:func:`algorithms.off_policy.behaviour_weights`; TIS, decoupled PPO); None = 1.

    Returns:
        ``(loss, metrics)``: 0-d loss; python-float metrics over mask-1 tokens:
        ``clip_frac`` (the clipped branch strictly chosen), ``dual_clip_frac`` (the dual clip
        bound chosen), ``approx_kl`` (k3 estimate of KL(pi_old || pi_theta):
        ``mean(ratio - 1 - log ratio)``, >= 0), ``ratio_mean``, ``ratio_max``, ``ratio_min``.
    """
    func = "policy_loss"
    _check_token_inputs(func, loss_mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    if token_weights is not None:
        _check_token_inputs(func, loss_mask, token_weights=token_weights)
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"{func}: `clip_eps` must be in (0, 1), got {clip_eps}")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if eps_high <= 0.0:
        raise ValueError(f"{func}: `clip_eps_high` must be > 0, got {clip_eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"{func}: `dual_clip` must be > 1, got {dual_clip}")

    mask = as_bool_mask(loss_mask)
    log_ratio = zero_masked(upcast(logprobs) - upcast(old_logprobs.detach()), mask)
    log_ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    adv = zero_masked(upcast(advantages.detach()), mask)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)
    loss_tokens = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(mask)
    if dual_clip is not None:
        bound = -dual_clip * adv
        dual_active = (adv < 0) & (loss_tokens > bound)
        loss_tokens = torch.where(dual_active, bound, loss_tokens)
    if token_weights is not None:
        loss_tokens = loss_tokens * zero_masked(upcast(token_weights.detach()), mask)
    loss = aggregate(loss_tokens, mask, agg, norm_len, divisor)

    with torch.no_grad():
        clip_active = (clipped > unclipped) & ~dual_active
        metrics = _masked_stats(
            mask,
            means={
                "clip_frac": clip_active.float(),
                "dual_clip_frac": dual_active.float(),
                "approx_kl": ratio - 1.0 - log_ratio,
                "ratio_mean": ratio,
            },
            maxima={"ratio_max": ratio},
            minima={"ratio_min": ratio},
        )
    return loss, metrics


def nll_loss(
    logprobs: Tensor,
    loss_mask: Tensor,
    agg: LossAgg = "token_mean",
    norm_len: float | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Supervised negative log-likelihood of the policy tokens (to minimise): ``l_t = -log pi(y_t)``, then
    ``aggregate(l, loss_mask, agg)``. The warm start's loss (``AlgorithmConfig.policy_loss = "nll"``): unlike
    the PPO surrogate with advantage 1, nothing clips it once a token's probability has risen.

    Args:
        logprobs: ``[B, T]`` float, current policy log-probs (requires grad).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        agg, norm_len, divisor: see :func:`aggregate`.

    Returns:
        ``(loss, metrics)``: 0-d loss; ``token_prob_mean`` (mean ``pi(y_t)`` over mask-1 tokens, in [0, 1]).

    Raises:
        ValueError: mismatched shapes (as :func:`aggregate`).
    """
    _check_token_inputs("nll_loss", loss_mask, logprobs=logprobs)
    mask = as_bool_mask(loss_mask)
    loss = aggregate(-zero_masked(upcast(logprobs), mask), mask, agg, norm_len, divisor)
    with torch.no_grad():
        metrics = _masked_stats(mask, means={"token_prob_mean": torch.exp(upcast(logprobs.detach()))},
                                maxima={}, minima={})
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    clip_eps: float | None = 0.2,
    agg: LossAgg = "token_mean",
    norm_len: float | None = None,
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped critic loss ``0.5 * max((V - R)^2, (V_clip - R)^2)``.

    ``V_clip = V_old + clamp(V - V_old, -clip_eps, clip_eps)`` (PPO value clipping as in the
    OpenAI baselines / verl / OpenRLHF critic); ``clip_eps=None`` gives ``0.5 * (V - R)^2``.

    Args:
        values: ``[B, T]`` float, current critic values (requires grad).
        old_values: ``[B, T]`` float, critic values at rollout time (constants).
        returns: ``[B, T]`` float, targets from :func:`algorithms.advantages.gae` (constants).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        clip_eps: value clip range > 0, or None.
        agg, norm_len, divisor: see :func:`aggregate`.

    Returns:
        ``(loss, metrics)``; ``metrics["vf_clip_frac"]``: fraction of mask-1 tokens where the
        clipped term was strictly larger (so it was the one used).
    """
    func = "value_loss"
    _check_token_inputs(func, loss_mask, values=values, old_values=old_values, returns=returns)
    if clip_eps is not None and clip_eps <= 0.0:
        raise ValueError(f"{func}: `clip_eps` must be > 0 or None, got {clip_eps}")
    mask = as_bool_mask(loss_mask)
    v = zero_masked(upcast(values), mask)
    v_old = zero_masked(upcast(old_values.detach()), mask)
    target = zero_masked(upcast(returns.detach()), mask)
    err = (v - target).square()
    if clip_eps is None:
        loss_tokens, clip_active = err, torch.zeros_like(mask)
    else:
        v_clipped = v_old + (v - v_old).clamp(-clip_eps, clip_eps)
        err_clipped = (v_clipped - target).square()
        loss_tokens, clip_active = torch.maximum(err, err_clipped), err_clipped > err
    loss = 0.5 * aggregate(loss_tokens, mask, agg, norm_len, divisor)
    with torch.no_grad():
        metrics = _masked_stats(mask, means={"vf_clip_frac": clip_active.float()})
    return loss, metrics


def kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    loss_mask: Tensor,
    estimator: KLEstimator = "k3",
    agg: LossAgg = "token_mean",
    norm_len: float | None = None,
    divisor: float | Tensor | None = None,
) -> Tensor:
    """KL(pi_theta || pi_ref) as a loss term (GRPO, DeepSeekMath Eq. 3-4): aggregated per-token estimate.

    The learner adds ``kl_coef * kl_loss(...)``; GRPO uses ``estimator="k3"``.

    Args:
        logprobs: ``[B, T]`` float, current policy log-probs (requires grad).
        ref_logprobs: ``[B, T]`` float, reference-model log-probs (constants).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (see :func:`algorithms.kl.kl_estimate`).
        agg, norm_len, divisor: see :func:`aggregate`.

    Returns:
        0-d tensor.
    """
    _check_token_inputs("kl_loss", loss_mask, logprobs=logprobs, ref_logprobs=ref_logprobs)
    kl = kl_estimate(logprobs, ref_logprobs.detach(), estimator, loss_mask=loss_mask)
    return aggregate(kl, loss_mask, agg, norm_len, divisor)


def entropy_loss(
    entropy: Tensor,
    loss_mask: Tensor,
    agg: LossAgg = "token_mean",
    norm_len: float | None = None,
    divisor: float | Tensor | None = None,
) -> Tensor:
    """Aggregated token entropy (positive); the learner *subtracts* ``entropy_coef`` times it.

    Args:
        entropy: ``[B, T]`` float per-token entropy, e.g. from
            :func:`algorithms.kl.entropy_from_logits`.
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        agg, norm_len, divisor: see :func:`aggregate`.

    Returns:
        0-d tensor.
    """
    _check_token_inputs("entropy_loss", loss_mask, entropy=entropy)
    return aggregate(entropy, loss_mask, agg, norm_len, divisor)
