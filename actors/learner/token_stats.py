"""Per-token log-probs, entropies and values of response tokens, without full-vocabulary logits.

With Gemma's 262,144-token vocabulary one fp32 logits tensor at 4 × 512 tokens is 2.1 GB; the
learner must fit beside vLLM in 24 GiB. So the LM head runs only on the hidden states of policy
tokens (loss mask 1: observations and padding are skipped), in chunks of `chunk_tokens`, and each
chunk is recomputed in the backward pass (activation checkpointing) instead of keeping its logits.

Models are Hugging Face causal LMs of any architecture with `base_model_prefix` (Qwen2, Gemma 3,
Llama, ...): the decoder gives hidden states, `get_output_embeddings()` the head.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from actors.learner.packing import packed_hidden, supports_shared_prefix


def response_hidden(decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    prompt_len: int, response_len: int, shared_prefix: bool = False) -> tuple[torch.Tensor, int]:
    """Decoder hidden states that predict each response token, `[b, R, H]`, and the real tokens the
    forward pass ran over.

    Args:
        input_ids, attention_mask: `[b, P + R]` int64 (prompt left-padded, response right-padded).
        prompt_len: P (columns); response token j sits at column P + j and is predicted from P + j - 1.
        response_len: R (columns).
        shared_prefix: run rows that share a prompt as one packed row, the prompt once
            (`actors.learner.packing`; the same states up to summation order).
    """
    if shared_prefix:
        return packed_hidden(decoder, input_ids, attention_mask, prompt_len, response_len)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.last_hidden_state[:, prompt_len - 1 : prompt_len - 1 + response_len], int(attention_mask.sum())


def _chunk_logprob_entropy(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, temperature: float,
                           softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    logprob = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - logz
    entropy = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprob, entropy


class PolicyTokenStats(nn.Module):
    """A causal LM that returns log-probs and entropies of the response tokens (s3 Eq. 2's π_θ terms).

    `forward(input_ids [b, P+R] int64, attention_mask [b, P+R] int64, loss_mask [b, R] float,
    prompt_len=P) -> (logprobs [b, R] float32, entropy [b, R] float32)`, both 0 where the loss mask
    is 0. Log-probs are of the sampling distribution: logits (after the model's final soft-capping,
    if any) divided by `temperature`, the same processing vLLM reports logprobs after.

    Args:
        lm: a Hugging Face causal LM (`AutoModelForCausalLM`).
        chunk_tokens: policy tokens per LM-head chunk (memory: chunk × vocab × 4 bytes, twice).
        temperature: the rollout sampling temperature (> 0).
        shared_prefix: pack rows that share a prompt (`actors.learner.packing`) where the model
            supports it exactly (`supports_shared_prefix`); `self.shared_prefix` says whether it is on.

    `self.tokens_run` is the number of real tokens the last forward pass ran over (packed: each
    shared prompt once).
    """

    def __init__(self, lm: nn.Module, chunk_tokens: int = 512, temperature: float = 1.0, shared_prefix: bool = False):
        super().__init__()
        if chunk_tokens < 1 or temperature <= 0:
            raise ValueError(f"PolicyTokenStats: chunk_tokens must be >= 1 and temperature > 0, "
                             f"got {chunk_tokens} and {temperature}")
        self.lm = lm
        self.chunk_tokens, self.temperature = chunk_tokens, temperature
        self.softcap = getattr(lm.config, "final_logit_softcapping", None)
        self.shared_prefix = shared_prefix and supports_shared_prefix(self.decoder.config) is None
        self.tokens_run = 0

    @property
    def decoder(self) -> nn.Module:
        """The LM without its head (`lm.<base_model_prefix>`): input ids -> hidden states."""
        return getattr(self.lm, self.lm.base_model_prefix)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies of the response tokens (s3 Eq. 2's π_θ terms); the LM head runs
        only where `loss_mask` > 0, in chunks of `chunk_tokens` (recomputed in backward when grad is on).

        Args:
            input_ids, attention_mask: `[b, P + R]` int64 (prompt left-padded, response right-padded).
            loss_mask: `[b, R]`; tokens with mask > 0 are scored.
            prompt_len: P (columns).

        Returns:
            (logprobs, entropy): each `[b, R]` float32 on the model's device, 0 where `loss_mask` is 0;
            of the logits after soft-capping, divided by `temperature`.
        """
        R = loss_mask.shape[1]
        hidden, self.tokens_run = response_hidden(self.decoder, input_ids, attention_mask, prompt_len, R,
                                                  self.shared_prefix)
        labels = input_ids[:, prompt_len : prompt_len + R]
        sel = loss_mask > 0
        h, y = hidden[sel], labels[sel]  # [N, H], [N]
        head = self.lm.get_output_embeddings()
        parts_lp, parts_ent = [], []
        for i in range(0, h.shape[0], self.chunk_tokens):
            args = (head, h[i : i + self.chunk_tokens], y[i : i + self.chunk_tokens], self.temperature, self.softcap)
            if torch.is_grad_enabled():
                lp, ent = checkpoint(_chunk_logprob_entropy, *args, use_reentrant=False)
            else:
                lp, ent = _chunk_logprob_entropy(*args)
            parts_lp.append(lp)
            parts_ent.append(ent)
        logprobs = torch.zeros(loss_mask.shape, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros_like(logprobs)
        if parts_lp:
            logprobs = logprobs.masked_scatter(sel, torch.cat(parts_lp))
            entropy = entropy.masked_scatter(sel, torch.cat(parts_ent))
        return logprobs, entropy


class ValueModel(nn.Module):
    """A critic: the policy's decoder architecture with a scalar value head (PPO; s3 trains one).

    `forward(input_ids [b, P+R], attention_mask [b, P+R], loss_mask [b, R], prompt_len=P) ->
    values [b, R] float32`: V of the state before each response token (from the hidden state at
    column P + j - 1, aligned with the log-probs), 0 where the loss mask is 0.

    Args:
        decoder: a Hugging Face base model (`AutoModel`), e.g. the policy's decoder.
        hidden_size: its hidden size (the head's input width).
        shared_prefix: as in `PolicyTokenStats`.
    """

    def __init__(self, decoder: nn.Module, hidden_size: int, shared_prefix: bool = False):
        super().__init__()
        self.decoder = decoder
        self.shared_prefix = shared_prefix and supports_shared_prefix(decoder.config) is None
        self.tokens_run = 0
        self.value_head = nn.Linear(hidden_size, 1)
        # A small head (OpenRLHF's init) keeps the first values near 0, the returns' scale at start.
        nn.init.normal_(self.value_head.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                prompt_len: int) -> torch.Tensor:
        """Values `[b, R]` float32: V of the state before each response token (hidden state at column
        P + j - 1), 0 where `loss_mask` is 0. Inputs as in `PolicyTokenStats.forward`."""
        hidden, self.tokens_run = response_hidden(self.decoder, input_ids, attention_mask, prompt_len,
                                                  loss_mask.shape[1], self.shared_prefix)
        values = self.value_head(hidden).squeeze(-1).float()
        return torch.where(loss_mask > 0, values, torch.zeros_like(values))
