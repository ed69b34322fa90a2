"""`learner.gradient_checkpointing: auto`: recompute decoder activations in backward only where the
micro-batch's activations would not fit the memory left.

The estimate follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198) Eq. 1 for a decoder layer's stored activations, `s·b·h·(34 + 5·a·s/h)` bytes
with 2-byte activations, without the attention-score term (PyTorch SDPA and flash attention keep no s×s
matrix). Its 34 holds 19 for a GeLU MLP of width 4h; today's decoders (Qwen2, Llama, Gemma) have a gated
MLP of width I (the config's `intermediate_size`) that stores its input, gate, up, activation and product:
2h + 8I. So a gated layer stores 17h + 8I bytes a token at 16 bits (twice at 32). For the Qwen2.5-1.5B
shape (h 1536, I 8960) that is 64 bytes a token per hidden unit and layer, where Eq. 1 says 34; measured on
an H200 (2026-11-28, `docs/performance.md`): about 75, the rest being the LM head's chunk and temporaries.
"""

from __future__ import annotations

import torch

BYTES_PER_TOKEN_HIDDEN_LAYER_16BIT = 34  # Korthikanti et al. 2022 Eq. 1, no attention-score term (GeLU MLP, 4h)
GATED_LAYER_BYTES = (17, 8)  # a gated-MLP layer: 17 bytes per hidden unit + 8 per MLP unit, a token, at 16 bits
HEADROOM = 0.5  # checkpoint when the activations would take more than this share of the free memory


def activation_bytes(tokens: int, hidden: int, layers: int, dtype_bytes: int, intermediate: int | None = None) -> int:
    """Bytes a forward pass over `tokens` tokens stores for backward without checkpointing (see the module
    docstring); `dtype_bytes`: 2 for bf16 activations, 4 for fp32; `intermediate`: the gated MLP's width
    (None: Eq. 1's GeLU MLP of width 4 × hidden)."""
    if intermediate is None:
        per_token_layer = BYTES_PER_TOKEN_HIDDEN_LAYER_16BIT * hidden
    else:
        per_token_layer = GATED_LAYER_BYTES[0] * hidden + GATED_LAYER_BYTES[1] * intermediate
    return int(per_token_layer * dtype_bytes // 2 * tokens * layers)


def free_bytes(device: torch.device) -> int:
    """Memory a forward pass can still take on `device` (bytes): on CUDA the driver's free memory plus what
    PyTorch's caching allocator holds unused, within this process's cap
    (`torch.cuda.set_per_process_memory_fraction`); on CPU the memory the OS reports available."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device)
        get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if get_fraction is not None:  # the allocator refuses to reserve beyond fraction x total
            free = min(free, max(0, int(get_fraction(device) * total) - reserved))
        return int(free + reserved - torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.virtual_memory().available)


def decoder_shape(model: torch.nn.Module) -> tuple[int, int, int | None]:
    """(hidden size, decoder layers, gated-MLP width or None) of a Hugging Face model (its text config for a
    multimodal one; the width is the config's `intermediate_size`)."""
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    width = getattr(text, "intermediate_size", None)
    return int(text.hidden_size), int(text.num_hidden_layers), int(width) if width else None


def set_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """Turn recomputation on or off in every decoder layer of `model` (one on which
    `gradient_checkpointing_enable` was called once, which installs the recompute function)."""
    for m in model.modules():  # the decoder layers (and the flag older model code reads on the model itself)
        if isinstance(getattr(m, "gradient_checkpointing", None), bool):
            m.gradient_checkpointing = on


def needs_checkpointing(tokens: int, hidden: int, layers: int, dtype_bytes: int, free: int,
                        headroom: float = HEADROOM, intermediate: int | None = None) -> bool:
    """Whether a pass over `tokens` tokens should recompute activations: its `activation_bytes` exceed
    `headroom` × `free` bytes."""
    return activation_bytes(tokens, hidden, layers, dtype_bytes, intermediate) > headroom * free
