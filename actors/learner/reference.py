"""`ReferenceModel`: the frozen reference policy of the KL term; log-probs only, no DeepSpeed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from actors.learner.batch import TrainBatch, group_order
from actors.learner.rank import torch_dtype
from actors.learner.token_stats import PolicyTokenStats
from configs.schema import LearnerConfig


class ReferenceModel:
    """The frozen reference policy π_ref (the KL anchor of s3 Eq. 2 / GRPO): log-probs only, no
    optimizer, no DeepSpeed (inference in `config.dtype` on one device).

    Args:
        config: `LearnerConfig`; `reference_model` (default: the policy's starting model).
        temperature: the rollout sampling temperature (logits are divided by it, as the policy's).
    """

    def __init__(self, config: LearnerConfig | Mapping[str, Any], temperature: float = 1.0):
        from transformers import AutoModelForCausalLM

        from actors.engines.models import resolve_model

        self.config = config if isinstance(config, LearnerConfig) else LearnerConfig(**dict(config))
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        self.device = torch.device("cuda" if self.config.gpus_per_rank > 0 and torch.cuda.is_available() else "cpu")
        path = resolve_model(self.config.reference_model or self.config.model)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(self.config.dtype)).to(self.device).eval()
        if self.config.liger:
            from actors.learner.liger import apply_liger

            apply_liger(lm)
        self.module = PolicyTokenStats(lm, self.config.logprob_chunk_tokens, temperature, self.config.shared_prefix)

    @torch.no_grad()
    def compute_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Reference log-probs `[B, R]` float32 of the response tokens (0 where masked)."""
        out = torch.zeros((batch.size, batch.response_len))
        # A group's rows next to each other, so that a micro-batch packs them (`shared_prefix`).
        rows = group_order(batch.group_ids)
        step = self.config.micro_batch_size
        for start in range(0, batch.size, step):
            idx = rows[start : start + step]
            mb = batch.select(idx).to(self.device)
            lp, _ = self.module(mb.input_ids, mb.attention_mask, mb.loss_mask, mb.prompt_len)
            out[idx, : lp.shape[1]] = lp.float().cpu()
        return out

    def shutdown(self) -> None:
        """Drop the model (its memory is freed once nothing else references it)."""
        self.module = None
