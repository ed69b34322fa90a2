"""Learners on DeepSpeed: `PolicyLearner`, `CriticLearner`, and the frozen `ReferenceModel`.

Each class is a plain Python object (one rank); `actors.learner_group.LearnerGroup` runs R of them
as Ray actors that form one torch.distributed group (gloo on CPU, nccl on GPU) and shards batches
across them. The update math comes from `algorithms/`; this module holds the model, the DeepSpeed
engine (ZeRO stage 0-3, fp32 or bf16, gradient checkpointing, optional CPU offload), checkpoints
and the weights handed to the rollout engines.

Gradient normalisation: a mini-batch's loss is aggregated over the *whole* mini-batch (all its
micro-batches on all ranks), not averaged over micro-batch means, so the gradient does not depend
on how the mini-batch is split over ranks and micro-batches (rank equivalence).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from actors.learner_batch import TrainBatch
from actors.token_stats import PolicyTokenStats, ValueModel
from algorithms import AlgorithmConfig, entropy_loss, kl_estimate, kl_loss, masked_mean, policy_loss, value_loss
from configs.schema import LearnerConfig

SHM_PREFIX = "/dev/shm/deepspeed_allreduce_buffer"


def free_port() -> int:
    """A free TCP port on loopback (for the torch.distributed rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_address() -> str:
    """This node's address as other nodes reach it (Ray's view when Ray is running; else loopback)."""
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    return "127.0.0.1"


def _torch_dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    acc: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for k, v in row.items():
            acc[k].append(float(v))
    return {k: sum(v) / len(v) for k, v in acc.items()}


class _DeepSpeedRank:
    """One rank of a DeepSpeed learner: distributed setup, engine, mini/micro-batch plan, checkpoints.

    Args:
        config: `LearnerConfig` (or its dict).
        rank, world_size: this rank and the group size.
    """

    role = "learner"

    def __init__(self, config: LearnerConfig | Mapping[str, Any], rank: int = 0, world_size: int = 1):
        self.config = config if isinstance(config, LearnerConfig) else LearnerConfig(**dict(config))
        if not 0 <= rank < world_size:
            raise ValueError(f"{self.role}: rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.rank, self.world_size = rank, world_size
        if self.config.torch_threads:  # Ray sets OMP_NUM_THREADS to the reserved CPUs (1 for fractions)
            torch.set_num_threads(self.config.torch_threads)
        self.engine = None
        self.updates = 0  # optimizer-step calls of `update` (RNG stream per update)
        self._master: tuple[str, int] | None = None
        self._grad_norm = 0.0  # last step's, where DeepSpeed does not report it (fp32 ZeRO-0)

    # -- distributed setup ------------------------------------------------------------------------------
    def master_address(self) -> tuple[str, int]:
        """(address, free port) for the group's rendezvous; asked of rank 0."""
        return node_address(), free_port()

    @property
    def device(self) -> torch.device:
        if self.config.gpus_per_rank > 0 and torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) if torch.cuda.device_count() > 1 else 0)
        return torch.device("cpu")

    def init_distributed(self, address: str, port: int) -> None:
        """Join the process group (gloo on CPU, nccl on GPU unless `dist_backend` says otherwise)."""
        import deepspeed

        self._master = (address, port)
        os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        backend = self.config.dist_backend
        if backend == "auto":
            backend = "nccl" if self.device.type == "cuda" else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False,
                                   rank=self.rank, world_size=self.world_size)

    def _ds_config(self, lr: float) -> dict[str, Any]:
        c = self.config
        zero: dict[str, Any] = {"stage": c.zero_stage}
        if c.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": self.device.type == "cuda"}
        cfg: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": c.micro_batch_size,
            "gradient_accumulation_steps": self.grad_accum_steps,
            "train_batch_size": c.micro_batch_size * self.grad_accum_steps * self.world_size,
            "gradient_clipping": c.grad_clip,
            "zero_optimization": zero,
            "bf16": {"enabled": c.dtype == "bf16"},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        if c.warmup_steps:  # linear warm-up to `lr`, then constant (the papers' schedule)
            cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                                "warmup_num_steps": c.warmup_steps,
                                                                "warmup_type": "linear"}}
        return cfg

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step on each rank."""
        per_rank = self.config.mini_batch_size // self.world_size
        return max(1, -(-per_rank // self.config.micro_batch_size))

    def _start_engine(self, module: torch.nn.Module, lr: float) -> None:
        import deepspeed

        if self.config.mini_batch_size % self.world_size:
            raise ValueError(f"learner.mini_batch_size ({self.config.mini_batch_size}) must be a multiple of "
                             f"num_ranks ({self.world_size})")
        params = [p for p in module.parameters() if p.requires_grad]
        betas = (self.config.adam_beta1, self.config.adam_beta2)
        if self.config.offload_optimizer:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(params, lr=lr, betas=betas, eps=self.config.adam_eps,
                                         weight_decay=self.config.weight_decay, adamw_mode=True)
        else:  # torch's AdamW: no op compilation (DeepSpeed's FusedAdam would compile for ~40 s here)
            optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, eps=self.config.adam_eps,
                                          weight_decay=self.config.weight_decay)
        self.engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=self._ds_config(lr))

    def _optimizer_step(self) -> None:
        """`engine.step()`. Under fp32 ZeRO-0 DeepSpeed clips without keeping the gradient norm, so it is
        taken here first, at the accumulation boundary, where the gradients are already all-reduced."""
        if self.config.zero_stage == 0 and self.engine.is_gradient_accumulation_boundary():
            norms = [torch.linalg.vector_norm(p.grad.float()) for p in self.engine.module.parameters()
                     if p.grad is not None]
            self._grad_norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
        self.engine.step()

    def _last_grad_norm(self) -> float:
        """L2 norm of the last optimizer step's gradients (before clipping)."""
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else self._grad_norm

    # -- batches ------------------------------------------------------------------------------------------
    def _my_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return rows[self.rank :: self.world_size]

    def _micro_batches(self, rows: torch.Tensor, count: int | None = None) -> list[torch.Tensor]:
        count = count or max(1, -(-len(rows) // self.config.micro_batch_size))
        return [r for r in torch.tensor_split(rows, count) if len(r)] if len(rows) else []

    def _plan(self, batch: TrainBatch, epoch: int) -> list[torch.Tensor]:
        """Mini-batches (global row indices) of one epoch; the same permutation on every rank."""
        size, mini = batch.size, self.config.mini_batch_size
        if size % mini:
            raise ValueError(f"train batch of {size} sequences is not a multiple of learner.mini_batch_size "
                             f"({mini}); change rollout batch size × samples per prompt or the mini-batch size")
        gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.updates * 101 + epoch)
        perm = torch.randperm(size, generator=gen) if self.config.shuffle else torch.arange(size)
        return list(perm.split(mini))

    def _loss_scale(self, mb: TrainBatch, mini_mask: torch.Tensor, agg: str) -> float:
        """Weight of a micro-batch's aggregated loss so the sum over the mini-batch's micro-batches and
        ranks (DeepSpeed averages gradients over ranks) is the loss aggregated over the mini-batch."""
        if agg == "token_mean":
            num, den = mb.loss_mask.sum(), mini_mask.sum()
        else:
            num, den = (mb.loss_mask.sum(1) > 0).sum(), (mini_mask.sum(1) > 0).sum()
        return float(num) / max(float(den), 1.0) * self.world_size

    # -- checkpoints ----------------------------------------------------------------------------------------
    def _client_state(self) -> dict[str, Any]:
        return {"updates": self.updates, "rng": _rng_state()}

    def save_checkpoint(self, directory: str) -> str:
        """Write the DeepSpeed state (weights, optimizer, scheduler; every rank its shard) and RNG
        states to `directory/<role>/deepspeed`; rank 0 also writes the Hugging Face model
        (safetensors) to `directory/<role>/hf`. Every rank must call it. Returns the role folder."""
        root = Path(directory) / self.role
        self.engine.save_checkpoint(str(root / "deepspeed"), tag="state", client_state=self._client_state())
        self._save_hf(root / "hf")
        return str(root)

    def load_checkpoint(self, directory: str) -> None:
        """Restore what `save_checkpoint` wrote (same world size and ZeRO stage).

        Raises:
            FileNotFoundError: no checkpoint of this role under `directory`.
        """
        path = Path(directory) / self.role / "deepspeed"
        if not (path / "state").is_dir():
            raise FileNotFoundError(f"{self.role}: no checkpoint at {path}/state; pass a checkpoint directory "
                                    f"written by save_checkpoint")
        _, client = self.engine.load_checkpoint(str(path), tag="state", load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
        self.updates = int(client["updates"])
        _set_rng_state(client["rng"])

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's parameters gathered from ZeRO partitions (every rank must call; tied weights once)."""
        import deepspeed

        module = self.engine.module
        out: dict[str, torch.Tensor] = {}
        for name, p in module.named_parameters():  # named_parameters() lists a tied weight once
            with deepspeed.zero.GatheredParameters([p], enabled=self.config.zero_stage == 3):
                out[name] = p.detach().to("cpu", copy=True)
        return out

    def _save_hf(self, directory: Path) -> None:
        raise NotImplementedError

    def peak_memory_bytes(self) -> int:
        """Peak memory of this rank (bytes): CUDA allocator peak on GPU, peak resident set on CPU."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB

    def shutdown(self) -> None:
        """Free the engine and the process group, and remove DeepSpeed's /dev/shm all-reduce buffer
        of this rank (DeepSpeed leaves a 66 MB file per process otherwise)."""
        import torch.distributed as dist

        self.engine = None
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        if self._master is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{SHM_PREFIX}_{os.getuid()}_{self._master[0]}_{self._master[1]}_{self.rank}")


class PolicyLearner(_DeepSpeedRank):
    """The policy: per-token log-probs/entropies, PPO-family updates, weights for the rollout engines.

    Args:
        config: `LearnerConfig` (model, ZeRO stage, dtype, optimizer, batch sizes, ...).
        rank, world_size: this rank and the group size; call `init_distributed` then `setup`.
    """

    role = "policy"

    def setup(self) -> int:
        """Load the model and start the DeepSpeed engine; returns the number of parameters."""
        from transformers import AutoModelForCausalLM

        from actors.models import resolve_model

        torch.manual_seed(self.config.seed)
        self.model_path = resolve_model(self.config.model)
        lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        lm.config.use_cache = False
        if self.config.gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        module = PolicyTokenStats(lm, self.config.logprob_chunk_tokens, self.config.temperature)
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
        rows = self._my_rows(torch.arange(batch.size))
        lp = torch.zeros((len(rows), batch.response_len))
        ent = torch.zeros_like(lp)
        done = 0
        for micro in self._micro_batches(rows):
            mb = batch.select(micro).to(self.device)
            a, b = self._stats(mb)
            lp[done : done + len(micro), : a.shape[1]] = a.float().cpu()
            ent[done : done + len(micro), : b.shape[1]] = b.float().cpu()
            done += len(micro)
        return {"rows": rows, "logprobs": lp, "entropy": ent}

    def update(self, batch: TrainBatch, algorithm: AlgorithmConfig | Mapping[str, Any]) -> dict[str, float]:
        """PPO-style epochs over the batch (s3 Eq. 2, Eval-RAR Eq. 6, R-Search Eq. 2): clipped
        surrogate on `batch.advantages`, plus `kl_coef` × KL to `batch.ref_logprobs` when the KL is a
        loss term (GRPO), minus `entropy_coef` × entropy.

        Args:
            batch: with `advantages` (and `ref_logprobs` when the KL is a loss term), `[B, R]`.
            algorithm: `AlgorithmConfig` (clip ε, KL, entropy, loss aggregation).

        Returns:
            Means over micro-batches: policy_loss, kl, entropy, clip_frac, approx_kl, ratio_max;
            per optimizer step: grad_norm, lr; plus optimizer_steps, tokens (policy tokens seen on this rank)
            and update_s (seconds).

        Raises:
            ValueError: `batch.advantages` is missing, or the KL loss needs `ref_logprobs`, or the batch
                size is not a multiple of `mini_batch_size`.
        """
        algo = algorithm if isinstance(algorithm, AlgorithmConfig) else AlgorithmConfig(**dict(algorithm))
        if batch.advantages is None:
            raise ValueError("PolicyLearner.update: batch.advantages is None; compute advantages first")
        kl_term = algo.kl_coef > 0 and not algo.kl_in_reward
        if kl_term and batch.ref_logprobs is None:
            raise ValueError("PolicyLearner.update: the KL loss term needs batch.ref_logprobs "
                             "(or set kl_coef=0 / kl_in_reward=true)")
        t0 = time.perf_counter()
        self.engine.train()
        rows_metrics: list[dict[str, float]] = []
        step_metrics: list[dict[str, float]] = []
        tokens = 0
        for epoch in range(self.config.ppo_epochs):
            for mini_rows in self._plan(batch, epoch):
                mini_mask = batch.loss_mask[mini_rows]  # the whole mini-batch's normaliser
                for micro in self._micro_batches(self._my_rows(mini_rows), self.grad_accum_steps):
                    mb = batch.select(micro).to(self.device)
                    logprobs, entropy = self._stats(mb)
                    mask = mb.loss_mask
                    loss, m = policy_loss(logprobs, mb.old_logprobs, mb.advantages, mask, clip_eps=algo.clip_eps,
                                          clip_eps_high=algo.clip_eps_high, dual_clip=algo.dual_clip,
                                          agg=algo.loss_agg, norm_len=algo.norm_len)
                    row = {"policy_loss": float(loss.detach()), **{k: float(v) for k, v in m.items()}}
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
                    self.engine.backward(loss * self._loss_scale(mb, mini_mask, algo.loss_agg), scale_wrt_gas=False)
                    self._optimizer_step()
                    tokens += int(mask.sum())
                    rows_metrics.append(row)
                step_metrics.append({"grad_norm": self._last_grad_norm(),
                                     "lr": float(self.engine.get_lr()[0])})
        self.updates += 1
        out = {**_mean_metrics(rows_metrics), **_mean_metrics(step_metrics)}
        out.update(optimizer_steps=float(len(step_metrics)), tokens=float(tokens), update_s=time.perf_counter() - t0)
        return out

    def named_weights(self, dtype: str = "bf16") -> list[tuple[str, torch.Tensor]] | None:
        """The policy's weights with Hugging Face names, for `RolloutWorker.update_weights`
        (gathered from ZeRO partitions; every rank must call; rank 0 gets the list, others None)."""
        state = self._full_state_dict()
        if self.rank != 0:
            return None
        cast = _torch_dtype(dtype) if dtype != "model" else None
        return [(name.removeprefix("lm."), t.to(cast) if cast else t) for name, t in state.items()]

    def _save_hf(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        state = {n.removeprefix("lm."): t for n, t in self._full_state_dict().items()}
        if self.rank == 0:
            lm = self.engine.module.lm
            lm.save_pretrained(str(directory), state_dict=state, safe_serialization=True)
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(str(directory))


class CriticLearner(_DeepSpeedRank):
    """The PPO critic: a value head on the policy's decoder (s3 trains one; GAE needs its values).

    Args: as `PolicyLearner`; `config.critic_lr` is its learning rate and `config.critic_model`
    (default: the policy model) its starting weights.
    """

    role = "critic"

    def setup(self) -> int:
        """Load the decoder, add the value head (or load a saved critic), start DeepSpeed."""
        from transformers import AutoModel

        from actors.models import resolve_model

        torch.manual_seed(self.config.seed + 1)
        self.model_path = resolve_model(self.config.critic_model or self.config.model)
        decoder = AutoModel.from_pretrained(self.model_path, dtype=torch.float32)
        if self.config.gradient_checkpointing:
            decoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        hidden = getattr(decoder.config, "hidden_size", None) or decoder.config.get_text_config().hidden_size
        module = ValueModel(decoder, hidden)
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
        rows = self._my_rows(torch.arange(batch.size))
        values = torch.zeros((len(rows), batch.response_len))
        done = 0
        for micro in self._micro_batches(rows):
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
        self.engine.train()
        rows_metrics, step_metrics = [], []
        for epoch in range(self.config.ppo_epochs):
            for mini_rows in self._plan(batch, epoch):
                mini_mask = batch.loss_mask[mini_rows]  # the whole mini-batch's normaliser
                for micro in self._micro_batches(self._my_rows(mini_rows), self.grad_accum_steps):
                    mb = batch.select(micro).to(self.device)
                    values = self.engine(mb.input_ids, mb.attention_mask, mb.loss_mask, mb.prompt_len)
                    loss, m = value_loss(values, mb.old_values, mb.returns, mb.loss_mask,
                                         clip_eps=algo.value_clip_eps, agg=algo.loss_agg, norm_len=algo.norm_len)
                    self.engine.backward(loss * self._loss_scale(mb, mini_mask, algo.loss_agg), scale_wrt_gas=False)
                    self._optimizer_step()
                    rows_metrics.append({"value_loss": float(loss.detach()), **{k: float(v) for k, v in m.items()},
                                         "values": float(masked_mean(values.detach(), mb.loss_mask))})
                step_metrics.append({"grad_norm": self._last_grad_norm(),
                                     "lr": float(self.engine.get_lr()[0])})
        self.updates += 1
        out = {**_mean_metrics(rows_metrics), **_mean_metrics(step_metrics)}
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


class ReferenceModel:
    """The frozen reference policy π_ref (the KL anchor of s3 Eq. 2 / GRPO): log-probs only, no
    optimizer, no DeepSpeed (inference in `config.dtype` on one device).

    Args:
        config: `LearnerConfig`; `reference_model` (default: the policy's starting model).
    """

    def __init__(self, config: LearnerConfig | Mapping[str, Any]):
        from transformers import AutoModelForCausalLM

        from actors.models import resolve_model

        self.config = config if isinstance(config, LearnerConfig) else LearnerConfig(**dict(config))
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        self.device = torch.device("cuda" if self.config.gpus_per_rank > 0 and torch.cuda.is_available() else "cpu")
        path = resolve_model(self.config.reference_model or self.config.model)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=_torch_dtype(self.config.dtype)).to(self.device).eval()
        self.module = PolicyTokenStats(lm, self.config.logprob_chunk_tokens, self.config.temperature)

    @torch.no_grad()
    def compute_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Reference log-probs `[B, R]` float32 of the response tokens (0 where masked)."""
        out = torch.zeros((batch.size, batch.response_len))
        rows = torch.arange(batch.size)
        step = self.config.micro_batch_size
        for start in range(0, batch.size, step):
            idx = rows[start : start + step]
            mb = batch.select(idx).to(self.device)
            lp, _ = self.module(mb.input_ids, mb.attention_mask, mb.loss_mask, mb.prompt_len)
            out[idx, : lp.shape[1]] = lp.float().cpu()
        return out

    def shutdown(self) -> None:
        self.module = None
