"""`CriticLearner`: one DeepSpeed rank of the PPO critic, a value head on the policy's decoder
(s3 and Search-R1 train one; GAE needs its values)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from actors.learner.batch import TrainBatch
from actors.learner.rank import DeepSpeedRank, mean_metrics
from actors.learner.token_stats import ValueModel
from algorithms import AlgorithmConfig, masked_mean, value_loss


class CriticLearner(DeepSpeedRank):
    """The PPO critic: a value head on the policy's decoder (s3 trains one; GAE needs its values).

    Args: as `PolicyLearner`; `config.critic_lr` is its learning rate and `config.critic_model`
    (default: the policy model) its starting weights.
    """

    role = "critic"

    @property
    def micro_batch_size(self) -> int:
        """`critic_micro_batch_size`, else the policy's (s3 App. A.2: critic 10, actor 15)."""
        return self.config.critic_micro_batch_size or self.config.micro_batch_size

    @property
    def warmup_ratio(self) -> float:
        """`critic_warmup_ratio` (s3 App. A.2: 1% for the critic, none for the actor)."""
        return self.config.critic_warmup_ratio

    def setup(self) -> int:
        """Load the decoder, add the value head (or load a saved critic), start DeepSpeed."""
        from transformers import AutoModel

        from actors.engines.models import resolve_model

        torch.manual_seed(self.config.seed + 1)
        self.model_path = resolve_model(self.config.critic_model or self.config.model)
        decoder = AutoModel.from_pretrained(self.model_path, dtype=torch.float32)
        if self.config.gradient_checkpointing:  # True or auto (then switched per micro-batch)
            decoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._decoder = decoder
        hidden = getattr(decoder.config, "hidden_size", None) or decoder.config.get_text_config().hidden_size
        module = ValueModel(decoder, hidden, self.config.shared_prefix)
        head = Path(self.model_path) / "value_head.safetensors"
        if head.is_file():
            from safetensors.torch import load_file

            module.value_head.load_state_dict(load_file(str(head)))
        self._start_engine(module, self.config.critic_lr)
        return sum(p.numel() for p in module.parameters())

    @torch.no_grad()
    def compute_values(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """Values of this rank's rows: {"rows": int64 [b], "values": float32 [b, R]} (0 where masked)."""
        self.engine.eval()
        rows = self._my_rows(self._batch_rows(batch), batch)
        values = torch.zeros((len(rows), batch.response_len))
        done = 0
        for micro in self._micro_batches(rows, batch):
            mb = batch.select(micro).to(self.device)
            v = self.engine(mb.input_ids, mb.attention_mask, mb.loss_mask, mb.prompt_len)
            values[done : done + len(micro), : v.shape[1]] = v.float().cpu()
            done += len(micro)
        return {"rows": rows, "values": values}

    def update(self, batch: TrainBatch, algorithm: AlgorithmConfig | Mapping[str, Any]) -> dict[str, float]:
        """Clipped value-loss epochs on `batch.returns` (PPO; `value_clip_eps` around `old_values`).

        Returns:
            Means: value_loss, vf_clip_frac, values (mean prediction); grad_norm, lr; update_s.

        Raises:
            ValueError: `returns` or `old_values` missing.
        """
        algo = algorithm if isinstance(algorithm, AlgorithmConfig) else AlgorithmConfig(**dict(algorithm))
        if batch.returns is None or batch.old_values is None:
            raise ValueError("CriticLearner.update: batch.returns and batch.old_values are needed (GAE)")
        t0 = time.perf_counter()
        self._apply_lr_schedule()
        self.engine.train()
        rows_metrics, step_metrics = [], []
        for epoch in range(self.config.ppo_epochs):
            for mini_rows in self._plan(batch, epoch):
                mini_mask = batch.loss_mask[mini_rows]  # the whole mini-batch's normaliser
                micros = self._accumulation(mini_rows, batch)
                for k, micro in enumerate(micros):
                    self._auto_checkpointing(micro, batch)
                    mb = batch.select(micro).to(self.device)
                    values = self.engine(mb.input_ids, mb.attention_mask, mb.loss_mask, mb.prompt_len)
                    loss, m = value_loss(values, mb.old_values, mb.returns, mb.loss_mask,
                                         clip_eps=algo.value_clip_eps, agg=algo.loss_agg, norm_len=algo.norm_len)
                    self._backward(loss * self._loss_scale(mb, mini_mask, algo.loss_agg), last=k == len(micros) - 1)
                    rows_metrics.append({"value_loss": float(loss.detach()), **{k: float(v) for k, v in m.items()},
                                         "values": float(masked_mean(values.detach(), mb.loss_mask))})
                step_metrics.append({"grad_norm": self._last_grad_norm(),
                                     "lr": float(self.engine.get_lr()[0])})
        self.updates += 1
        out = {**mean_metrics(rows_metrics), **mean_metrics(step_metrics)}
        out["update_s"] = time.perf_counter() - t0
        return out

    def _save_hf(self, directory: Path) -> None:
        from safetensors.torch import save_file

        state = self._full_state_dict()
        if self.rank == 0:
            decoder = self.engine.module.decoder
            dec_state = {n.removeprefix("decoder."): t for n, t in state.items() if n.startswith("decoder.")}
            decoder.save_pretrained(str(directory), state_dict=dec_state, safe_serialization=True)
            head = {n.removeprefix("value_head."): t.contiguous() for n, t in state.items() if n.startswith("value_head.")}
            save_file(head, str(directory / "value_head.safetensors"))
            (directory / "searchrl_critic.json").write_text(json.dumps({"base_model": self.model_path}))


