"""`learner.gradient_checkpointing: auto`: recompute decoder activations in backward only where the
micro-batch's activations would not fit the memory left.

The estimate is Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198) Eq. 1 for a decoder layer's stored activations, `s·b·h·(34 + 5·a·s/h)` bytes with
2-byte activations, without the attention-score term (PyTorch SDPA and flash attention keep no s×s
matrix): 34 bytes per token per hidden unit per layer at 16 bits, 68 at 32. The LM head's log-probs are
chunked (`actors.learner.token_stats`), so the vocabulary adds little.
"""

from __future__ import annotations

import torch

BYTES_PER_TOKEN_HIDDEN_LAYER_16BIT = 34  # Korthikanti et al. 2022 Eq. 1, no attention-score term
HEADROOM = 0.5  # checkpoint when the activations would take more than this share of the free memory


def activation_bytes(tokens: int, hidden: int, layers: int, dtype_bytes: int) -> int:
    """Bytes a forward pass over `tokens` tokens stores for backward without checkpointing (see the module
    docstring); `dtype_bytes`: 2 for bf16 activations, 4 for fp32."""
    return int(BYTES_PER_TOKEN_HIDDEN_LAYER_16BIT * dtype_bytes // 2 * tokens * hidden * layers)


def free_bytes(device: torch.device) -> int:
    """Memory a forward pass can still take on `device` (bytes): on CUDA the driver's free memory plus what
    PyTorch's caching allocator holds unused; on CPU the memory the OS reports available."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.virtual_memory().available)


def decoder_shape(model: torch.nn.Module) -> tuple[int, int]:
    """(hidden size, decoder layers) of a Hugging Face model (its text config for a multimodal one)."""
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return int(text.hidden_size), int(text.num_hidden_layers)


def set_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """Turn recomputation on or off in every decoder layer of `model` (one on which
    `gradient_checkpointing_enable` was called once, which installs the recompute function)."""
    for m in model.modules():  # the decoder layers (and the flag older model code reads on the model itself)
        if isinstance(getattr(m, "gradient_checkpointing", None), bool):
            m.gradient_checkpointing = on


def needs_checkpointing(tokens: int, hidden: int, layers: int, dtype_bytes: int, free: int,
                        headroom: float = HEADROOM) -> bool:
    """Whether a pass over `tokens` tokens should recompute activations: its `activation_bytes` exceed
    `headroom` × `free` bytes."""
    return activation_bytes(tokens, hidden, layers, dtype_bytes) > headroom * free
