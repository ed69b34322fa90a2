"""Typed settings of the RL algorithm (advantage estimator, clipping, KL, entropy, aggregation).

Same strict style as :mod:`configs.schema`: unknown keys are rejected, no type coercion,
assignments are validated, and every error names the field and says how to fix it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StrictModel(BaseModel):
    """Unknown keys rejected, no coercion, validated assignments (the style of `configs.schema`,
    redefined here so that `algorithms/` depends on nothing in the project)."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


# The names registered in `algorithms.registry` (ADVANTAGE_ESTIMATORS, LOSS_AGGS, KL_ESTIMATORS):
# a newly registered function must also be added here, or AlgorithmConfig rejects its name.
AdvantageEstimator = Literal["gae", "grpo", "dr_grpo", "reinforce_pp", "rloo", "group_mean"]
LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]
KLEstimator = Literal["k1", "k2", "k3"]

# Estimators whose advantages are whitened over the batch unless `whiten_advantages` says
# otherwise: PPO/GAE (verl, used by Search-R1 and s3), Reinforce++ and its group-mean-baseline
# variant (OpenRLHF `reinforce`, `reinforce_baseline`).  GRPO-style estimators are already
# normalised per group.
_WHITENED_BY_DEFAULT = frozenset({"gae", "reinforce_pp", "group_mean"})


class AlgorithmConfig(StrictModel):
    """RL algorithm settings.  ``AlgorithmConfig()`` is GRPO with the papers' KL (0.001, k3, loss)."""

    advantage_estimator: AdvantageEstimator = Field(
        "grpo",
        description="'gae' = PPO with a critic (GAE); 'grpo' = group-normalised outcome advantage "
        "(DeepSeekMath); 'dr_grpo' = GRPO without std scaling (Liu et al. 2025); 'reinforce_pp' = "
        "Reinforce++ return-to-go + batch whitening (Hu 2025); 'rloo' = leave-one-out baseline "
        "(Ahmadian et al. 2024); 'group_mean' = r - group mean (R1-Searcher's Reinforce++ baseline).",
    )
    gamma: float = Field(1.0, description="Discount over policy tokens, in [0, 1].")
    lam: float = Field(1.0, description="GAE lambda, in [0, 1]; only used by 'gae'.")
    policy_loss: Literal["ppo_clip", "nll"] = Field(
        "ppo_clip",
        description="'ppo_clip' = the PPO clipped surrogate (every RL update); 'nll' = the supervised negative "
        "log-likelihood of the policy tokens (advantages and old log-probs unused): the warm start's pass "
        "(pipelines/warm_start.py), which a PPO clip would stop once a token's probability rose by 1 + clip_eps.",
    )
    clip_eps: float = Field(
        0.2, description="PPO ratio clip epsilon (lower side, and upper unless clip_eps_high), in (0, 1)."
    )
    clip_eps_high: float | None = Field(
        None, description="Upper clip epsilon ('clip-higher', e.g. 0.28); None = clip_eps."
    )
    dual_clip: float | None = Field(
        None,
        description="Dual-clip constant c > 1 bounding the loss of negative advantages (Ye et al. 2020); None = off.",
    )
    kl_coef: float = Field(0.001, description="KL coefficient beta >= 0 (0.001 in s3, Search-R1, R-Search, Eval-RAR).")
    kl_estimator: KLEstimator = Field(
        "k3",
        description="Per-token KL estimator (Schulman 2020): k1 = log-ratio, k2 = half squared, "
        "k3 = low-variance (GRPO).",
    )
    kl_in_reward: bool = Field(
        False,
        description="True: subtract kl_coef * KL_t from the token rewards (PPO-RLHF, Reinforce++); "
        "False: add kl_coef * KL as a loss term (GRPO).",
    )
    entropy_coef: float = Field(0.0, description="Entropy bonus coefficient >= 0 (loss -= entropy_coef * entropy).")
    value_clip_eps: float | None = Field(
        0.2, description="Critic value clip epsilon > 0 around the rollout values; None = no clipping. 'gae' only."
    )
    loss_agg: LossAgg = Field(
        "token_mean",
        description="How token losses become a scalar: 'token_mean' (all policy tokens of the batch), "
        "'seq_mean_token_mean' (GRPO paper, 1/G sum 1/|o_i| sum_t), 'seq_mean_token_sum' (Dr.GRPO; the default "
        "when advantage_estimator is 'dr_grpo').",
    )
    norm_len: int | None = Field(
        None,
        gt=0,
        description="Constant divisor of each sequence's token sum for 'seq_mean_token_sum' "
        "(e.g. the max response length).",
    )
    grpo_eps: float = Field(1e-6, description="Added to the group std in GRPO advantages, >= 0.")
    off_policy_correction: Literal["none", "tis", "decoupled"] = Field(
        "none",
        description="Weight of each token's loss by pi_prox / mu, the learner's log-prob before the update over the "
        "rollout engine's (algorithms.off_policy): 'tis' = truncated at is_cap (Yao et al. 2025; verl, SkyRL); "
        "'decoupled' = AReaL's decoupled PPO, tokens over is_cap dropped; 'none' = on-policy (weights 1).",
    )
    is_cap: float = Field(
        2.0, gt=0, description="The behaviour weight's cap: truncation for 'tis', drop threshold for 'decoupled'.")
    skip_zero_advantage: bool = Field(
        False,
        description="Leave groups whose advantages are all zero out of the policy update (no gradient: DAPO's "
        "dynamic-sampling filter, GRESO's skip); counted in actor/skipped_groups. The loss is then normalised over "
        "the kept groups' tokens or sequences. A KL or entropy loss term applies to the kept groups only (a skipped "
        "group leaves the update whole: DAPO's filter drops it before the loss).",
    )
    whiten_advantages: bool | None = Field(
        None,
        description="Whiten advantages over all policy tokens of the batch; None = the estimator's "
        "usual choice (True for gae, reinforce_pp, group_mean; False for grpo, dr_grpo, rloo).",
    )

    # ------------------------------------------------------------------ field checks

    @model_validator(mode="before")
    @classmethod
    def _dr_grpo_token_sum(cls, data: Any) -> Any:
        """Dr.GRPO (Liu et al. 2025, §3.2) drops the 1/|o_i| length normalisation with the std: its loss is
        'seq_mean_token_sum' unless `loss_agg` is given."""
        if isinstance(data, dict) and data.get("advantage_estimator") == "dr_grpo" and "loss_agg" not in data:
            data = {**data, "loss_agg": "seq_mean_token_sum"}
        return data

    @field_validator("clip_eps")
    @classmethod
    def _clip_eps_range(cls, v: float) -> float:
        if not 0.0 < v < 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), e.g. 0.2; got {v}")
        return v

    @field_validator("clip_eps_high")
    @classmethod
    def _clip_eps_high_range(cls, v: float | None) -> float | None:
        if v is not None and v <= 0.0:
            raise ValueError(f"clip_eps_high must be > 0 (e.g. 0.28) or None to reuse clip_eps; got {v}")
        return v

    @field_validator("gamma", "lam")
    @classmethod
    def _unit_interval(cls, v: float, info: Any) -> float:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{info.field_name} must be in [0, 1] (1.0 for outcome rewards); got {v}")
        return v

    @field_validator("kl_coef", "entropy_coef", "grpo_eps")
    @classmethod
    def _non_negative(cls, v: float, info: Any) -> float:
        if v < 0.0:
            raise ValueError(f"{info.field_name} must be >= 0 (0 disables it); got {v}")
        return v

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_range(cls, v: float | None) -> float | None:
        if v is not None and v <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None to disable it; got {v}")
        return v

    @field_validator("value_clip_eps")
    @classmethod
    def _value_clip_range(cls, v: float | None) -> float | None:
        if v is not None and v <= 0.0:
            raise ValueError(f"value_clip_eps must be > 0 (e.g. 0.2) or None to disable value clipping; got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> AlgorithmConfig:
        if self.lam != 1.0 and not self.needs_critic:
            raise ValueError(
                f"lam={self.lam} only applies to advantage_estimator='gae' (the estimator with a critic); "
                f"set advantage_estimator='gae' or leave lam=1.0 for {self.advantage_estimator!r}"
            )
        if self.norm_len is not None and self.loss_agg != "seq_mean_token_sum":
            raise ValueError(
                f"norm_len only applies to loss_agg='seq_mean_token_sum'; set that loss_agg or norm_len=None "
                f"(loss_agg is {self.loss_agg!r})"
            )
        return self

    # ------------------------------------------------------------------ derived

    @property
    def needs_critic(self) -> bool:
        """True when a value model must be trained: only ``advantage_estimator='gae'``."""
        return self.advantage_estimator == "gae"

    @property
    def should_whiten(self) -> bool:
        """``whiten_advantages`` resolved against the estimator's default."""
        if self.whiten_advantages is not None:
            return self.whiten_advantages
        return self.advantage_estimator in _WHITENED_BY_DEFAULT

    @property
    def upper_clip_eps(self) -> float:
        """Upper clip epsilon actually used (``clip_eps_high`` or ``clip_eps``)."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high
