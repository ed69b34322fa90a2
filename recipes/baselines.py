"""Baselines with one generation turn: direct inference and naive RAG.

- `direct`: the model answers from its own knowledge.
- `naive_rag`: top-k documents for the question, then one answer with the answer-generation prompt
  of s3 Fig. 12 (the RAG-BM25 / RAG-E5 baselines of s3 §4.1, k = 3).

The answer is the first non-empty line of the generation. Reward = the configured metric (EM by
default; F1, cover-EM or GenAcc), so the baselines score like the method they are compared with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from recipes.base import (
    ANSWER_PROMPT,
    Action,
    Answer,
    Doc,
    Episode,
    Invalid,
    Prompt,
    Recipe,
    RecipeConfig,
    RewardBreakdown,
    Scorer,
    require_scorer,
    strip_answer_cue,
)
from recipes.metrics import cover_exact_match, exact_match, f1_score, gen_acc

DIRECT_PROMPT = "Question: {question}\nImportant: You MUST directly answer the question without any other text."


class BaselineConfig(RecipeConfig):
    """Baseline constants."""

    topk: int = Field(3, ge=1, description="Documents for naive RAG (s3 §4.1: k = 3).")
    max_turns: int = Field(0, ge=0, description="No search turns.")
    metric: Literal["em", "f1", "cover_em", "gen_acc"] = Field("em", description="Reward metric.")


class _SingleTurn(Recipe):
    config_cls = BaselineConfig
    trainable = False  # direct inference is an evaluation baseline: nothing to train
    stop_strings = ("\n\n", "\nQuestion:")

    def _prompt(self, text: str, chat: bool) -> Prompt:
        # Base models get an "Answer:" cue so the completion is the answer itself.
        return Prompt(({"role": "user", "content": text},), f"{text}\nAnswer:", chat)

    def parse(self, turn_text: str) -> Action:
        """`Answer(first non-empty line)`, or `Invalid` for an empty generation."""
        line = strip_answer_cue(next((ln.strip() for ln in turn_text.splitlines() if ln.strip()), ""))
        return Answer(line) if line else Invalid("empty answer")

    def observation_text(self, docs: Sequence[Doc]) -> str:
        return ""  # never searches after the prompt

    def reward(self, episode: Episode, scorer: Scorer | None = None) -> RewardBreakdown:
        """The configured metric of the answer against the gold answers, in [0, 1].

        Raises:
            ScorerRequiredError: metric "gen_acc" without a scorer (its judge is needed).
        """
        golds = list(episode.golden_answers)
        answer = (episode.final or self.final_output(episode)).answer
        metric = self.config.metric
        if answer is None:
            value = 0.0
        elif metric == "gen_acc":
            value = gen_acc(answer, golds, require_scorer(scorer, f"{self.name} (metric gen_acc)").judge)
        else:
            value = {"em": exact_match, "f1": f1_score, "cover_em": cover_exact_match}[metric](answer, golds)
        return RewardBreakdown(value, {metric: value})


class Direct(_SingleTurn):
    """Direct inference: no retrieval."""

    name = "direct"
    retrieves = False

    def build_prompt(self, question: str, initial_docs: Sequence[Doc], chat: bool) -> Prompt:
        return self._prompt(DIRECT_PROMPT.format(question=question), chat)


class NaiveRAG(_SingleTurn):
    """Naive RAG: top-k documents for the question in the s3 Fig. 12 prompt."""

    name = "naive_rag"
    initial_search = True
    trainable = True  # RL on a single-turn RAG answerer: scripts.bench.peer's single-turn workload
    def build_prompt(self, question: str, initial_docs: Sequence[Doc], chat: bool) -> Prompt:
        return self._prompt(ANSWER_PROMPT.format(context=self.format_docs(initial_docs), question=question), chat)

    def generator_context(self, episode: Episode) -> list[Doc]:
        """The question's top-k: the generator reads them all."""
        return list(episode.initial_docs)
