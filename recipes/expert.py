"""Helpers of the rule-based experts (`Recipe.expert_turn`, the warm start's demonstrations): which shown
documents hold a gold answer, and a turn's text without the prompt's forced response prefix."""

from __future__ import annotations

from typing import Sequence

from recipes.base import Doc, Episode


def docs_holding_answer(docs: Sequence[Doc], golden_answers: Sequence[str]) -> list[tuple[int, str]]:
    """(1-based position, the first gold answer it holds) of each document whose title or text holds a gold
    answer as a token span (`recipes.metrics.span_check`, s3 Eq. 3's span check applied to a document)."""
    from recipes.metrics import span_check

    out = []
    for i, doc in enumerate(docs, 1):
        text = f"{doc.title} {doc.text}"
        gold = next((g for g in golden_answers if span_check(text, [g])), None)
        if gold is not None:
            out.append((i, gold))
    return out


def after_prefix(episode: Episode, text: str) -> str | None:
    """`text` as the policy's turn: on the first turn, without the prompt's forced response prefix (None when
    `text` does not begin with it); later turns unchanged."""
    prefix = episode.prompt.response_prefix
    if episode.turns or not prefix:
        return text
    return text[len(prefix):] if text.startswith(prefix) else None
