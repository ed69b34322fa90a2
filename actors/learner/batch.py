"""`TrainBatch`: trajectories as padded tensors for the learners (pure torch, no Ray).

Layout (the one veRL and OpenRLHF use): prompts are left-padded to P columns and responses
right-padded to R columns, so response token j of every row sits at column P + j and its
log-prob comes from the logits at column P + j - 1. Response-aligned tensors (`loss_mask`,
`old_logprobs`, `advantages`, ...) are `[B, R]`, the shape `algorithms/` works on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

RESPONSE_FIELDS = ("loss_mask", "old_logprobs", "ref_logprobs", "advantages", "returns", "old_values",
                   "behaviour_logprobs")


@dataclass
class TrainBatch:
    """A batch of B sequences.

    Attributes:
        input_ids: `[B, P + R]` int64, prompt (left-padded) then response (right-padded).
        attention_mask: `[B, P + R]` int64, 1 on real tokens.
        prompt_len: P, the padded prompt width (columns).
        loss_mask: `[B, R]` float32, 1 on policy tokens, 0 on observations, feedback and padding.
        old_logprobs: `[B, R]` float32, log-probs of the sampling policy (0 where masked): the
            engine's at first, the learner's recomputed ones before an update; None when the
            update reads them from its own forward pass (`actors.learner.policy.single_step`).
        ref_logprobs, advantages, returns, old_values: `[B, R]` float32 or None until computed.
        group_ids: B group ids (GRPO groups; unique across datasets).
        behaviour_logprobs: `[B, R]` float32, the engine's log-probs as it sampled (0 where masked);
            kept when `old_logprobs` are replaced by the learner's, for an off-policy correction.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: int
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor | None
    group_ids: list[str]
    ref_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    behaviour_logprobs: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """Number of sequences B."""
        return int(self.input_ids.shape[0])

    @property
    def response_len(self) -> int:
        """Padded response width R (tokens)."""
        return int(self.loss_mask.shape[1])

    @property
    def position_ids(self) -> torch.Tensor:
        """`[B, P + R]` int64 positions counting real tokens only (left padding starts at 0)."""
        return (self.attention_mask.cumsum(-1) - 1).clamp(min=0)

    def num_policy_tokens(self) -> int:
        """Tokens with loss mask 1 in the batch."""
        return int(self.loss_mask.sum().item())

    def select(self, index: Sequence[int] | torch.Tensor) -> TrainBatch:
        """The rows `index`, with all-padding prompt and response columns trimmed away."""
        idx = torch.as_tensor(index, dtype=torch.long)
        attn = self.attention_mask[idx]
        real_cols = attn.any(0)
        prompt_cols = real_cols[: self.prompt_len]
        first = int(prompt_cols.float().argmax()) if prompt_cols.any() else self.prompt_len
        resp_cols = real_cols[self.prompt_len:]
        width = int(resp_cols.nonzero().max()) + 1 if resp_cols.any() else 0
        cols = slice(first, self.prompt_len + width)
        out = {
            "input_ids": self.input_ids[idx][:, cols],
            "attention_mask": attn[:, cols],
            "prompt_len": self.prompt_len - first,
            "group_ids": [self.group_ids[i] for i in idx.tolist()],
        }
        for name in RESPONSE_FIELDS:
            t = getattr(self, name)
            out[name] = None if t is None else t[idx][:, :width]
        return TrainBatch(**out)

    def with_fields(self, **tensors: torch.Tensor | None) -> TrainBatch:
        """A copy with response-aligned fields set (each `[B, R]`; None clears an optional field).

        Raises:
            ValueError: a field name that is not response-aligned, or a wrong shape.
        """
        for name, t in tensors.items():
            if name not in RESPONSE_FIELDS or (t is None and name == "loss_mask"):
                raise ValueError(f"TrainBatch.with_fields: {name!r} is not one of {RESPONSE_FIELDS}")
            if t is not None and tuple(t.shape) != tuple(self.loss_mask.shape):
                raise ValueError(f"TrainBatch.with_fields: {name} has shape {tuple(t.shape)}, "
                                 f"expected {tuple(self.loss_mask.shape)} ([B, R])")
        return replace(self, **{k: None if v is None else v.float() for k, v in tensors.items()})

    def to(self, device: str | torch.device) -> TrainBatch:
        """The batch with every tensor on `device`."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device)
        return TrainBatch(**moved)


def group_rows(group_ids: Sequence[str]) -> list[list[int]]:
    """Row indices of each group, groups in order of first appearance, rows in batch order."""
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def group_order(group_ids: Sequence[str]) -> torch.Tensor:
    """`[B]` int64: every row, each group's rows next to each other (`group_rows`' order)."""
    return torch.tensor([i for rows in group_rows(group_ids) for i in rows], dtype=torch.long)


def scatter_rows(values: torch.Tensor, rows: torch.Tensor, size: int, width: int) -> torch.Tensor:
    """`[size, width]` float32, zeros except `values` (`[len(rows), w]`, w <= width: a response-aligned tensor of
    `TrainBatch.select(rows)`, whose response columns are the first w of the whole batch's) in the rows `rows`.

    Raises:
        ValueError: `values` has another row count than `rows`, or is wider than `width`.
    """
    if values.shape[0] != len(rows) or values.shape[1] > width:
        raise ValueError(f"scatter_rows: values {tuple(values.shape)} do not fit {len(rows)} rows of width {width}")
    out = torch.zeros((size, width), dtype=torch.float32)
    out[rows, : values.shape[1]] = values.float().cpu()
    return out


def trained_rows(algorithm: Any, advantages: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    """`[n]` int64: the rows of `batch` (a `TrainBatch`) that the policy update trains on: all of them, or with
    `algorithm.skip_zero_advantage` those outside groups whose advantages are all 0 (the update leaves those out:
    `algorithms.zero_advantage_groups`, DAPO §3.2), so no log-prob pass runs over rows no loss reads."""
    from algorithms.advantages import zero_advantage_groups

    if not algorithm.skip_zero_advantage:
        return torch.arange(batch.size)
    return (~zero_advantage_groups(advantages, batch.loss_mask, batch.group_ids)).nonzero().flatten()


def split_at_groups(rows: torch.Tensor, group_ids: Sequence[str] | None, parts: int,
                    weights: torch.Tensor | None = None) -> list[torch.Tensor]:
    """`rows` (each group's rows next to each other) in `parts` contiguous chunks of about equal weight
    (`len/parts` rows, or `weights.sum()/parts` tokens) as a cut at a group boundary allows; a cut falls
    inside a group only where no boundary is left (fewer groups than parts). Every chunk has a row when
    `len(rows) >= parts`.

    Args:
        rows: `[n]` int64 row indices; group_ids: the batch's B group ids (indexed by `rows`), or None
            to cut anywhere; weights: `[n]` per-row weights in `rows` order (tokens,
            `learner.micro_batch_tokens`), or None for one per row.
    """
    n = len(rows)
    if parts <= 1 or n < parts:
        return list(rows.tensor_split(max(parts, 1)))
    cum = [0.0, *torch.cumsum(weights.double(), 0).tolist()] if weights is not None else list(range(n + 1))
    if group_ids is None:
        bounds = list(range(1, n))
    else:
        ids = [group_ids[i] for i in rows.tolist()]
        bounds = [i for i in range(1, n) if ids[i] != ids[i - 1]]
    cuts: list[int] = []
    for k in range(1, parts):
        lo, hi = (cuts[-1] if cuts else 0) + 1, n - (parts - k)  # room for a row in each chunk left
        target = k * cum[n] / parts
        near = [b for b in bounds if lo <= b <= hi]
        inside = min(range(lo, hi + 1), key=lambda b: (abs(cum[b] - target), b))
        cuts.append(min(near, key=lambda b: (abs(cum[b] - target), b)) if near else inside)
    return list(rows.tensor_split(cuts))


def make_train_batch(trajectories: Sequence[Mapping[str, Any] | Any], pad_token_id: int) -> TrainBatch:
    """Pad trajectories (`Trajectory` objects or their `to_json()` dicts) into a `TrainBatch`.

    Uses `prompt_ids`, `response_ids`, `loss_mask`, `logprobs` and `group_id` of each; token lists
    are taken as they are (never re-tokenized).

    Raises:
        ValueError: no trajectories, an empty prompt, or response lists of unequal lengths.
    """
    rows = [t if isinstance(t, Mapping) else t.to_json() for t in trajectories]
    if not rows:
        raise ValueError("make_train_batch: no trajectories")
    for i, r in enumerate(rows):
        if not r["prompt_ids"]:
            raise ValueError(f"make_train_batch: trajectory {i} ({r.get('group_id')}) has an empty prompt")
        n = len(r["response_ids"])
        if len(r["loss_mask"]) != n or len(r["logprobs"]) != n:
            raise ValueError(f"make_train_batch: trajectory {i} ({r.get('group_id')}) has response_ids/loss_mask/"
                             f"logprobs of lengths {n}/{len(r['loss_mask'])}/{len(r['logprobs'])}")
    B = len(rows)
    P = max(len(r["prompt_ids"]) for r in rows)
    R = max(1, max(len(r["response_ids"]) for r in rows))
    input_ids = torch.full((B, P + R), pad_token_id, dtype=torch.long)
    attention = torch.zeros((B, P + R), dtype=torch.long)
    loss_mask = torch.zeros((B, R), dtype=torch.float32)
    old_logprobs = torch.zeros((B, R), dtype=torch.float32)
    for i, r in enumerate(rows):
        p, n = len(r["prompt_ids"]), len(r["response_ids"])
        input_ids[i, P - p : P] = torch.tensor(r["prompt_ids"], dtype=torch.long)
        attention[i, P - p : P + n] = 1
        if n:
            input_ids[i, P : P + n] = torch.tensor(r["response_ids"], dtype=torch.long)
            loss_mask[i, :n] = torch.tensor(r["loss_mask"], dtype=torch.float32)
            old_logprobs[i, :n] = torch.tensor(r["logprobs"], dtype=torch.float32) * loss_mask[i, :n]
    return TrainBatch(input_ids, attention, P, loss_mask, old_logprobs, [str(r["group_id"]) for r in rows],
                      behaviour_logprobs=old_logprobs)  # the same tensor: fields are replaced, never written
