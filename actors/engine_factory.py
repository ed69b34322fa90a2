"""`make_engine`: build an `Engine` backend from a backend name and a model name or path."""

from __future__ import annotations

from typing import Any

from actors.engine import Engine
from actors.models import resolve_model

BACKENDS = ("vllm", "hf")


def make_engine(backend: str, model: str, **opts: Any) -> Engine:
    """Resolve `model` (see `actors.models.resolve_model`) and start the backend on it.

    Args:
        backend: "vllm" (`actors.engine_vllm.VLLMEngine`, production and the CPU build) or "hf"
            (`actors.engine_hf.HFEngine`, the transformers fallback).
        model: a local directory, "gemma3-270m", or a Hugging Face name.
        **opts: the backend's constructor options (dtype, max_model_len, seed, ...; vLLM also
            gpu_memory_utilization, cpu_kv_cache_gib, tensor_parallel_size, enforce_eager, ...).
            `cache_dir` is passed to `resolve_model` instead.

    Returns:
        A started engine; call `await engine.shutdown()` when done.

    Raises:
        ValueError: unknown backend. Plus whatever `resolve_model` and the constructor raise.
    """
    if backend not in BACKENDS:
        raise ValueError(f"engine backend must be one of {BACKENDS}, got {backend!r}")
    path = resolve_model(model, cache_dir=opts.pop("cache_dir", None))
    if backend == "vllm":
        from actors.engine_vllm import VLLMEngine

        return VLLMEngine(path, **opts)
    from actors.engine_hf import HFEngine

    return HFEngine(path, **opts)
