"""`learner.compile_layers`: regional `torch.compile` of a Hugging Face decoder's repeated layer.

A 1.5B policy's update in eager PyTorch spends about half its GPU time outside the matmuls, in unfused
elementwise kernels: RMSNorm in fp32, rotary embeddings, SwiGLU (profile in `docs/performance.md`, "On one
GPU"). Compiling each decoder layer lets Inductor fuse them. The layers share one code object, so the
compiled graph is reused across layers (PyTorch's "regional compilation" recipe) and compile time stays that
of one layer; a new sequence length recompiles once, then shapes are treated as dynamic.
"""

from __future__ import annotations

import os

from torch import nn


def decoder_layers(lm: nn.Module) -> nn.ModuleList:
    """The repeated decoder layers of a Hugging Face causal LM (`lm.<base_model_prefix>.layers`: Qwen2, Llama,
    Gemma 3, ...).

    Raises:
        ValueError: the model has no such `layers` list (name the architecture in the message).
    """
    base = getattr(lm, getattr(lm, "base_model_prefix", "model"), lm)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"learner.compile_layers: {type(lm).__name__} has no decoder `layers` list to compile; "
                         "set learner.compile_layers=false for this model")
    return layers


def cache_per_cpu_capability() -> str | None:
    """Give a limited `ATEN_CPU_CAPABILITY` (e.g. the AVX2-limited environment of `configs.cpu_features`) an
    Inductor cache folder of its own; returns the folder set, or None (no limit, or `TORCHINDUCTOR_CACHE_DIR`
    already chosen).

    Why: Inductor's on-disk cache does not key CPU kernels by the capability (torch 2.13). Kernels built under
    AVX-512 were reused under `ATEN_CPU_CAPABILITY=avx2` on the same machine and gave NaN log-probs (measured
    here, 2026-11-29; a fresh cache gave the eager values)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    default = os.path.abspath(default_cache_dir())  # importing torch's modules may already have set it
    if not capability or os.environ.get("TORCHINDUCTOR_CACHE_DIR", default) != default:
        return None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder = f"{default}-{capability.lower()}"
    return folder


def compile_layers(lm: nn.Module, dynamic: bool | None = None) -> int:
    """`torch.compile` every decoder layer of `lm` in place (`nn.Module.compile`); returns how many. The
    compiled graphs are built at each layer's first call, so adapters injected before then are in them."""
    cache_per_cpu_capability()
    layers = decoder_layers(lm)
    for layer in layers:
        layer.compile(dynamic=dynamic)
    return len(layers)
