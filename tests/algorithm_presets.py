"""Per-recipe :class:`algorithms.AlgorithmConfig` settings of the papers, for tests.

``AlgorithmConfig(**RECIPE_PRESETS["s3"])`` is the algorithm s3 was trained with.
"""

from __future__ import annotations

from typing import Any

# Paper settings per recipe.  PPO (s3 App. A.2 "KL regularization 0.001" via verl; Search-R1's PPO)
# puts a k1 KL in the reward (verl kl_ctrl).  R1-Searcher (Sec. 2.2.2) uses Reinforce++ with a
# group-mean baseline (OpenRLHF; KL 1e-4 in its GRPO-vs-Reinforce++ study, KL in the reward).
# R-Search (Sec. 4.3, beta = 0.001) and Eval-RAR (App. A.2, beta = 0.001, eps = 0.2; Eq. 6 =
# per-sequence token mean) use GRPO with the KL as a k3 loss term.
RECIPE_PRESETS: dict[str, dict[str, Any]] = {
    "s3": dict(advantage_estimator="gae", kl_coef=0.001, kl_estimator="k1", kl_in_reward=True),
    "search_r1": dict(advantage_estimator="gae", kl_coef=0.001, kl_estimator="k1", kl_in_reward=True),
    "r1_searcher": dict(advantage_estimator="group_mean", kl_coef=1e-4, kl_estimator="k1", kl_in_reward=True),
    "r_search": dict(advantage_estimator="grpo", kl_coef=0.001, kl_estimator="k3", kl_in_reward=False),
    "eval_rar": dict(
        advantage_estimator="grpo", kl_coef=0.001, kl_estimator="k3", kl_in_reward=False, loss_agg="seq_mean_token_mean"
    ),
}
