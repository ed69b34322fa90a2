"""`PolicyLearner`: one DeepSpeed rank of the policy: per-token log-probs and entropies, PPO-family
updates (`algorithms/` losses), and the weights handed to the rollout engines."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from actors.learner.batch import TrainBatch
from actors.learner.lora import adapted_layers, add_lora, merged_state, save_adapter
from actors.learner.rank import DeepSpeedRank, mean_metrics, torch_dtype
from actors.learner.token_stats import PolicyTokenStats
from algorithms import (
    AlgorithmConfig,
    behaviour_weights,
    entropy_loss,
    kl_estimate,
    kl_loss,
    masked_mean,
    nll_loss,
    policy_loss,
    zero_advantage_groups,
)
from configs.schema import LearnerConfig


def single_step(config: LearnerConfig, batch_size: int) -> bool:
    """Whether an update over `batch_size` sequences is one optimizer step (one PPO epoch, one
    mini-batch). Then the log-probs before the update equal those of the update's own forward pass,
    and the separate old-log-prob pass is waste (the ratio is 1 at the only step)."""
    return config.ppo_epochs == 1 and batch_size == config.mini_batch_size


class PolicyLearner(DeepSpeedRank):
    """The policy: per-token log-probs/entropies, PPO-family updates, weights for the rollout engines.

    Args:
        config: `LearnerConfig` (model, ZeRO stage, dtype, optimizer, batch sizes, ...).
        rank, world_size: this rank and the group size; call `init_distributed` then `setup`.
        total_steps: the run's training steps (the warm-up ratio is a fraction of them).
        temperature: the rollout sampling temperature (`rollout.temperature`): logits are divided
            by it, so the recomputed log-probs are those of the sampling distribution.
    """

    role = "policy"

    def __init__(self, config: LearnerConfig | Mapping[str, Any], rank: int = 0, world_size: int = 1,
                 temperature: float = 1.0, total_steps: int | None = None):
        super().__init__(config, rank, world_size, total_steps)
        self.temperature = temperature

    def setup(self, random_init: bool = False) -> int:
        """Load the model and start the DeepSpeed engine; returns the number of parameters.

        `random_init`: the model's architecture (its `config.json`) with seeded random weights, for
        benchmarks of shapes whose weights are not at hand (`scripts.bench.learner --local --random-init`).
        """
        from transformers import AutoConfig, AutoModelForCausalLM

        from actors.engines.models import resolve_model

        torch.manual_seed(self.config.seed)
        self.model_path = resolve_model(self.config.model)
        if random_init:
            with torch.device(self.device):
                lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.model_path), dtype=torch.float32)
        else:
            lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        lm.config.use_cache = False
        if self.config.freeze_embeddings:  # tied LM heads share this tensor, so they stay fixed too
            lm.get_input_embeddings().weight.requires_grad_(False)
        if self.config.gradient_checkpointing:  # True or auto (then switched per micro-batch)
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.config.liger:  # before LoRA and compile wrap the modules it patches
            from actors.learner.liger import apply_liger

            apply_liger(lm)
        self._decoder = lm
        if self.config.lora:  # only the adapters train (actors.learner.lora)
            lm = add_lora(lm, self.config.lora, bool(self.config.gradient_checkpointing))
        if self.config.compile_layers:
            from actors.learner.compiled import compile_layers

            compile_layers(self._decoder)
        module = PolicyTokenStats(lm, self.config.logprob_chunk_tokens, self.temperature, self.config.shared_prefix)
        self._start_engine(module, self.config.lr)
        return sum(p.numel() for p in lm.parameters())

    def _stats(self, mb: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.engine(mb.input_ids, mb.attention_mask, mb.loss_mask, mb.prompt_len)

    @torch.no_grad()
    def compute_logprobs(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """Log-probs and entropies of this rank's rows (`rows = range(rank, B, world_size)`).

        Returns:
            {"rows": int64 [b], "logprobs": float32 [b, R], "entropy": float32 [b, R]} (0 where masked).
        """
        self.engine.eval()
        rows = self._my_rows(self._batch_rows(batch), batch)
        lp = torch.zeros((len(rows), batch.response_len))
        ent = torch.zeros_like(lp)
        done = 0
        for micro in self._micro_batches(rows, batch):
            mb = batch.select(micro).to(self.device)
            a, b = self._stats(mb)
            lp[done : done + len(micro), : a.shape[1]] = a.float().cpu()
            ent[done : done + len(micro), : b.shape[1]] = b.float().cpu()
            done += len(micro)
        return {"rows": rows, "logprobs": lp, "entropy": ent}

    def update(self, batch: TrainBatch, algorithm: AlgorithmConfig | Mapping[str, Any],
               lr: float | None = None) -> dict[str, float]:
        """PPO-style epochs over the batch (s3 Eq. 2, Eval-RAR Eq. 6, R-Search Eq. 2): clipped
        surrogate on `batch.advantages`, plus `kl_coef` × KL to `batch.ref_logprobs` when the KL is a
        loss term (GRPO), minus `entropy_coef` × entropy. With `algorithm.policy_loss` "nll" the surrogate is
        the supervised negative log-likelihood instead (`algorithms.nll_loss`; the warm start), and
        `old_logprobs` and the advantages' values are not read.

        Args:
            batch: with `advantages` (and `ref_logprobs` when the KL is a loss term), `[B, R]`;
                `old_logprobs` may be None when the update is one optimizer step (`single_step`): the
                current log-probs, detached, are then exactly the rollout policy's.
            algorithm: `AlgorithmConfig` (clip ε, KL, entropy, loss aggregation).
            lr: this update's learning rate instead of the schedule's (the warm start's `warm_start.lr`); None =
                the schedule's.

        Returns:
            Means over micro-batches: policy_loss, kl, entropy, clip_frac, approx_kl, ratio_max;
            per optimizer step: grad_norm, lr; plus optimizer_steps, tokens (policy tokens seen on this rank),
            skipped_groups (with `algorithm.skip_zero_advantage`: groups left out, their advantages all 0),
            sequence_tokens (prompt and response tokens the forward passes ran over, this rank; with
            `shared_prefix`, a group's prompt counts once)
            and update_s (seconds).

        Raises:
            ValueError: `batch.advantages` is missing, or the KL loss needs `ref_logprobs`, or the batch
                size is not a multiple of `mini_batch_size`, or `old_logprobs` is missing for an update
                of more than one optimizer step (an update whose groups `skip_zero_advantage` all leaves out
                takes none and needs none: the trainer passes no log-probs for rows it does not train).
        """
        algo = algorithm if isinstance(algorithm, AlgorithmConfig) else AlgorithmConfig(**dict(algorithm))
        if batch.advantages is None:
            raise ValueError("PolicyLearner.update: batch.advantages is None; compute advantages first")
        supervised = algo.policy_loss == "nll"  # the warm start's pass: no ratio, so no old log-probs needed
        keep, skipped = None, 0
        if algo.skip_zero_advantage:
            dropped = zero_advantage_groups(batch.advantages, batch.loss_mask, batch.group_ids)
            keep, skipped = ~dropped, len({g for g, d in zip(batch.group_ids, dropped.tolist()) if d})
        trains = keep is None or bool(keep.any())  # every group left out: no optimizer step, no ratio to take
        if batch.old_logprobs is None and not supervised and trains and not single_step(self.config, batch.size):
            raise ValueError(
                "PolicyLearner.update: batch.old_logprobs is None, but this update takes more than one optimizer "
                f"step (ppo_epochs={self.config.ppo_epochs}, {batch.size} sequences, mini_batch_size="
                f"{self.config.mini_batch_size}); compute them first (compute_logprobs)")
        kl_term = algo.kl_coef > 0 and not algo.kl_in_reward
        if kl_term and batch.ref_logprobs is None:
            raise ValueError("PolicyLearner.update: the KL loss term needs batch.ref_logprobs "
                             "(or set kl_coef=0 / kl_in_reward=true)")
        t0 = time.perf_counter()
        self._apply_lr_schedule(lr)
        self.engine.train()
        rows_metrics: list[dict[str, float]] = []
        step_metrics: list[dict[str, float]] = []
        tokens = sequence_tokens = 0
        for epoch in range(self.config.ppo_epochs):
            for mini_rows in self._plan(batch, epoch, keep):
                mini_mask = batch.loss_mask[mini_rows]  # the mini-batch's normaliser (its kept rows only)
                micros = self._accumulation(mini_rows, batch)
                for k, micro in enumerate(micros):
                    self._auto_checkpointing(micro, batch)
                    mb = batch.select(micro).to(self.device)
                    logprobs, entropy = self._stats(mb)
                    mask = mb.loss_mask
                    # One optimizer step: the weights are still the rollout's, so old = current (ratio 1).
                    old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
                    weights, wm = self._behaviour_weights(old, mb, algo)
                    if supervised:
                        loss, m = nll_loss(logprobs, mask, agg=algo.loss_agg, norm_len=algo.norm_len)
                    else:
                        loss, m = policy_loss(logprobs, old, mb.advantages, mask, clip_eps=algo.clip_eps,
                                              clip_eps_high=algo.clip_eps_high, dual_clip=algo.dual_clip,
                                              agg=algo.loss_agg, norm_len=algo.norm_len, token_weights=weights)
                    row = {"policy_loss": float(loss.detach()), **{k: float(v) for k, v in {**m, **wm}.items()}}
                    if kl_term:
                        kl = kl_loss(logprobs, mb.ref_logprobs, mask, estimator=algo.kl_estimator, agg=algo.loss_agg,
                                     norm_len=algo.norm_len)
                        loss = loss + algo.kl_coef * kl
                    if mb.ref_logprobs is not None:
                        row["kl"] = float(masked_mean(kl_estimate(logprobs.detach(), mb.ref_logprobs, algo.kl_estimator), mask))
                    ent = entropy_loss(entropy, mask, agg=algo.loss_agg, norm_len=algo.norm_len)
                    if algo.entropy_coef:
                        loss = loss - algo.entropy_coef * ent
                    row["entropy"] = float(ent.detach())
                    self._backward(loss * self._loss_scale(mb, mini_mask, algo.loss_agg), last=k == len(micros) - 1)
                    tokens += int(mask.sum())
                    sequence_tokens += self.engine.module.tokens_run  # packed: each shared prompt once
                    rows_metrics.append(row)
                if micros:
                    step_metrics.append({"grad_norm": self._last_grad_norm(), "lr": float(self.engine.get_lr()[0])})
        self.updates += 1
        out = {**mean_metrics(rows_metrics), **mean_metrics(step_metrics)}
        out.update(optimizer_steps=float(len(step_metrics)), tokens=float(tokens),
                   sequence_tokens=float(sequence_tokens), update_s=time.perf_counter() - t0)
        if algo.skip_zero_advantage:
            out["skipped_groups"] = float(skipped)
        return out

    @staticmethod
    def _behaviour_weights(proximal: torch.Tensor, mb: TrainBatch, algo: AlgorithmConfig):
        """(token weights or None, metrics) of `algo.off_policy_correction` (`algorithms.off_policy`):
        the proximal policy is the update's `old` log-probs, the behaviour policy the engine's."""
        if algo.off_policy_correction == "none" or mb.behaviour_logprobs is None:
            return None, {}
        return behaviour_weights(proximal, mb.behaviour_logprobs, mb.loss_mask, algo.off_policy_correction,
                                 algo.is_cap)

    def named_weights(self, dtype: str = "bf16") -> list[tuple[str, torch.Tensor]] | None:
        """The policy's trainable weights with Hugging Face names, for `RolloutWorker.update_weights`
        (gathered from ZeRO partitions; every rank must call; rank 0 gets the list, others None)."""
        # Frozen tensors (`freeze_embeddings`: 168M of Gemma 3 270M's 268M parameters) are never sent: the
        # engines started from the same model and keep them (whole layers; VLLMEngine.update_weights).
        # LoRA: the decoder layers with adapters, merged (every tensor of such a layer: vLLM reloads whole layers).
        state = self._full_state_dict(trainable_only=not self.config.lora)
        if self.rank != 0:
            return None
        state = {name.removeprefix("lm."): t for name, t in state.items()}
        if self.config.lora:
            layers = adapted_layers(state)
            state = {n: t for n, t in self._merged(state).items() if n.startswith(tuple(layers))}
        cast = torch_dtype(dtype) if dtype != "model" else None
        return [(name, t.to(cast) if cast else t) for name, t in state.items()]

    def _merged(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hugging Face weights of a LoRA policy's state (`actors.learner.lora.merged_state`)."""
        return merged_state(state, self.config.lora.alpha / self.config.lora.rank)

    def sync_payload(self, dtype: str = "bf16") -> tuple[int, list[tuple[str, torch.Tensor]] | None]:
        """`(bytes, named_weights(dtype))` for `LearnerGroup.sync_weights`, called with two returns: the
        driver reads the small size, and passes the weights' ObjectRef on to the rollout workers unread
        (one object-store copy, none in the driver). Every rank must call; ranks other than 0 give (0, None)."""
        named = self.named_weights(dtype)
        return (sum(t.numel() * t.element_size() for _, t in named) if named else 0), named

    def _save_hf(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        state = {n.removeprefix("lm."): t for n, t in self._full_state_dict().items()}
        if self.rank == 0:
            lm = self.engine.module.lm
            if self.config.lora:  # the merged model (what evaluation and serving load) and the adapter alone
                save_adapter(state, self.config.lora, directory.parent / "adapter", self.model_path)
                state = self._merged(state)
            lm.save_pretrained(str(directory), state_dict=state, safe_serialization=True)
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(str(directory))


