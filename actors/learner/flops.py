"""Model FLOPs of a learner update and this machine's matmul peak: the two halves of MFU.

MFU = model FLOPs of the work done / (seconds x peak FLOP/s). Model FLOPs count what the math
needs, not what an implementation does: a forward pass costs 2 FLOPs per parameter per token and a
backward pass 4 (Kaplan et al. 2020, "6N per token"); gradient-checkpointing recompute is not
counted (that would be hardware FLOPs utilisation). The decoder runs on every token of a sequence
(prompt, policy text and observations); the LM head runs only on policy tokens here (the learner
computes log-probs of policy tokens only, `actors.learner.token_stats`), which matters for
262k-vocabulary models such as Gemma 3 where the head is most of the FLOPs per token.
"""

from __future__ import annotations

import time


def update_flops(decoder_params: int, hidden: int, vocab: int, tokens: int, policy_tokens: int,
                 backward: bool = True) -> float:
    """Model FLOPs of one pass over a batch (float).

    Args:
        decoder_params: parameters of the decoder stack without the embedding table and LM head (count).
        hidden, vocab: the LM head is a `[hidden, vocab]` matmul.
        tokens: tokens the decoder runs on (all of every sequence, padding excluded).
        policy_tokens: tokens the LM head runs on (loss-mask 1).
        backward: forward + backward (6 per parameter-token) or forward only (2).

    Raises:
        ValueError: a negative count.
    """
    if min(decoder_params, hidden, vocab, tokens, policy_tokens) < 0:
        raise ValueError("update_flops: counts must be >= 0")
    per = 6.0 if backward else 2.0
    return per * (decoder_params * tokens + hidden * vocab * policy_tokens)


def decoder_param_count(model) -> int:
    """Parameters of a Hugging Face causal LM without its input embedding and LM head (count)."""
    skip = {id(p) for p in model.get_input_embeddings().parameters()}
    head = model.get_output_embeddings()
    if head is not None:
        skip |= {id(p) for p in head.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def matmul_peak_flops(dtype: str = "fp32", size: int = 2048, threads: int | None = None, repeats: int = 5) -> float:
    """Measured peak FLOP/s of a square `size` matmul in `dtype` ("fp32" or "bf16") with `threads`
    torch threads (None = as set): the best of `repeats` runs after a warm-up."""
    import torch

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size, dtype=dt), torch.randn(size, size, dtype=dt)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
    finally:
        torch.set_num_threads(old)
    return 2.0 * size**3 / best
