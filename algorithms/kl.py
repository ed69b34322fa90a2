"""Per-token KL estimators and numerically stable log-probabilities / entropy from logits.

KL estimators follow Schulman, "Approximating KL Divergence" (2020).  Tokens are sampled from
the policy pi_theta, the reference is pi_ref, and ``log_ratio = logprobs - ref_logprobs``
(= log pi_theta(a) - log pi_ref(a)).  Each estimator's expectation under pi_theta relates to
KL(pi_theta || pi_ref):

* ``"k1"``: ``log_ratio``; unbiased, high variance, can be negative per token.  The
  "KL in the reward" penalty of PPO-RLHF (Ouyang et al. 2022; verl's ``kl_ctrl`` used by
  Search-R1 and s3).
* ``"k2"``: ``0.5 * log_ratio^2``; >= 0, biased, low variance.
* ``"k3"``: ``exp(-log_ratio) + log_ratio - 1`` = ``pi_ref/pi_theta - log(pi_ref/pi_theta) - 1``;
  unbiased, >= 0, low variance.  The KL term of GRPO (DeepSeekMath, Shao et al. 2024, Eq. 4).

Each estimator is a ``log_ratio -> kl`` function in ``KL_ESTIMATORS``; add one with
``@register_kl_estimator(name)`` and list the name in ``KLEstimator`` (``algorithms/config.py``),
see :mod:`algorithms.registry`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import KLEstimator
from .masked import as_bool_mask, check_same_shape, upcast, zero_masked
from .registry import KL_ESTIMATORS as KL_ESTIMATORS  # re-export: the registry filled below
from .registry import get_kl_estimator, register_kl_estimator

# exp(20) ~ 4.9e8: beyond this the k3 estimate is meaningless and exp() would overflow in
# bf16/fp16; the clamp also zeroes the gradient there, which is the intent.
K3_LOG_RATIO_CLAMP = 20.0


@register_kl_estimator("k1")
def _k1(log_ratio: Tensor) -> Tensor:
    return log_ratio


@register_kl_estimator("k2")
def _k2(log_ratio: Tensor) -> Tensor:
    return 0.5 * log_ratio.square()


@register_kl_estimator("k3")
def _k3(log_ratio: Tensor) -> Tensor:
    neg = -log_ratio.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)  # log(pi_ref / pi_theta)
    # expm1 keeps small ratios accurate; the clamp removes the last rounding below 0 (k3 >= 0).
    return (torch.expm1(neg) - neg).clamp(min=0.0)


def kl_estimate(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    estimator: KLEstimator = "k3",
    loss_mask: Tensor | None = None,
) -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate.

    Args:
        logprobs: ``[B, T]`` float, log pi_theta of the sampled tokens (may require grad).
        ref_logprobs: ``[B, T]`` float, log pi_ref of the same tokens.
        estimator: a name in ``KL_ESTIMATORS``: ``"k1"`` (``log_ratio``), ``"k2"``
            (``0.5 * log_ratio^2``) or ``"k3"`` (``exp(-log_ratio) + log_ratio - 1``, ``log_ratio``
            clamped to [-20, 20] first); Schulman (2020); k3 = DeepSeekMath Eq. 4.
        loss_mask: optional ``[B, T]`` bool/float, 1 = policy token.  When given, masked
            positions are 0 in the result and garbage there (NaN, inf) is never read.

    Returns:
        ``[B, T]`` fp32 tensor (fp64 for fp64 inputs; bf16/fp16 inputs are upcast).

    Raises:
        ValueError: unknown ``estimator`` (see :func:`algorithms.registry.get_kl_estimator`) or
            mismatched shapes.
    """
    check_same_shape("kl_estimate", ("logprobs", logprobs), ("ref_logprobs", ref_logprobs))
    estimator_fn = get_kl_estimator(estimator)
    log_ratio = upcast(logprobs) - upcast(ref_logprobs)
    if loss_mask is not None:
        check_same_shape("kl_estimate", ("logprobs", logprobs), ("loss_mask", loss_mask))
        log_ratio = zero_masked(log_ratio, loss_mask)
    kl = estimator_fn(log_ratio)
    return kl if loss_mask is None else zero_masked(kl, as_bool_mask(loss_mask))


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``, computed in fp32.

    ``logits[label] - logsumexp(logits)``: the full ``[..., V]`` log-softmax is never
    materialised beyond one fp32 copy of the logits.  Call it on chunks of the sequence when
    ``[B, T, V]`` in fp32 does not fit in memory.

    Args:
        logits: ``[..., V]`` float (any float dtype; upcast to fp32), e.g. ``[B, T, V]``
            already shifted so that ``logits[:, t]`` predicts ``labels[:, t]``.
        labels: ``[...]`` int64 token ids in ``[0, V)``.

    Returns:
        ``[...]`` fp32 log-probabilities (<= 0).
    """
    if logits.dim() < 1 or labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"logprobs_from_logits: `labels` must have shape logits.shape[:-1] = "
            f"{tuple(logits.shape[:-1])}, got {tuple(labels.shape)}"
        )
    if labels.dtype != torch.long:
        raise ValueError(f"logprobs_from_logits: `labels` must be int64 (torch.long), got {labels.dtype}")
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of ``softmax(logits)`` along the last axis, computed in fp32.

    ``H = -sum_v p_v log p_v`` with ``log p = log_softmax(logits)`` (logsumexp-stable).  The
    log-probabilities are clamped at the fp32 minimum so that ``-inf`` logits (banned tokens)
    contribute 0 instead of ``0 * -inf = NaN``, in the forward and the backward pass.

    Args:
        logits: ``[..., V]`` float (any float dtype), e.g. ``[B, T, V]``.

    Returns:
        ``[...]`` fp32 entropy in nats, in ``[0, log V]``.
    """
    if logits.dim() < 1:
        raise ValueError("entropy_from_logits: `logits` must have a vocabulary axis [..., V]")
    logp = torch.log_softmax(logits.float(), dim=-1).clamp(min=torch.finfo(torch.float32).min)
    return -(logp.exp() * logp).sum(dim=-1)
