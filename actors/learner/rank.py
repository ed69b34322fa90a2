"""`DeepSpeedRank`: what every DeepSpeed learner rank shares: distributed setup, the engine
(ZeRO stage 0-3, fp32 or bf16, gradient checkpointing, optional CPU offload), the mini/micro-batch
plan, checkpoints and RNG state. `PolicyLearner` (`actors.learner.policy`) and `CriticLearner`
(`actors.learner.critic`) build on it; `actors.learner.group.LearnerGroup` runs R of them as Ray
actors that form one torch.distributed group (gloo on CPU, nccl on GPU).

Gradient normalisation: a mini-batch's loss is aggregated over the *whole* mini-batch (all its
micro-batches on all ranks), not averaged over micro-batch means, so the gradient does not depend
on how the mini-batch is split over ranks and micro-batches (rank equivalence).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from actors.learner.batch import TrainBatch, group_order, group_rows, split_at_groups
from algorithms.schedule import warmup_factor, warmup_steps
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


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype of a config dtype name ("fp32", "bf16")."""
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per-key mean of metric rows."""
    acc: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for k, v in row.items():
            acc[k].append(float(v))
    return {k: sum(v) / len(v) for k, v in acc.items()}


class DeepSpeedRank:
    """One rank of a DeepSpeed learner: distributed setup, engine, mini/micro-batch plan, checkpoints.

    Args:
        config: `LearnerConfig` (or its dict).
        rank, world_size: this rank and the group size.
        total_steps: training steps of the run (all stages); the warm-up ratio is a fraction of them.
            Needed only with a warm-up ratio > 0.

    Raises:
        ValueError: a bad rank, or a warm-up ratio without `total_steps`.
    """

    role = "learner"

    def __init__(self, config: LearnerConfig | Mapping[str, Any], rank: int = 0, world_size: int = 1,
                 total_steps: int | None = None):
        self.config = config if isinstance(config, LearnerConfig) else LearnerConfig(**dict(config))
        if not 0 <= rank < world_size:
            raise ValueError(f"{self.role}: rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        if self.warmup_ratio and total_steps is None:
            raise ValueError(f"{self.role}: a warm-up ratio ({self.warmup_ratio}) is a fraction of the run's training "
                             f"steps; pass total_steps")
        self.warmup = warmup_steps(self.warmup_ratio, total_steps) if self.warmup_ratio else 0  # training steps
        self.base_lr = 0.0  # set by _start_engine
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
        """CUDA when `gpus_per_rank` > 0 and CUDA is available (device `LOCAL_RANK` if several GPUs are
        visible, else 0), otherwise CPU."""
        if self.config.gpus_per_rank > 0 and torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) if torch.cuda.device_count() > 1 else 0)
        return torch.device("cpu")

    def init_distributed(self, address: str, port: int) -> None:
        """Join the process group (gloo on CPU, nccl on GPU unless `dist_backend` says otherwise). A CPU group
        builds DeepSpeed's shm op first; a stale build lock is removed (`cluster.torch_extensions`)."""
        import deepspeed

        from cluster.torch_extensions import clear_stale_build_locks

        clear_stale_build_locks()
        self._master = (address, port)
        os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        backend = self.config.dist_backend
        if backend == "auto":
            backend = "nccl" if self.device.type == "cuda" else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False,
                                   rank=self.rank, world_size=self.world_size)

    # -- role settings (the critic overrides them) --------------------------------------------------------
    @property
    def micro_batch_size(self) -> int:
        """Sequences per forward/backward pass on this rank."""
        return self.config.micro_batch_size

    @property
    def warmup_ratio(self) -> float:
        """Fraction of the run's training steps over which the learning rate rises linearly."""
        return self.config.warmup_ratio

    def _apply_lr_schedule(self, lr: float | None = None) -> float:
        """Set the learning rate of this update (training step `self.updates`, 0-based) on every
        parameter group: `base_lr * warmup_factor(step, warmup)`, or `lr` when given (the warm start's own
        `train.warm_start.lr`); every optimizer step of one training step uses it (the papers' unit,
        `algorithms.schedule`). Returns the learning rate."""
        lr = self.base_lr * warmup_factor(self.updates, self.warmup) if lr is None else lr
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _ds_config(self, lr: float) -> dict[str, Any]:
        c = self.config
        zero: dict[str, Any] = {"stage": c.zero_stage}
        if c.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": self.device.type == "cuda"}
        cfg: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": self.micro_batch_size,
            "gradient_accumulation_steps": self.grad_accum_steps,
            "train_batch_size": self.micro_batch_size * self.grad_accum_steps * self.world_size,
            "gradient_clipping": c.grad_clip,
            "zero_optimization": zero,
            "bf16": {"enabled": c.dtype == "bf16"},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        return cfg  # no DeepSpeed scheduler: it would count optimizer steps; `_apply_lr_schedule` counts updates

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step on each rank."""
        per_rank = self.config.mini_batch_size // self.world_size
        return max(1, -(-per_rank // self.micro_batch_size))

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
                                          weight_decay=self.config.weight_decay, **adamw_options(self.device))
        self.engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=self._ds_config(lr))
        self.base_lr = lr
        self._apply_lr_schedule()

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
    def _rank_rows(self, rows: torch.Tensor, batch: TrainBatch) -> list[torch.Tensor]:
        """Every rank's share of `rows`: a stride, or with `shared_prefix` contiguous slices cut at group
        boundaries (a group's rows stay on one rank, where they pack)."""
        if self.config.shared_prefix:
            return split_at_groups(rows, batch.group_ids, self.world_size)
        return [rows[r :: self.world_size] for r in range(self.world_size)]

    def _my_rows(self, rows: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        """This rank's share of `rows` (`_rank_rows`)."""
        return self._rank_rows(rows, batch)[self.rank]

    def _batch_rows(self, batch: TrainBatch) -> torch.Tensor:
        """Every row of `batch`, with `shared_prefix` each group's rows next to each other."""
        return group_order(batch.group_ids) if self.config.shared_prefix else torch.arange(batch.size)

    def _row_tokens(self, rows: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        """`[len(rows)]` int64: the tokens each row adds to a forward pass over `rows` in their order (its
        real prompt and response tokens; with `shared_prefix`, a group's prompt counts once, on its first row)."""
        p = batch.prompt_len
        prompt, response = batch.attention_mask[rows, :p].sum(1), batch.attention_mask[rows, p:].sum(1)
        if self.config.shared_prefix:
            ids = [batch.group_ids[i] for i in rows.tolist()]
            first = torch.tensor([k == 0 or ids[k] != ids[k - 1] for k in range(len(ids))], dtype=torch.long)
            prompt = prompt * first
        return prompt + response

    def _micro_count(self, rows: torch.Tensor, batch: TrainBatch) -> int:
        """Micro-batches for `rows`: `ceil(rows / micro_batch_size)`, or with `micro_batch_tokens`
        `ceil(tokens / micro_batch_tokens)` (at most one per row); 0 for no rows."""
        if not len(rows):
            return 0
        budget = self.config.micro_batch_tokens
        if budget is None:
            return -(-len(rows) // self.micro_batch_size)
        return min(len(rows), max(1, -(-int(self._row_tokens(rows, batch).sum()) // budget)))

    def _micro_batches(self, rows: torch.Tensor, batch: TrainBatch, count: int | None = None) -> list[torch.Tensor]:
        """`rows` in `count` micro-batches (default `_micro_count`) of about equal rows, or equal tokens with
        `micro_batch_tokens`; cut at group boundaries with `shared_prefix`; empty ones dropped."""
        count = max(1, self._micro_count(rows, batch)) if count is None else count
        if not len(rows) or not count:
            return []
        weights = self._row_tokens(rows, batch) if self.config.micro_batch_tokens else None
        groups = batch.group_ids if self.config.shared_prefix else None
        if groups or weights is not None:
            parts = split_at_groups(rows, groups, count, weights)
        else:
            parts = rows.tensor_split(count)
        return [r for r in parts if len(r)]

    def _plan(self, batch: TrainBatch, epoch: int, keep: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Mini-batches (global row indices) of one epoch; the same permutation on every rank.

        `keep`: `[B]` bool, the rows to train on (`skip_zero_advantage`); the permutation is the whole
        batch's, the kept rows are split into as many mini-batches as the whole batch would give (the
        same number of optimizer steps, each on fewer rows); a mini-batch left empty is dropped."""
        size, mini = batch.size, self.config.mini_batch_size
        if size % mini:
            raise ValueError(f"train batch of {size} sequences is not a multiple of learner.mini_batch_size "
                             f"({mini}); change rollout batch size × samples per prompt or the mini-batch size")
        gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.updates * 101 + epoch)
        if self.config.shared_prefix:  # shuffle groups, not rows: a group's rows stay together and pack
            groups = group_rows(batch.group_ids)
            order = torch.randperm(len(groups), generator=gen).tolist() if self.config.shuffle else range(len(groups))
            perm = torch.tensor([i for g in order for i in groups[g]], dtype=torch.long)
        else:
            perm = torch.randperm(size, generator=gen) if self.config.shuffle else torch.arange(size)
        if keep is None and not self.config.shared_prefix:
            return list(perm.split(mini))
        rows = perm if keep is None else perm[keep[perm]]
        parts = split_at_groups(rows, batch.group_ids, size // mini) if self.config.shared_prefix else \
            rows.tensor_split(size // mini)
        return [m for m in parts if len(m)]

    def _accumulation(self, mini_rows: torch.Tensor, batch: TrainBatch) -> list[torch.Tensor]:
        """This rank's micro-batches of a mini-batch, the same count on every rank (each rank does as many
        backward passes; a mini-batch with fewer rows than ranks gives none): of about `micro_batch_size`
        rows, `grad_accum_steps` of them for a whole mini-batch and fewer for a short one (rows skipped);
        or with `micro_batch_tokens`, as many as the rank with the most tokens needs (at most one per row
        of the smallest share), each rank's tokens spread evenly over them."""
        shares = self._rank_rows(mini_rows, batch)
        if self.config.micro_batch_tokens is None:
            count = min(self.grad_accum_steps, min(-(-len(s) // self.micro_batch_size) for s in shares))
        else:
            count = min(min(len(s) for s in shares), max(self._micro_count(s, batch) for s in shares))
        return self._micro_batches(shares[self.rank], batch, count)

    def _auto_checkpointing(self, micro: torch.Tensor, batch: TrainBatch) -> bool:
        """With `gradient_checkpointing: auto`, switch recomputation on for this micro-batch only when its
        activations would not fit (`actors.learner.checkpointing.needs_checkpointing`: its `_row_tokens`, the
        decoder's shape, the training dtype, the memory left on the device). Returns whether it is on."""
        if self.config.gradient_checkpointing != "auto":
            return bool(self.config.gradient_checkpointing)
        from actors.learner.checkpointing import decoder_shape, free_bytes, needs_checkpointing, set_checkpointing

        hidden, layers, width = decoder_shape(self._decoder)
        on = needs_checkpointing(int(self._row_tokens(micro, batch).sum()), hidden, layers,
                                 2 if self.config.dtype == "bf16" else 4, free_bytes(self.device), intermediate=width)
        set_checkpointing(self._decoder, on)
        return on

    def _backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backward of one micro-batch, then `engine.step()`; the optimizer steps after the mini-batch's
        `last` micro-batch (set here, not counted by DeepSpeed: a short mini-batch has fewer of them)."""
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss, scale_wrt_gas=False)
        self._optimizer_step()

    def _loss_scale(self, mb: TrainBatch, mini_mask: torch.Tensor, agg: str) -> float:
        """Weight of a micro-batch's aggregated loss so the sum over the mini-batch's micro-batches and
        ranks (DeepSpeed averages gradients over ranks) is the loss aggregated over the mini-batch."""
        if agg == "token_mean":
            num, den = mb.loss_mask.sum(), mini_mask.sum()
        else:
            num, den = (mb.loss_mask.sum(1) > 0).sum(), (mini_mask.sum(1) > 0).sum()
        return float(num) / max(float(den), 1.0) * self.world_size

    # -- checkpoints ----------------------------------------------------------------------------------------
    def trim_memory(self) -> bool:
        """Hand the heap pages freed by this step (the batch, the gathered weights) back to the OS
        (`cluster.malloc_trim`); True when some were released."""
        from cluster.malloc_trim import malloc_trim

        return malloc_trim()

    def _client_state(self) -> dict[str, Any]:
        return {"updates": self.updates, "rng": _rng_state()}

    def save_checkpoint(self, directory: str, hf: bool = True) -> str:
        """Write the DeepSpeed state (weights, optimizer, scheduler; every rank its shard) and RNG
        states to `directory/<role>/deepspeed`; rank 0 also writes the Hugging Face model
        (safetensors) to `directory/<role>/hf` unless `hf` is False (an in-memory snapshot, which only
        a learner rebuild reads). Every rank must call it. Returns the role folder."""
        root = Path(directory) / self.role
        self.engine.save_checkpoint(str(root / "deepspeed"), tag="state", client_state=self._client_state())
        if hf:
            self._save_hf(root / "hf")
        return str(root)

    def save_hf(self, directory: str) -> str:
        """Rank 0 writes the Hugging Face model (safetensors, tokenizer) to `directory/<role>/hf`, without the
        DeepSpeed state (a model to evaluate or serve, not to resume). Every rank must call it (ZeRO-3
        gathers). Returns the role folder."""
        root = Path(directory) / self.role
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

    def _full_state_dict(self, trainable_only: bool = False) -> dict[str, torch.Tensor]:
        """The module's parameters gathered from ZeRO partitions (every rank must call; tied weights once);
        `trainable_only`: those the optimizer updates (a frozen tensor never differs from the starting model)."""
        import deepspeed

        module = self.engine.module
        out: dict[str, torch.Tensor] = {}
        for name, p in module.named_parameters():  # named_parameters() lists a tied weight once
            if trainable_only and not p.requires_grad:
                continue
            with deepspeed.zero.GatheredParameters([p], enabled=self.config.zero_stage == 3):
                out[name] = p.detach().to("cpu", copy=True)
        return out

    def _save_hf(self, directory: Path) -> None:
        raise NotImplementedError

    # -- NCCL weight sync (`learner.weight_sync: nccl`; driven by `actors.learner.nccl_sync.sync_over_nccl`) ----
    def nccl_init(self, address: str, port: int, world_size: int, bucket_bytes: int, num_buffers: int) -> None:
        """Rank 0 only: form the weight-transfer group as its rank 0 (`NcclWeightSender.init`), replacing any
        group formed before. Blocks until every engine worker joined.

        Raises:
            ValueError: called on another rank. RuntimeError: no CUDA.
        """
        from actors.learner.nccl_sync import NcclWeightSender

        if self.rank != 0:
            raise ValueError(f"{self.role}: nccl_init runs on rank 0 only (called on rank {self.rank})")
        old = getattr(self, "_nccl_sender", None)
        if old is not None:
            old.shutdown()
        self._nccl_sender = NcclWeightSender(self.device, bucket_bytes=bucket_bytes, num_buffers=num_buffers)
        self._nccl_sender.init(address, port, world_size)

    def nccl_stage(self, dtype: str = "bf16") -> dict[str, list] | None:
        """Every rank: gather the weights (`named_weights`, a collective under ZeRO-3); rank 0 keeps them for
        `nccl_send` and returns their metadata (`nccl_sync.update_message`), the other ranks None."""
        from actors.learner.nccl_sync import update_message

        named_weights = getattr(self, "named_weights", None)
        if named_weights is None:
            raise ValueError(f"{self.role}: only the policy has weights for the rollout engines")
        named = named_weights(dtype)
        if self.rank != 0:
            return None
        message = update_message(named)
        self._nccl_staged = (named, message)
        return message

    def nccl_send(self, version: int) -> dict[str, float]:
        """Rank 0: broadcast what `nccl_stage` kept (`NcclWeightSender.send`), then drop it.

        Raises:
            RuntimeError: nothing staged, or no group formed (`nccl_init`).
        """
        staged, self._nccl_staged = getattr(self, "_nccl_staged", None), None
        sender = getattr(self, "_nccl_sender", None)
        if staged is None or sender is None:
            raise RuntimeError(f"{self.role}: nccl_send needs nccl_init and nccl_stage first (rank {self.rank})")
        named, message = staged
        return sender.send(named, version, expected=message)

    def nccl_shutdown(self) -> None:
        """Tear down this rank's weight-transfer communicator, if any (idempotent)."""
        sender, self._nccl_sender = getattr(self, "_nccl_sender", None), None
        self._nccl_staged = None
        if sender is not None:
            sender.shutdown()

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

        with contextlib.suppress(Exception):  # the NCCL weight-transfer group of learner.weight_sync: nccl
            self.nccl_shutdown()
        self.engine = None
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        if self._master is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{SHM_PREFIX}_{os.getuid()}_{self._master[0]}_{self._master[1]}_{self.rank}")


def adamw_options(device: torch.device) -> dict[str, Any]:
    """Extra `torch.optim.AdamW` arguments for `device`: on CUDA its fused kernel (one launch for every
    parameter instead of a loop of elementwise kernels), else none (the default for-each path)."""
    return {"fused": True} if device.type == "cuda" else {}
