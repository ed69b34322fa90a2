"""The token-level record of one episode, as the learner consumes it and as JSONL stores it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from recipes.base import Episode


@dataclass
class TurnRecord:
    """One generation turn: its text, action, query, retrieved doc ids, token counts and latency (s)."""

    text: str
    action: str
    query: str | None
    doc_ids: list[str]
    generated_tokens: int
    observation_tokens: int
    finish_reason: str
    generate_s: float
    search_s: float
    weight_version: int = 0      # the engine's weights when the turn's request started
    weight_version_end: int = 0  # ... and when it ended: different when weights changed in flight


@dataclass
class Trajectory:
    """One rollout sample.

    Token fields (all lists of int/float, aligned with `response_ids`, length L):
    - `response_ids`: engine-generated ids and tokenized observations/feedback, in order;
    - `loss_mask`: 1 for policy tokens, 0 for environment tokens (observations, feedback);
    - `logprobs`: log-prob of each policy token under the sampling policy; 0.0 for environment tokens;
    - `token_versions`: the policy version whose weights began sampling each policy token (the version
      when its turn's request started: the oldest weights that can have sampled it; a turn whose request
      spanned an in-flight weight update has later tokens from newer weights); environment tokens carry
      the version of the turn before them.
    `prompt_ids` precede them. `finish_reason` is the episode's stop reason ("answer", "complete",
    "max_turns", "invalid", "max_total_tokens"). `group_id` is unique across datasets (GRPO groups).
    """

    group_id: str
    qid: str
    sample_index: int
    question: str
    golden_answers: list[str]
    recipe: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = ""
    weight_version: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    reward: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    episode: Episode | None = field(default=None, repr=False, compare=False)

    def append(self, token_ids: list[int], policy: bool, logprobs: list[float] | None = None,
               version: int | None = None) -> None:
        """Append policy tokens (mask 1, with their logprobs, sampled from policy `version`; default the
        episode's starting `weight_version`) or environment tokens (mask 0, the previous token's version)."""
        self.response_ids.extend(token_ids)
        self.loss_mask.extend([int(policy)] * len(token_ids))
        self.logprobs.extend(logprobs if policy and logprobs is not None else [0.0] * len(token_ids))
        if version is None:
            version = self.token_versions[-1] if self.token_versions else self.weight_version
        self.token_versions.extend([int(version)] * len(token_ids))

    @property
    def num_tokens(self) -> int:
        """Prompt plus response length (tokens)."""
        return len(self.prompt_ids) + len(self.response_ids)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (no Episode object)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "episode"}
        out["turns"] = [asdict(t) for t in self.turns]
        return out
