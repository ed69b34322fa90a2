"""The frozen LLMs a reward may need (`Scorer`), injected so rewards run with a scripted scorer in tests and
with LLM actors in training; `recipes.base` re-exports these names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


ANSWER_PROMPT = (
    "Use the following contexts (some might be irrelevant) on demand:\n"
    "Contexts: {context}\n"
    "Question: {question}\n"
    "Important: You MUST directly answer the question without any other text."
)
"""Answer generation from a context by a frozen LLM (s3 Fig. 12); also the naive-RAG prompt."""


class Scorer(Protocol):
    """Frozen LLMs a reward may need; injected so rewards run with a scripted scorer in tests and
    with LLM actors in training.

    `generate_answer` fills `template` (placeholders `{question}`, `{context}`) and returns the
    frozen generator's answer; `judge` is s3's judge_check (Fig. 13): does the response contain a
    gold answer?
    """

    def generate_answer(self, question: str, context: str, template: str = ANSWER_PROMPT) -> str: ...

    def judge(self, response: str, golden_answers: Sequence[str]) -> bool: ...


class ScorerRequiredError(ValueError):
    """A reward needs a frozen LLM and no scorer was given."""


def require_scorer(scorer: Scorer | None, recipe: str) -> Scorer:
    """Return the scorer or raise `ScorerRequiredError` naming the recipe."""
    if scorer is None:
        raise ScorerRequiredError(f"recipe {recipe!r} computes its reward with a frozen LLM: pass scorer=")
    return scorer
