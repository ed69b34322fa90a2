"""Bootstrap statistics for the evaluation (pure numpy: no Ray, no engine).

Percentile bootstrap over questions: resample the per-question scores with replacement, take the
mean of each resample, and read the interval off the quantiles of those means (Efron & Tibshirani,
ch. 13). A paired difference resamples the same question indices for both methods, i.e. it
bootstraps the per-question differences, so the noise the two methods share cancels. Every
function takes a fixed `seed` (default `DEFAULT_SEED`): the same scores give the same interval.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
"""Bootstrap resamples per interval."""

DEFAULT_CONFIDENCE = 0.95
"""Two-sided coverage of an interval (0.95: the 2.5% and 97.5% quantiles)."""

DEFAULT_SEED = 0
"""Seed of the resampling (numpy's default_rng): fixed, so results files are reproducible."""

_BLOCK = 256  # resamples drawn at a time: bounds memory to 256 × n indices for large test sets


def _scores(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    """`values` as a 1-D float64 array.

    Raises:
        ValueError: not 1-D, empty, or holding NaN / inf (the message names `name`).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D series of per-question scores, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name}: empty; a bootstrap needs at least one question")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: holds NaN or inf at index {int(np.flatnonzero(~np.isfinite(x))[0])}")
    return x


def _check_settings(resamples: int, confidence: float) -> None:
    """Raises ValueError when `resamples` < 1 or `confidence` is outside (0, 1)."""
    if int(resamples) != resamples or resamples < 1:
        raise ValueError(f"resamples={resamples!r}: must be an integer >= 1 (2000 is usual)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r}: must lie strictly between 0 and 1 (e.g. 0.95)")


def bootstrap_means(values: Sequence[float] | np.ndarray, *, resamples: int = DEFAULT_RESAMPLES,
                    seed: int = DEFAULT_SEED) -> np.ndarray:
    """Means of `resamples` bootstrap resamples of `values`.

    Args:
        values: per-question scores, shape (n,), n >= 1.
        resamples: how many resamples (each n indices drawn with replacement).
        seed: numpy `default_rng` seed; the same seed and n draw the same indices.
    Returns:
        Shape (resamples,) float64, the mean of each resample (the scores' unit).
    Raises:
        ValueError: `values` empty, not 1-D or not finite; `resamples` < 1.
    """
    x = _scores(values, "values")
    _check_settings(resamples, DEFAULT_CONFIDENCE)
    rng = np.random.default_rng(seed)
    out = np.empty(int(resamples))
    for start in range(0, int(resamples), _BLOCK):
        stop = min(start + _BLOCK, int(resamples))
        out[start:stop] = x[rng.integers(0, x.size, size=(stop - start, x.size))].mean(axis=1)
    return out


def bootstrap_ci(values: Sequence[float] | np.ndarray, *, resamples: int = DEFAULT_RESAMPLES,
                 confidence: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_SEED) -> tuple[float, float, float]:
    """The mean of `values` and its percentile bootstrap interval.

    Args:
        values: per-question scores (e.g. EM in {0, 1}, F1 in [0, 1]), shape (n,), n >= 1.
        resamples: bootstrap resamples; confidence: two-sided coverage; seed: resampling seed.
    Returns:
        `(mean, lo, hi)` in the scores' unit: the sample mean and the (1 - confidence)/2 and
        (1 + confidence)/2 quantiles of the resampled means. A constant series gives lo == hi.
    Raises:
        ValueError: `values` empty, not 1-D or not finite; `resamples` < 1; `confidence` not in (0, 1).
    """
    x = _scores(values, "values")
    _check_settings(resamples, confidence)
    means = bootstrap_means(x, resamples=resamples, seed=seed)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(x.mean()), float(lo), float(hi)


def paired_difference(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                      resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                      seed: int = DEFAULT_SEED) -> tuple[float, float, float]:
    """The mean of `a - b` over questions and its percentile bootstrap interval, each resample taking
    the same question indices from `a` and `b`.

    Args:
        a, b: per-question scores of two methods, shape (n,) each, element i the same question
            (`paired_by_question` aligns them by question id).
        resamples, confidence, seed: as in `bootstrap_ci`.
    Returns:
        `(mean_diff, lo, hi)` in the scores' unit; identical series give exactly (0.0, 0.0, 0.0).
    Raises:
        ValueError: `a` or `b` empty, not 1-D or not finite; their lengths differ (names both);
            bad `resamples` / `confidence`.
    """
    x, y = _scores(a, "a"), _scores(b, "b")
    if x.size != y.size:
        raise ValueError(f"b: {y.size} scores against a's {x.size}; paired series must hold the same questions "
                         "in the same order (align them with paired_by_question)")
    # Resampling index i takes a[i] and b[i] together: bootstrapping the differences is exactly that.
    return bootstrap_ci(x - y, resamples=resamples, confidence=confidence, seed=seed)


def paired_by_question(a: Mapping[Hashable, float], b: Mapping[Hashable, float]) -> tuple[list, np.ndarray, np.ndarray]:
    """The questions scored in both `a` and `b`, and their scores aligned.

    Args:
        a, b: per-question scores keyed by question (e.g. `(dataset, id)`); a question missing
            from either side is left out.
    Returns:
        `(keys, a_scores, b_scores)`: the shared keys in `a`'s order, and two float64 arrays of
        shape (len(keys),), element i of both belonging to keys[i].
    Raises:
        ValueError: `a` and `b` share no question.
    """
    keys = [k for k in a if k in b]
    if not keys:
        raise ValueError(f"a and b share no question ({len(a)} and {len(b)} keys); nothing to pair")
    return keys, np.array([a[k] for k in keys], dtype=np.float64), np.array([b[k] for k in keys], dtype=np.float64)


__all__ = [
    "DEFAULT_CONFIDENCE", "DEFAULT_RESAMPLES", "DEFAULT_SEED", "bootstrap_ci", "bootstrap_means", "paired_by_question",
    "paired_difference",
]
