"""`learner.liger`: Liger Kernel's fused Triton kernels (RMSNorm, rotary embedding, SwiGLU / GeGLU) patched into
the policy and the reference model.

Why: in a 1.5B update in eager PyTorch about half the GPU time is outside the matmuls, in these unfused
elementwise kernels (`docs/performance.md`, "On one GPU"); verl and OpenRLHF turn Liger on (`use_liger`) for them.

What is not taken from Liger: its fused linear cross-entropy / GRPO losses. They return a loss (and, with
`reduction="none"`, per-token cross-entropy), but no entropy, which the trainer logs and the entropy term needs,
and their GRPO loss has its own clipping, KL and aggregation, not `algorithms.policy_loss`'s variants over a
shared-prefix packed row. So every pass (old, reference and updated log-probs) keeps the chunked LM head of
`actors.learner.token_stats`, which already never holds more than `logprob_chunk_tokens` × vocabulary logits.

Liger's kernels are Triton GPU kernels and the package is installed on GPU machines only: the config refuses the
option on a CPU learner (`LearnerConfig`), and `apply_liger` names the package when it is missing.
"""

from __future__ import annotations

from torch import nn

# The kernels patched in; the loss-replacing ones stay off (the module docstring says why).
KERNELS = {"rms_norm": True, "rope": True, "swiglu": True, "geglu": True,
           "cross_entropy": False, "fused_linear_cross_entropy": False}


def apply_liger(lm: nn.Module) -> str:
    """Patch Liger Kernel's RMSNorm, rotary embedding and SwiGLU (GeGLU for Gemma) into `lm` in place, before
    LoRA adapters and `compile_layers` wrap it; returns the patched model type (e.g. "qwen2").

    Args:
        lm: a Hugging Face causal LM whose `config.model_type` Liger supports (Qwen2, Llama, Gemma 3, ...).

    Raises:
        ImportError: `liger_kernel` is not installed (`pip install liger-kernel` on the GPU machine).
        ValueError: Liger has no kernels for this model type (its patch would silently do nothing).
    """
    try:
        from liger_kernel.transformers.monkey_patch import (
            MODEL_TYPE_TO_APPLY_LIGER_FN,
            _apply_liger_kernel_to_instance,
        )
    except ImportError as e:
        raise ImportError(f"learner.liger: the liger_kernel package is not importable ({e}); install it on the GPU "
                          "machines (`pip install liger-kernel`), or set learner.liger=false") from e
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ValueError(f"learner.liger: Liger Kernel has no kernels for model type {model_type!r} "
                         f"({type(lm).__name__}); it supports {sorted(MODEL_TYPE_TO_APPLY_LIGER_FN)}. Set "
                         "learner.liger=false for this model")
    _apply_liger_kernel_to_instance(model=lm, **KERNELS)
    return model_type
