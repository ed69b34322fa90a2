"""Shared-prefix packing: the G responses of one prompt run as one row, the prompt computed once.

A GRPO group's G samples share their prompt token for token; an unpacked batch runs that prompt G
times. Packed, one row holds `[prompt | response 1 | ... | response G]`: the prompt attends to
itself (causal), each response attends to the prompt and to itself (causal) and never to another
response, and its positions restart right after the prompt. Every response token then sees exactly
the keys and values it sees unpacked, so log-probs, values and gradients are those of the unpacked
batch up to floating-point summation order (Prefix Grouper, arXiv 2506.05433, §3; verl's
`use_prefix_grouper`). Multi-turn responses keep their observations inside them: those tokens are
packed like any other, and the loss mask (applied by the caller) keeps them out of the loss.

The mask is passed to Hugging Face decoders as a 4D boolean mask (sdpa: True = attend) or additive
float (eager); models with per-layer-type masks (Gemma 3, Qwen2: `config.layer_types`) get one per
type, the sliding-window layers' built on the logical positions (q − k < `config.sliding_window`).
`supports_shared_prefix` says where this is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

LAYER_TYPES = ("full_attention", "sliding_attention")
ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class SharedPrefixPacking:
    """A micro-batch of b unpacked rows packed into g ≤ b rows, one per distinct prompt.

    Attributes:
        input_ids: `[g, L]` int64, each row `prompt + its responses`, right-padded (pad id 0).
        position_ids: `[g, L]` int64, 0.. over the prompt, restarting at the prompt's length for each
            response (padding: 0).
        allowed: `[g, L, L]` bool, query (row) may attend to key (column); padding attends to itself only.
        hidden_index: `[b, R]` int64, flat index into the `[g * L]` hidden states of the state that
            predicts response token j of unpacked row i (the prompt's last token for j = 0); 0 past a
            row's response (those positions are masked by the caller).
        tokens: real (non-padding) tokens in the packed rows: what the forward pass computes.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    hidden_index: torch.Tensor
    tokens: int

    @property
    def rows(self) -> int:
        """Packed rows g."""
        return int(self.input_ids.shape[0])


def pack_shared_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> SharedPrefixPacking:
    """Pack the rows of an unpacked batch that share a prompt (identical real prompt tokens).

    Args:
        input_ids, attention_mask: `[b, P + R]` int64, prompts left-padded to P columns and responses
            right-padded (the `actors.learner.batch.TrainBatch` layout).
        prompt_len: P (columns).
    Returns:
        `SharedPrefixPacking`; rows with no response tokens contribute nothing but their prompt.
    Raises:
        ValueError: a row with an empty prompt (nothing predicts its first response token).
    """
    ids, attn = input_ids.cpu(), attention_mask.cpu().bool()
    b, width = ids.shape
    R = width - prompt_len
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in range(b):
        prompt = tuple(ids[i, :prompt_len][attn[i, :prompt_len]].tolist())
        if not prompt:
            raise ValueError(f"pack_shared_prefix: row {i} has an empty prompt")
        groups.setdefault(prompt, []).append(i)
    resp_len = attn[:, prompt_len:].sum(1).tolist()
    lengths = [len(p) + sum(resp_len[i] for i in rows) for p, rows in groups.items()]
    L = max(lengths)
    g = len(groups)
    packed = torch.zeros((g, L), dtype=torch.long)
    pos = torch.zeros((g, L), dtype=torch.long)
    seg = torch.full((g, L), -1, dtype=torch.long)  # -1 padding, 0 prompt, k + 1 the k-th response
    hidden_index = torch.zeros((b, R), dtype=torch.long)
    for r, (prompt, rows) in enumerate(groups.items()):
        p = len(prompt)
        packed[r, :p] = torch.tensor(prompt)
        pos[r, :p] = torch.arange(p)
        seg[r, :p] = 0
        start = p
        for k, i in enumerate(rows):
            n = resp_len[i]
            packed[r, start : start + n] = ids[i, prompt_len : prompt_len + n]
            pos[r, start : start + n] = torch.arange(p, p + n)
            seg[r, start : start + n] = k + 1
            if n:  # token 0 is predicted by the prompt's last state, token j by the response's token j - 1
                hidden_index[i, :n] = r * L + torch.cat([torch.tensor([p - 1]), torch.arange(start, start + n - 1)])
            start += n
    idx = torch.arange(L)
    causal = idx[None, :] <= idx[:, None]
    sees = (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])  # [g, q, k]: the prompt, or its own segment
    real = seg >= 0
    allowed = causal[None] & sees & real[:, None, :] & real[:, :, None]
    allowed |= torch.eye(L, dtype=torch.bool)[None] & ~real[:, :, None]  # padding queries: themselves (no empty row)
    dev = input_ids.device
    return SharedPrefixPacking(packed.to(dev), pos.to(dev), allowed.to(dev), hidden_index.to(dev), sum(lengths))


def layer_types(config: Any) -> tuple[str, ...]:
    """The attention types of a Hugging Face text config's layers (all "full_attention" without `layer_types`)."""
    types = getattr(config, "layer_types", None)
    return tuple(types) if types else ("full_attention",) * int(getattr(config, "num_hidden_layers", 1))


def supports_shared_prefix(config: Any) -> str | None:
    """Why shared-prefix packing would not be exact for a model with this config, or None when it is.

    Exact where the decoder takes a ready 4D mask and `position_ids` (Hugging Face's sdpa and eager
    attention) and every layer is full or sliding-window causal attention (the window applied here on
    logical positions). Chunked or other attention types, flash / flex attention and multimodal
    configs are left to the unpacked path.
    """
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in ATTENTION:
        return f"attention implementation {impl!r} (packing needs one of {ATTENTION})"
    other = sorted(set(layer_types(config)) - set(LAYER_TYPES))
    if other:
        return f"layer types {other} (packing handles {LAYER_TYPES})"
    return None


def decoder_masks(packing: SharedPrefixPacking, config: Any, dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
    """The attention mask(s) a Hugging Face decoder takes for `packing`: a `[g, 1, L, L]` mask, or one per
    layer type (`config.layer_types`) where the model looks masks up by type; boolean for sdpa, additive
    (0 / dtype's min) for eager. Sliding-window layers see keys with q − k < `config.sliding_window`
    logical positions."""
    allowed = packing.allowed
    sliding = allowed
    window = getattr(config, "sliding_window", None)
    if window and "sliding_attention" in layer_types(config):
        pos = packing.position_ids
        sliding = allowed & ((pos[:, :, None] - pos[:, None, :]) < window)

    def fmt(m: torch.Tensor) -> torch.Tensor:
        m = m[:, None]
        if (getattr(config, "_attn_implementation", None) or "eager") == "sdpa":
            return m
        return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, torch.finfo(dtype).min)

    if getattr(config, "layer_types", None):
        return {t: fmt(sliding if t == "sliding_attention" else allowed) for t in set(config.layer_types)}
    return fmt(allowed)


def packed_hidden(decoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  prompt_len: int, response_len: int) -> tuple[torch.Tensor, int]:
    """`(hidden [b, R, H], tokens)`: the decoder states that predict each response token, computed on
    the shared-prefix packing of the batch, and the real tokens the forward ran over.

    Args:
        decoder: a Hugging Face base model (input ids -> `last_hidden_state`); `supports_shared_prefix`
            of its config must be None.
        input_ids, attention_mask: `[b, P + R]` int64 (the `TrainBatch` layout).
        prompt_len, response_len: P and R (columns).
    """
    pk = pack_shared_prefix(input_ids, attention_mask, prompt_len)
    dtype = next(decoder.parameters()).dtype
    out = decoder(input_ids=pk.input_ids, attention_mask=decoder_masks(pk, decoder.config, dtype),
                  position_ids=pk.position_ids, use_cache=False)
    states = out.last_hidden_state
    flat = states.reshape(-1, states.shape[-1])
    return flat[pk.hidden_index[:, :response_len]], pk.tokens
