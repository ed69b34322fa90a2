"""Search-R1 (Jin et al., 2025): the common baseline of all four papers.

`<think>` reasoning, `<search>query</search>` → `<information>` documents, `<answer>` final answer;
reward = exact match of the answer (outcome-only). Prompt, observation format and invalid-action
feedback follow the public Search-R1 code; top-k 3 and 4 turns as s3 Appendix A.1 aligns them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from recipes.base import Episode, RewardBreakdown, Scorer
from recipes.metrics import exact_match, f1_score
from recipes.search_metrics import search_record
from recipes.tagged import TaggedConfig, TaggedSearchRecipe

INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)

FEEDBACK = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


class SearchR1Config(TaggedConfig):
    """Search-R1 constants."""

    topk: int = Field(3, ge=1, description="Documents per search (Search-R1: 3).")
    max_turns: int = Field(4, ge=0, description="Search/invalid steps before the last turn (s3 App. A.1: 4).")
    invalid_feedback: str | None = Field(FEEDBACK, description="Appended after an invalid action.")
    reward_metric: Literal["em", "f1"] = Field(
        "em", description="Outcome reward: exact match (the paper) or token F1 (partial credit: a denser signal for "
        "small policies whose answers are rarely exact).")
    format_penalty: float = Field(
        0.0, le=0, description="Added when the episode's format is wrong; the one format error read is a forced answer "
        "(`force_answer`: the loop, not the policy, wrote the answer tag). 0 = the paper's outcome-only reward.")
    found_reward: float = Field(
        0.0, ge=0, description="Added once when a search of the policy's own returned a document, not among the "
        "initial top-k, that holds a gold answer (`recipes.search_metrics.SearchRecord.found_by_search`): pays for "
        "finding, not for searching (after StepSearch's information gain). 0 = the paper's reward.")
    outcome_weight: float = Field(
        1.0, ge=0, description="Weight of the outcome component (EM or F1). 0 with `found_reward` > 0 = a recall "
        "stage that pays only for finding (DeSA's first stage), e.g. before an EM stage in `train.stages`.")


class SearchR1(TaggedSearchRecipe):
    """Search-R1: think / search / information / answer; EM reward in {0, 1}."""

    name = "search_r1"
    config_cls = SearchR1Config
    stop_strings = TaggedSearchRecipe.default_stop_strings()
    instruction = INSTRUCTION

    def reward(self, episode: Episode, scorer: Scorer | None = None) -> RewardBreakdown:
        """Components: `em` (1 if the `<answer>` equals a gold answer after normalization), or with
        `reward_metric="f1"` `f1` (token F1 against the best gold answer), times `outcome_weight`; with
        `format_penalty` < 0 also `format` (the penalty for a forced answer, else 0); with `found_reward` > 0 also
        `found` (`found_reward` when the policy's own search found a gold-holding document beyond the initial
        top-k, else 0). Total ∈ [format_penalty, outcome_weight + found_reward]; no answer scores 0 on the outcome."""
        final = episode.final or self.final_output(episode)
        metric = exact_match if self.config.reward_metric == "em" else f1_score
        score = metric(final.answer, list(episode.golden_answers)) if final.answer is not None else 0.0
        parts = {self.config.reward_metric: self.config.outcome_weight * score}
        if self.config.format_penalty:
            parts["format"] = self.config.format_penalty if episode.answer_forced else 0.0
        if self.config.found_reward:
            parts["found"] = self.config.found_reward if search_record(episode).found_by_search else 0.0
        return RewardBreakdown(sum(parts.values()), parts)
