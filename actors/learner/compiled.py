"""`learner.compile_layers`: regional `torch.compile` of a Hugging Face decoder's repeated layer.

A 1.5B policy's update in eager PyTorch spends about half its GPU time outside the matmuls, in unfused
elementwise kernels: RMSNorm in fp32, rotary embeddings, SwiGLU (profile in `docs/performance.md`, "On one
GPU"). Compiling each decoder layer lets Inductor fuse them. The layers share one code object, so the
compiled graph is reused across layers (PyTorch's "regional compilation" recipe) and compile time stays that
of one layer; a new sequence length recompiles once, then shapes are treated as dynamic.
"""

from __future__ import annotations

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


def compile_layers(lm: nn.Module, dynamic: bool | None = None) -> int:
    """`torch.compile` every decoder layer of `lm` in place (`nn.Module.compile`); returns how many. The
    compiled graphs are built at each layer's first call, so adapters injected before then are in them."""
    layers = decoder_layers(lm)
    for layer in layers:
        layer.compile(dynamic=dynamic)
    return len(layers)
