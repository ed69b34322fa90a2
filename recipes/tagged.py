"""The search-tag / answer-tag loop that Search-R1, R1-Searcher, R-Search and Eval-RAR share.

A turn ends at the closing tag of a search or an answer; the first complete block of either (in
reading order) is the turn's action, as Search-R1's `postprocess_predictions` reads it. Each
method sets its tags, its observation wrapper and its reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from recipes.base import Action, Answer, Doc, Invalid, Prompt, Recipe, Search
from recipes.tags import clean, find_blocks


class TaggedSearchRecipe(Recipe):
    """A recipe whose actions are `search_tags` (query) and `answer_tags` (final answer) blocks."""

    search_tags: ClassVar[tuple[str, str]] = ("<search>", "</search>")
    answer_tags: ClassVar[tuple[str, str]] = ("<answer>", "</answer>")
    observation_tags: ClassVar[tuple[str, str]] = ("<information>", "</information>")
    instruction: ClassVar[str] = ""  # one user message with a {question} slot (Search-R1, Eval-RAR)

    def build_prompt(self, question: str, initial_docs: Sequence[Doc], chat: bool) -> Prompt:
        """The `instruction` with the question filled in, as one user message (or plain text)."""
        text = self.instruction.format(question=question)
        return Prompt(({"role": "user", "content": text},), text, chat)

    @classmethod
    def default_stop_strings(cls) -> tuple[str, ...]:
        return (cls.search_tags[1], cls.answer_tags[1])

    def parse(self, turn_text: str) -> Action:
        """`Search(query)` or `Answer(text)` from the first complete block; `Invalid` otherwise."""
        candidates = [(b.end, "search", b) for b in find_blocks(turn_text, *self.search_tags)[:1]]
        candidates += [(b.end, "answer", b) for b in find_blocks(turn_text, *self.answer_tags)[:1]]
        if not candidates:
            return Invalid(f"no complete {self.search_tags[0]} or {self.answer_tags[0]} block")
        _, kind, block = min(candidates, key=lambda c: c[0])
        content = clean(block.content)
        if not content:
            return Invalid(f"empty {kind}")
        return Search(content) if kind == "search" else Answer(content)

    def observation_text(self, docs: Sequence[Doc]) -> str:
        """`\\n\\n<information>Doc 1(Title: "...") text\\n…</information>\\n\\n` with this recipe's tags."""
        open_tag, close_tag = self.observation_tags
        return f"\n\n{open_tag}{self.format_docs(docs)}{close_tag}\n\n"
