"""The training loop's smaller sections (stages, wandb, the warm start); `configs.schema` re-exports them and
`TrainConfig` holds them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from configs.schema_retrieval import StrictModel


class StageConfig(StrictModel):
    """One stage of a staged schedule (R1-Searcher: stage 1 retrieval+format rewards, stage 2 F1)."""

    steps: int = Field(..., gt=0, description="Training steps of this stage.")
    recipe_options: dict[str, Any] = Field(default_factory=dict, description="Recipe config overrides, e.g. {stage: 2}.")
    train: str | None = Field(None, description="Training QA file of this stage; None = data.train.")


class WandbConfig(StrictModel):
    """Weights & Biases logging (offline unless configured: `wandb sync` uploads later)."""

    mode: Literal["offline", "online", "disabled"] = Field("offline", description="wandb mode.")
    project: str = Field("searchrl", description="wandb project.")
    entity: str | None = Field(None, description="wandb entity (team or user).")
    tags: list[str] = Field(default_factory=list, description="Run tags.")


class WarmStart(StrictModel):
    """Supervised fine-tuning before RL (`pipelines.warm_start`), on one of two sources: `policy`, rejection
    sampling (STaR, Zelikman et al. 2022; RFT, Yuan et al. 2023): the untrained policy's own episodes whose reward
    beats `min_reward` (s3's gain over naive RAG: above 0); or `expert`, the recipe's rule-based expert episodes
    (`Recipe.expert_turn`: it knows the gold answers and demonstrates with what retrieval returns, e.g. s3 selects
    the documents that hold a gold answer). Then supervised passes over their policy tokens, then the RL steps."""

    source: Literal["policy", "expert"] = Field(
        "policy", description="policy: the untrained policy's best episodes (rejection sampling); expert: the recipe's "
        "expert demonstrations, one per question, in the recipe's own prompt, tags and tokenization (questions whose "
        "gold answer retrieval never shows give none).")
    questions: int = Field(64, gt=0, description="Training questions rolled out for the warm start (a seeded sample).")
    samples: int = Field(4, gt=0, description="Episodes per question, at rollout.temperature (source policy; the "
                         "expert writes one).")
    min_reward: float = Field(0.0, description="Keep episodes whose reward is above this (s3: F1 gain over naive RAG); "
                              "source policy only: every expert demonstration is kept.")
    epochs: int = Field(1, gt=0, description="Supervised passes over the kept episodes.")
    lr: float | None = Field(None, gt=0, description="The supervised passes' learning rate (SFT usually takes a larger "
                             "one than RL, e.g. 2e-5); None = learner.lr. The RL steps keep learner.lr and its schedule.")
