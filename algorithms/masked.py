"""Masked reductions over response-token tensors.

Conventions used by the whole package:

* ``x`` and ``mask`` are ``[B, T]`` (B sequences of T response tokens, right-padded) or any equal
  shape.  ``mask`` is bool or any numeric dtype; a non-zero entry marks a token that counts
  (in RL: a token the policy generated), zero marks one that does not (an environment
  observation inserted between turns, or padding).  Masked spans may sit anywhere in a row.
* Entries of ``x`` at masked positions are never read arithmetically: they go through
  :func:`torch.where`, so garbage there (``1e9``, ``inf``, ``NaN``) cannot leak into a result or
  into a gradient.
* An empty selection (all-zero mask) gives 0, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_same_shape(func: str, reference: tuple[str, Tensor], *others: tuple[str, Tensor]) -> None:
    """Raise ``ValueError`` naming the argument whose shape differs from ``reference``'s.

    Args:
        func: name of the calling function (for the message).
        reference: ``(name, tensor)`` whose shape the others must equal.
        others: ``(name, tensor)`` pairs to check.
    """
    ref_name, ref = reference
    if not isinstance(ref, Tensor):
        raise TypeError(f"{func}: `{ref_name}` must be a torch.Tensor, got {type(ref).__name__}")
    for name, tensor in others:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{func}: `{name}` must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.shape != ref.shape:
            raise ValueError(
                f"{func}: `{name}` has shape {tuple(tensor.shape)} but `{ref_name}` has shape "
                f"{tuple(ref.shape)}; they must be equal"
            )


def check_2d(func: str, name: str, tensor: Tensor) -> None:
    """Raise ``ValueError`` unless ``tensor`` is ``[B, T]``."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{func}: `{name}` must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != 2:
        raise ValueError(f"{func}: `{name}` must be [B, T] (2-D), got shape {tuple(tensor.shape)}")


def as_bool_mask(mask: Tensor) -> Tensor:
    """``mask`` as a bool tensor (non-zero -> True); a bool mask is returned as is."""
    return mask if mask.dtype == torch.bool else mask != 0


def upcast(x: Tensor) -> Tensor:
    """``x`` in fp32 unless it is fp64: losses and ratios of bf16 log-probs lose too much precision."""
    return x if x.dtype == torch.float64 else x.float()


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with masked positions replaced by 0 via ``torch.where``.

    Use it before any arithmetic on ``x``: ``NaN * 0`` is ``NaN``, both in the forward pass and
    in the backward pass of a product, whereas ``where`` passes a zero gradient to the branch
    it did not select.
    """
    return torch.where(as_bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over the positions where ``mask`` is set.

    Args:
        x: ``[B, T]`` (or any shape) floating tensor.
        mask: same shape as ``x``; bool or numeric, non-zero = counts.
        dim: reduce over this dimension only (e.g. ``1`` for per-sequence sums ``[B]``);
            ``None`` reduces over everything to a 0-d tensor.

    Returns:
        The masked sum; 0 where nothing is selected.
    """
    check_same_shape("masked_sum", ("x", x), ("mask", mask))
    selected = zero_masked(x, mask)
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_count(mask: Tensor, dim: int | None = None) -> Tensor:
    """Number of set entries of ``mask`` (int64), over everything or along ``dim``."""
    m = as_bool_mask(mask)
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set.

    ``sum(x * m) / max(sum(m), 1)``: an empty selection gives 0, not NaN.

    Args:
        x: ``[B, T]`` (or any shape) floating tensor.
        mask: same shape as ``x``; bool or numeric, non-zero = counts.
        dim: ``None`` for one mean over every selected entry (0-d); ``1`` for per-sequence
            means ``[B]``.

    Returns:
        The masked mean, dtype of ``x``.
    """
    check_same_shape("masked_mean", ("x", x), ("mask", mask))
    total = masked_sum(x, mask, dim)
    count = masked_count(mask, dim).clamp(min=1).to(total.dtype)
    return total / count


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the selected entries of ``x`` (all of them, one number).

    ``sum(m * (x - mean)^2) / (n - 1)`` (Bessel-corrected, like ``torch.var``) when
    ``unbiased``, else ``/ n``.  Fewer than 2 selected entries (1 for ``unbiased=False``) give 0.

    Args:
        x: ``[B, T]`` (or any shape) floating tensor.
        mask: same shape as ``x``; bool or numeric, non-zero = counts.
        unbiased: divide by ``n - 1`` (True) or ``n`` (False).

    Returns:
        0-d tensor, dtype of ``x``.
    """
    check_same_shape("masked_var", ("x", x), ("mask", mask))
    x = zero_masked(x, mask)  # garbage at masked positions must not reach the square's gradient
    mean = masked_mean(x, mask)
    sq_dev = masked_sum((x - mean) ** 2, mask)
    n = masked_count(mask).to(sq_dev.dtype)
    denom = n - 1 if unbiased else n
    return torch.where(denom > 0, sq_dev / denom.clamp(min=1), torch.zeros_like(sq_dev))


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise the selected entries of ``x`` to mean 0, std 1 (one mean/std over all of them).

    ``(x - mean) / sqrt(var + eps)`` with the masked mean and the *population* masked
    variance (divide by n), so the result has masked mean 0 and masked population std 1
    (up to ``eps``).  This is the global batch normalisation of Reinforce++ (Hu, 2025) and of
    PPO advantages; with ``shift_mean=False`` the mean is added back (only rescaled).
    Masked positions of the result are 0.

    Args:
        x: ``[B, T]`` floating tensor.
        mask: same shape; bool or numeric, non-zero = counts.
        shift_mean: subtract the mean (True) or keep it (False).
        eps: added to the variance before the square root.

    Returns:
        ``[B, T]`` tensor, dtype of ``x``; 0 at masked positions.  An all-zero mask gives all 0.
    """
    check_same_shape("masked_whiten", ("x", x), ("mask", mask))
    m = as_bool_mask(mask)
    x = zero_masked(x, m)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=False)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return zero_masked(whitened, m)
