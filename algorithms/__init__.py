"""Pure torch RL math for search agents: advantage estimators, KL estimators and losses.

No Ray, vLLM, DeepSpeed or transformers here: only tensors in, tensors out.

Tensors are response tokens ``[B, T]`` (B sequences, T tokens, right-padded).  ``loss_mask``
``[B, T]`` (bool or float) is 1 on tokens the policy generated and 0 on environment tokens
(retrieved documents / observations inserted between policy turns) and padding.  Masked spans
sit in the middle of a response, so every estimator works on the sub-sequence of policy tokens:
GAE and returns-to-go carry across an observation instead of stopping there.

* :mod:`algorithms.masked`: masked sum / mean / var / whiten (an empty mask gives 0, not NaN).
* :mod:`algorithms.kl`: per-token KL estimators k1 / k2 / k3, log-probs and entropy from logits.
* :mod:`algorithms.advantages`: GAE (PPO), GRPO, Dr.GRPO, RLOO, group-mean baseline,
  Reinforce++, terminal and KL-penalised token rewards.
* :mod:`algorithms.estimators`: those estimators registered under their ``advantage_estimator``
  names, and the :func:`compute_advantages` dispatcher.
* :mod:`algorithms.losses`: PPO clipped policy loss (clip-higher, dual clip), clipped value loss,
  KL and entropy terms, and the three loss aggregations (token mean, sequence mean, Dr.GRPO).
* :mod:`algorithms.off_policy`: behaviour weights pi_prox / mu of the off-policy corrections
  (truncated importance sampling, AReaL's decoupled PPO) for the policy loss's ``token_weights``.
* :mod:`algorithms.registry`: name -> function registries ``ADVANTAGE_ESTIMATORS``, ``LOSS_AGGS``,
  ``KL_ESTIMATORS`` with their ``register_*`` decorators and ``get_*`` look-ups; how to add one.
* :mod:`algorithms.config`: :class:`AlgorithmConfig` (pydantic, strict).
"""

from .advantages import (
    gae,
    group_indices,
    group_mean_baseline_advantages,
    group_mean_scores,
    grpo_advantages,
    grpo_scores,
    kl_penalized_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    rloo_scores,
    terminal_rewards,
    zero_advantage_groups,
)
from .config import AlgorithmConfig
from .estimators import compute_advantages
from .kl import entropy_from_logits, kl_estimate, logprobs_from_logits
from .losses import aggregate, entropy_loss, kl_loss, nll_loss, policy_loss, value_loss
from .off_policy import behaviour_weights
from .masked import masked_mean, masked_sum, masked_var, masked_whiten
from .registry import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGS,
    get_advantage_estimator,
    get_kl_estimator,
    get_loss_agg,
    register_advantage_estimator,
    register_kl_estimator,
    register_loss_agg,
)

__all__ = [
    "behaviour_weights",
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGGS",
    "AlgorithmConfig",
    "aggregate",
    "compute_advantages",
    "entropy_from_logits",
    "entropy_loss",
    "gae",
    "get_advantage_estimator",
    "get_kl_estimator",
    "get_loss_agg",
    "group_indices",
    "group_mean_baseline_advantages",
    "group_mean_scores",
    "grpo_advantages",
    "grpo_scores",
    "kl_estimate",
    "kl_loss",
    "kl_penalized_rewards",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "nll_loss",
    "policy_loss",
    "register_advantage_estimator",
    "zero_advantage_groups",
    "register_kl_estimator",
    "register_loss_agg",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "rloo_scores",
    "terminal_rewards",
    "value_loss",
]
