"""The ``advantage_estimator`` registry's entries and :func:`compute_advantages`, the learner's one entry point.

Each estimator of :mod:`algorithms.advantages` is registered in ``ADVANTAGE_ESTIMATORS`` (see
:mod:`algorithms.registry`) behind one uniform adapter signature::

    fn(cfg, seq_rewards, loss_mask, *, group_ids, values, logprobs, ref_logprobs) -> (advantages, returns)

Shapes: ``seq_rewards`` ``[B]`` (finite, fp32/fp64: :func:`compute_advantages` checks and casts
it); ``loss_mask`` ``[B, T]`` (bool or float, non-zero = 1) is 1 on policy tokens and 0 on
observations and padding; ``values``, ``logprobs``, ``ref_logprobs`` ``[B, T]`` and
``group_ids`` (length B) may be None, and an estimator that needs one raises ``ValueError``
naming it.  Results are ``[B, T]``, 0 at masked positions and *not* whitened:
:func:`compute_advantages` whitens when ``cfg.should_whiten``.

To add an estimator, see :mod:`algorithms.registry` (register it, and list its name in
``AdvantageEstimator`` in ``algorithms/config.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .advantages import (
    GroupIds,
    _check_seq_rewards,
    _float_dtype,
    gae,
    group_mean_scores,
    grpo_scores,
    kl_penalized_rewards,
    reinforce_pp_advantages,
    rloo_scores,
    terminal_rewards,
)
from .masked import masked_whiten
from .registry import ADVANTAGE_ESTIMATORS as ADVANTAGE_ESTIMATORS  # re-export: the registry filled below
from .registry import get_advantage_estimator, register_advantage_estimator

if TYPE_CHECKING:
    from .config import AlgorithmConfig


# ----------------------------------------------------------------------------- shared steps


def _outcome_token_rewards(
    cfg: AlgorithmConfig, seq_scores: Tensor, loss_mask: Tensor, logprobs: Tensor | None, ref_logprobs: Tensor | None
) -> Tensor:
    """``[B, T]``: each ``seq_scores`` ``[B]`` on its last policy token, minus ``kl_coef * KL_t`` if kl_in_reward."""
    if cfg.kl_in_reward and cfg.kl_coef > 0:
        if logprobs is None or ref_logprobs is None:
            raise ValueError("compute_advantages: kl_in_reward=True needs `logprobs` and `ref_logprobs`")
        return kl_penalized_rewards(seq_scores, logprobs, ref_logprobs, loss_mask, cfg.kl_coef, cfg.kl_estimator)
    return terminal_rewards(seq_scores, loss_mask)


def _outcome_returns(
    cfg: AlgorithmConfig, seq_scores: Tensor, loss_mask: Tensor, logprobs: Tensor | None, ref_logprobs: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, both the un-whitened return-to-go (``cfg.gamma``) of the outcome token rewards."""
    token_rewards = _outcome_token_rewards(cfg, seq_scores, loss_mask, logprobs, ref_logprobs)
    return reinforce_pp_advantages(token_rewards, loss_mask, cfg.gamma, whiten=False)


# ----------------------------------------------------------------------------- registered estimators


@register_advantage_estimator("gae")
def _gae_estimator(
    cfg: AlgorithmConfig, seq_rewards: Tensor, loss_mask: Tensor, *, group_ids: GroupIds | None,
    values: Tensor | None, logprobs: Tensor | None, ref_logprobs: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """PPO: outcome token rewards, then :func:`algorithms.advantages.gae` (``gamma``, ``lam``) with ``values``."""
    token_rewards = _outcome_token_rewards(cfg, seq_rewards, loss_mask, logprobs, ref_logprobs)
    if values is None:
        raise ValueError("compute_advantages: advantage_estimator='gae' needs `values` from the critic")
    return gae(token_rewards, values, loss_mask, cfg.gamma, cfg.lam)


@register_advantage_estimator("reinforce_pp")
def _reinforce_pp_estimator(
    cfg: AlgorithmConfig, seq_rewards: Tensor, loss_mask: Tensor, *, group_ids: GroupIds | None,
    values: Tensor | None, logprobs: Tensor | None, ref_logprobs: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Reinforce++ (Hu 2025): the return-to-go of the outcome token rewards."""
    return _outcome_returns(cfg, seq_rewards, loss_mask, logprobs, ref_logprobs)


def _register_group_estimator(name: str, score: Callable[[AlgorithmConfig, Tensor, GroupIds], Tensor]) -> None:
    """Register ``name``: ``score(cfg, seq_rewards, group_ids)`` ``[B]`` as each sequence's outcome,
    then the return-to-go as ``"reinforce_pp"``.  Needs ``group_ids``."""

    @register_advantage_estimator(name)
    def estimator(
        cfg: AlgorithmConfig, seq_rewards: Tensor, loss_mask: Tensor, *, group_ids: GroupIds | None,
        values: Tensor | None, logprobs: Tensor | None, ref_logprobs: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        if group_ids is None:
            raise ValueError(f"compute_advantages: advantage_estimator={name!r} needs `group_ids` (one per sequence)")
        return _outcome_returns(cfg, score(cfg, seq_rewards, group_ids), loss_mask, logprobs, ref_logprobs)

    estimator.__name__ = estimator.__qualname__ = f"_{name}_estimator"


_register_group_estimator("grpo", lambda cfg, r, ids: grpo_scores(r, ids, cfg.grpo_eps, scale_by_std=True))
_register_group_estimator("dr_grpo", lambda cfg, r, ids: grpo_scores(r, ids, cfg.grpo_eps, scale_by_std=False))
_register_group_estimator("rloo", lambda cfg, r, ids: rloo_scores(r, ids))
_register_group_estimator("group_mean", lambda cfg, r, ids: group_mean_scores(r, ids))


# ----------------------------------------------------------------------------- dispatcher


@torch.no_grad()
def compute_advantages(
    config: AlgorithmConfig,
    seq_rewards: Tensor,
    loss_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Advantages and returns for ``config.advantage_estimator`` (one entry point for the learner).

    Looks the estimator up in ``ADVANTAGE_ESTIMATORS``:

    * ``"gae"``: token rewards = terminal reward (minus ``kl_coef * KL_t`` if ``kl_in_reward``),
      then :func:`algorithms.advantages.gae` with ``gamma``/``lam``; needs ``values``.
    * every other estimator: a sequence score ``s_i`` (``reinforce_pp``: ``r_i``; ``grpo``,
      ``dr_grpo``, ``rloo``, ``group_mean``: the group-relative score; needs ``group_ids``),
      placed on the last policy token (minus the per-token KL if ``kl_in_reward``), then the
      return-to-go with ``gamma`` over policy tokens.  With ``gamma = 1`` and no KL in the
      reward that is just ``s_i`` on every policy token (= ``grpo_advantages`` etc.).
    * finally advantages are whitened over the batch when ``config.should_whiten``.

    Args:
        config: :class:`algorithms.config.AlgorithmConfig`.
        seq_rewards: ``[B]`` float outcome rewards.
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        group_ids: length-B group ids (group estimators).
        values: ``[B, T]`` critic values (``"gae"``).
        logprobs, ref_logprobs: ``[B, T]`` rollout / reference log-probs (``kl_in_reward``).

    Returns:
        ``(advantages, returns)``, ``[B, T]`` fp32, 0 at masked positions.  ``returns`` is the
        critic target for GAE and the un-whitened return-to-go otherwise.

    Raises:
        ValueError: non-finite or mis-shaped ``seq_rewards``, an unregistered estimator, or an
            input the estimator needs left None.
    """
    _check_seq_rewards("compute_advantages", seq_rewards, loss_mask)
    estimator = get_advantage_estimator(config.advantage_estimator)
    rewards = seq_rewards.to(_float_dtype(seq_rewards))
    advantages, returns = estimator(
        config, rewards, loss_mask, group_ids=group_ids, values=values, logprobs=logprobs, ref_logprobs=ref_logprobs
    )
    if config.should_whiten:
        advantages = masked_whiten(advantages, loss_mask)
    return advantages, returns
