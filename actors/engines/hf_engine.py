"""`HFEngine`: the `Engine` protocol on plain transformers: the fallback where vLLM cannot start.

Decoding is a token-by-token loop over the model with its KV cache, so the engine controls every
step: temperature 0 is greedy; otherwise temperature, then top-k, then top-p (vLLM's order and
top-p rule) and a multinomial draw from a per-request `torch.Generator`. The log-probability of
each sampled token is taken from that processed distribution (at temperature 0: the plain softmax
of the logits), as vLLM's `logprobs_mode="processed_logprobs"` does. Generation stops right after
the token that completes a stop string (the text is cut at the end of the stop string; the token
ids keep that whole token) or after an EOS token (kept, with its log-probability).

Concurrency: requests are SERIALIZED with a lock (one at a time) and run in a worker thread
(`asyncio.to_thread`), so the event loop is never blocked. The prompt is prefilled once; the `n`
samples of one request then decode as one batch. Throughput (2 CPU cores, Gemma 3 270M bf16): ≈ 10-20 tokens/s for n=1, several times more
for n=8 samples of one prompt.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from actors.engines.base import Generation, Sampling, check_prompt, eos_token_ids

_DTYPES = ("auto", "bfloat16", "float16", "float32")


def processed_logprobs(logits, sampling: Sampling):
    """Log-probabilities of the distribution `sampling` draws from, over the whole vocabulary.

    Args:
        logits: float tensor [rows, vocab] (any float dtype; computed in float32).
        sampling: temperature 0 = greedy: the plain log-softmax of the logits (what vLLM reports
            for greedy requests); else logits / temperature, then top-k (0 = off), then top-p
            (vLLM's rule: drop the least likely tokens whose cumulative probability stays
            <= 1 - top_p; the most likely token is always kept), renormalised.

    Returns:
        float32 tensor [rows, vocab]; dropped tokens are -inf.
    """
    import torch

    x = logits.float()
    if sampling.temperature == 0:
        return torch.log_softmax(x, dim=-1)
    x = x / sampling.temperature
    if 0 < sampling.top_k < x.shape[-1]:
        kth = torch.topk(x, sampling.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        cum = torch.cumsum(torch.softmax(sorted_x, dim=-1), dim=-1)
        drop = cum <= 1.0 - sampling.top_p
        drop[:, -1] = False  # always keep the most likely token
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return torch.log_softmax(x, dim=-1)


def process_logits(logits, sampling: Sampling, generators=None):
    """Pick the next token of each row and its log-probability under `processed_logprobs`.

    Args:
        logits: float tensor [rows, vocab]. sampling: see `processed_logprobs`.
        generators: one `torch.Generator` per row for the draws (None = torch's global one).

    Returns:
        (tokens int64 [rows], logprobs float32 [rows]); every logprob <= 0. Temperature 0 takes
        the argmax.
    """
    import torch

    logp = processed_logprobs(logits, sampling)
    if sampling.temperature == 0:
        tokens = torch.argmax(logp, dim=-1)
    else:
        # Exponential race (as vLLM samples): argmax p_i / q_i with q_i ~ Exp(1) draws i with
        # probability p_i; 3x faster than torch.multinomial over a 262k vocabulary.
        probs = logp.exp()
        q = torch.empty_like(probs)
        for row, gen in enumerate(generators or [None] * probs.shape[0]):
            q[row].exponential_(generator=gen)
        tokens = torch.argmax(probs / q, dim=-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class _Row:
    """Decoding state of one sample."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None


class HFEngine:
    """The `Engine` protocol on a transformers causal LM (CPU or one GPU).

    Args:
        model: local directory or Hugging Face name (already resolved: see `actors.engines.models`).
        dtype: "auto" (the checkpoint's), "bfloat16", "float16" or "float32".
        device: torch device string (default "cuda" if available else "cpu").
        max_model_len: prompt + generated tokens at most (count).
        seed: engine seed; requests without `Sampling.seed` get seeds drawn from it.

    Attributes:
        tokenizer: the model's Hugging Face tokenizer. weight_version: version in use (0 = loaded).
        startup_seconds: wall time of the constructor.

    Raises:
        ValueError: unknown dtype or max_model_len < 2.
    """

    def __init__(self, model: str, *, dtype: str = "auto", device: str | None = None,
                 max_model_len: int = 4096, seed: int = 0) -> None:
        t0 = time.perf_counter()
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 tokens, got {max_model_len}")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_path = model
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).to(self.device).eval()
        self.model.requires_grad_(False)
        self.max_model_len = max_model_len
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids = self._eos_ids()
        self.weight_version = 0
        self._seeds = random.Random(seed)
        self._lock = threading.Lock()
        self._closed = False
        self.startup_seconds = time.perf_counter() - t0

    def _eos_ids(self) -> set[int]:
        gen_cfg = getattr(self.model, "generation_config", None)
        return eos_token_ids(self.tokenizer.eos_token_id, getattr(self.model.config, "eos_token_id", None),
                             getattr(gen_cfg, "eos_token_id", None))

    def _check(self, prompt_token_ids: Sequence[int], sampling: Sampling) -> list[int]:
        if self._closed:
            raise RuntimeError("HFEngine used after shutdown(); create a new engine")
        return check_prompt(prompt_token_ids, sampling, self.vocab_size, self.max_model_len, "HFEngine")

    async def generate(self, prompt_token_ids: Sequence[int], sampling: Sampling) -> list[Generation]:
        """`sampling.n` samples continuing `prompt_token_ids` (list of int token ids).

        Runs in a worker thread; concurrent calls wait for each other (a lock). With
        `sampling.seed = s`, sample i is drawn with seed s + i (vLLM's rule).

        Raises:
            ValueError: empty prompt, ids outside the vocabulary, or prompt + max_tokens >
                max_model_len. RuntimeError: the engine was shut down.
        """
        ids = self._check(prompt_token_ids, sampling)
        seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(62)
        return await asyncio.to_thread(self._generate_sync, ids, sampling, seed)

    def _check_stop(self, row: _Row, prev_len: int, stops: tuple[str, ...]) -> None:
        """Set `row` finished if its text now contains a stop string ending in the new text."""
        best: tuple[int, str] | None = None
        for s in stops:
            # Earlier characters can change when a multi-byte character completes: look back.
            idx = row.text.find(s, max(0, prev_len - len(s) - 4))
            if idx >= 0 and (best is None or idx + len(s) < best[0] + len(best[1])):
                best = (idx, s)
        if best is not None:
            row.text = row.text[: best[0] + len(best[1])]
            row.finish_reason, row.stop_reason = "stop", best[1]

    def _generate_sync(self, ids: list[int], sampling: Sampling, seed: int) -> list[Generation]:
        import torch

        with self._lock, torch.inference_mode():
            if self.model is None:
                raise RuntimeError("HFEngine was shut down while this request waited")
            version = self.weight_version
            # Sample i uses seed + i, as vLLM does for the n samples of a seeded request.
            gens = [torch.Generator(device=self.device).manual_seed(seed + i) for i in range(sampling.n)]
            rows = [_Row() for _ in range(sampling.n)]
            # Prefill once (logits of the last position only: the vocabulary is 262k wide), then
            # copy the KV cache for the n samples.
            inputs = torch.tensor([ids], dtype=torch.long, device=self.device)
            out = self.model(input_ids=inputs, use_cache=True, logits_to_keep=1)
            past, logits = out.past_key_values, out.logits[:, -1, :].expand(sampling.n, -1)
            if sampling.n > 1:
                past.batch_repeat_interleave(sampling.n)
            for step in range(sampling.max_tokens):
                tokens, logprobs = process_logits(logits, sampling, gens)
                for row, tok, lp in zip(rows, tokens.tolist(), logprobs.tolist()):
                    if row.finish_reason is not None:
                        continue
                    row.tokens.append(tok)
                    row.logprobs.append(lp)
                    prev_len = len(row.text)
                    row.text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
                    if tok in self.eos_token_ids:
                        row.finish_reason, row.stop_reason = "stop", tok
                    elif sampling.stop:
                        self._check_stop(row, prev_len, sampling.stop)
                    if row.finish_reason is None and step == sampling.max_tokens - 1:
                        row.finish_reason = "length"
                if all(r.finish_reason is not None for r in rows):
                    break
                out = self.model(input_ids=tokens[:, None], past_key_values=past, use_cache=True, logits_to_keep=1)
                past, logits = out.past_key_values, out.logits[:, -1, :]
        return [Generation(token_ids=r.tokens, logprobs=r.logprobs, finish_reason=r.finish_reason or "length",
                           stop_reason=r.stop_reason, text=r.text,
                           meta={"weight_version": version, "prompt_tokens": len(ids), "seed": seed})
                for r in rows]

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Load new weights (Hugging Face names as in `model.state_dict()` -> tensors of the same
        shapes, any float dtype/device) with `load_state_dict(strict=False)` and set
        `weight_version`. Waits for the running request; later requests see the new weights.

        Raises:
            ValueError: empty input, or a name the model does not have, or a shape mismatch.
            TypeError: a value is not a torch.Tensor.
        """
        import torch

        named = list(named_tensors)
        if not named:
            raise ValueError("update_weights: named_tensors is empty; pass (name, tensor) pairs")
        params = self.model.state_dict()
        unknown = [n for n, _ in named if n not in params]
        if unknown:
            raise ValueError(f"update_weights: {len(unknown)} names are not parameters of {self.model_path}, "
                             f"e.g. {unknown[:3]}; pass Hugging Face names (model.named_parameters())")
        for name, t in named:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"update_weights: {name!r} is {type(t).__name__}, expected a torch.Tensor")
            if tuple(t.shape) != tuple(params[name].shape):
                raise ValueError(f"update_weights: {name!r} has shape {tuple(t.shape)}, the model's is "
                                 f"{tuple(params[name].shape)}")

        def load() -> None:
            """Load `named` into the model under the engine lock and set `weight_version` (worker thread)."""
            with self._lock, torch.no_grad():
                self.model.load_state_dict({n: t.detach() for n, t in named}, strict=False)
                self.weight_version = int(version)

        await asyncio.to_thread(load)

    async def shutdown(self) -> None:
        """Drop the model (frees its memory once no other reference holds it). Idempotent."""
        if self._closed:
            return
        self._closed = True

        def drop() -> None:
            """Release the model reference under the engine lock (worker thread)."""
            with self._lock:
                self.model = None

        await asyncio.to_thread(drop)
