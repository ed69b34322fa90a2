"""R1-Searcher (seed 001): two-stage outcome RL for search.

`<think>`/`<answer>` with `<|begin_of_query|>…<|end_of_query|>` queries; documents come back in
`<|begin_of_documents|>…<|end_of_documents|>` and are masked from the loss (§2.2.2). Generation
stops at `<|end_of_query|>` (RAG-based rollout) and `</answer>`; a turn with neither ends the
episode (no feedback). The base-model prompt is the system prompt of §2.2.2 followed by
`User:{question}\\nAssistant: <think>`.

Rewards (§2.2.1):
- stage 1 = retrieval reward (0.5 if at least one retrieval, Eq. 1) + format reward (0.5 if the
  format is correct, Eq. 2); the released code's extra ±1 cover-EM answer term is an option, off;
- stage 2 = answer reward (F1, Eq. 4) + format penalty (0 if correct, −2 if not, Eq. 3).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from recipes.base import Doc, Episode, Prompt, RewardBreakdown, Scorer
from recipes.metrics import cover_exact_match, f1_score
from recipes.tagged import TaggedConfig, TaggedSearchRecipe
from recipes.tags import find_blocks

SYSTEM = (
    "The User asks a question, and the Assistant solves it. The Assistant first thinks about the reasoning process "
    "in the mind and then provides the User with the final answer. The output format of reasoning process and "
    "final answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    '"<think> reasoning process here </think><answer> final answer here </answer>". During the thinking process, '
    "**the Assistant can perform searching** for uncertain knowledge if necessary with the format of "
    '"<|begin_of_query|> search query (only list keywords, such as "keyword_1 keyword_2 ...")<|end_of_query|>". '
    "**A query must involve only a single triple**. Then, the search system will provide the Assistant with the "
    'retrieval information with the format of "<|begin_of_documents|> ...search results... <|end_of_documents|>".'
)

SELECTION_SYSTEM = (
    "You are a helpful assistant. Given a question, you should answer it by first thinking about the reasoning "
    "process in the mind and then providing the final answer. The output format of reasoning process and final "
    "answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., \"<think> reasoning "
    "process here </think><answer> final answer here </answer>\". You should perform thinking with decomposing, "
    "reflecting, brainstorming, verifying, refining, and revising. Besides, you can perform searching for uncertain "
    "knowledge if necessary with the format of \"<|begin_of_query|> search query (only keywords) here "
    "<|end_of_query|>\". Then, the search system will provide you with the retrieval information with the format of "
    "\"<|begin_of_documents|> ...search results... <|end_of_documents|>\"."
)
"""§2.1 "System Prompt for Data Selection", given to Qwen-2.5-7B-Instruct to bucket questions by difficulty
(the paper's text carries a stray `\"\"\"` after `<|end_of_query|>"`, a string delimiter of its code: left out)."""

RETRIEVAL_REWARD = 0.5
"""Stage 1 reward for at least one retrieval (Eq. 1)."""
FORMAT_REWARD = 0.5
"""Stage 1 reward for a correct format (Eq. 2)."""

QUERY_TAGS = ("<|begin_of_query|>", "<|end_of_query|>")
DOCUMENT_TAGS = ("<|begin_of_documents|>", "<|end_of_documents|>")


class R1SearcherConfig(TaggedConfig):
    """R1-Searcher constants (§2.2.1, §3.3)."""

    stage: Literal[1, 2] = Field(2, description="Reward stage: 1 = retrieval + format, 2 = F1 + format penalty.")
    topk: int = Field(3, ge=1, description="Documents per query (not stated in the paper; Search-R1's 3).")
    max_turns: int = Field(8, ge=0, description="Maximum retrieval count (§3.3: 8).")
    format_penalty: float = Field(-2.0, description="Stage 2 reward for an incorrect format (Eq. 3).")
    stage1_answer_reward: bool = Field(
        False, description="Released code's stage-1 extra: +1 if cover-EM, −1 otherwise (not in the paper)."
    )
    f1_yes_no_rule: bool = Field(
        False, description="Stage-2 F1 with HotpotQA's yes/no rule (FlashRAG's F1); Eq. 4 has none.",
    )
    prompt: Literal["rl", "data_selection"] = Field(
        "rl", description="System prompt: 'rl' = §2.2.2's (training, evaluation); 'data_selection' = §2.1's, "
        "for the difficulty selection (pipelines/prepare/r1_difficulty.py).",
    )


def format_errors(response_text: str, generated_text: str) -> list[str]:
    """Which format rules of R1-Searcher §2.2.1 an episode breaks (empty list = correct format).

    Args:
        response_text: the whole response: generated turns with the inserted documents.
        generated_text: only what the policy generated.

    Rules: (1) reasoning in `<think>…</think>`, exactly one `<answer>…</answer>` after it holding a
    short answer only (no tags, non-empty); (2) no garbled text (U+FFFD or control characters);
    (3) every query in `<|begin_of_query|>…<|end_of_query|>` and no documents written by the
    model itself (documents without retrieval).
    """
    errors: list[str] = []
    thinks = find_blocks(response_text, "<think>", "</think>")
    answers = find_blocks(response_text, "<answer>", "</answer>")
    if not thinks:
        errors.append("no <think>…</think> block")
    if response_text.count("<think>") != response_text.count("</think>"):
        errors.append("unbalanced <think> tags")
    if len(answers) != 1 or response_text.count("<answer>") != 1:
        errors.append("not exactly one <answer>…</answer> block")
    else:
        answer = answers[0]
        if not answer.content.strip() or "<" in answer.content:
            errors.append("answer is empty or holds tags")
        if thinks and thinks[-1].end > answer.start:
            errors.append("<answer> before the end of thinking")
        if response_text[answer.end :].strip():
            errors.append("text after </answer>")
    if any(ch == "\ufffd" or (unicodedata.category(ch) == "Cc" and ch not in "\n\r\t") for ch in generated_text):
        errors.append("garbled text")
    if generated_text.count(QUERY_TAGS[0]) != generated_text.count(QUERY_TAGS[1]):
        errors.append("unclosed query")
    if DOCUMENT_TAGS[0] in generated_text or DOCUMENT_TAGS[1] in generated_text:
        errors.append("documents written without retrieval")
    return errors


class R1Searcher(TaggedSearchRecipe):
    """R1-Searcher: think / begin_of_query / begin_of_documents / answer; two-stage reward."""

    name = "r1_searcher"
    config_cls = R1SearcherConfig
    search_tags = QUERY_TAGS
    observation_tags = DOCUMENT_TAGS
    stop_strings = (QUERY_TAGS[1], "</answer>")

    def build_prompt(self, question: str, initial_docs: Sequence[Doc], chat: bool) -> Prompt:
        """§2.2.2's system prompt (§2.1's with `prompt="data_selection"`), then the question (the worked
        example, when on, between them)."""
        base = SELECTION_SYSTEM if self.config.prompt == "data_selection" else SYSTEM
        system = f"{base}\n\n{self.example_block()}".strip()
        question = self.question_block(question, initial_docs)
        messages = ({"role": "system", "content": system}, {"role": "user", "content": question})
        if chat:
            return self.with_prefill(Prompt(messages, "", chat=True))
        completion = f"{system}\n\nUser:{question}\nAssistant: <think>"
        return self.with_prefill(Prompt(messages, completion, chat=False, response_prefix="<think>"))

    def observation_text(self, docs: Sequence[Doc]) -> str:
        return f"\n\n{DOCUMENT_TAGS[0]}\n{self.format_docs(docs)}\n{DOCUMENT_TAGS[1]}\n\n"

    def reward(self, episode: Episode, scorer: Scorer | None = None) -> RewardBreakdown:
        """Stage 1 in {0, 0.5, 1} (± 1 with the code's answer term); stage 2 in [−2, 1].

        Components: `retrieval` (Eq. 1), `format` (Eq. 2 or Eq. 3), `answer_f1` (Eq. 4, stage 2),
        `answer_cover_em` (stage 1 option).
        """
        c = self.config
        golds = list(episode.golden_answers)
        answer = (episode.final or self.final_output(episode)).answer
        # A forced answer (`force_answer`) is a format error: the loop, not the policy, wrote its tag.
        format_ok = not episode.answer_forced and not format_errors(episode.response_text, episode.generated_text)
        if c.stage == 1:
            parts = {
                "retrieval": RETRIEVAL_REWARD if episode.num_searches >= 1 else 0.0,
                "format": FORMAT_REWARD if format_ok else 0.0,
            }
            if c.stage1_answer_reward:
                hit = answer is not None and cover_exact_match(answer, golds) > 0
                parts["answer_cover_em"] = 1.0 if hit else -1.0
        else:
            parts = {
                "answer_f1": f1_score(answer, golds, c.f1_yes_no_rule) if answer is not None else 0.0,
                "format": 0.0 if format_ok else c.format_penalty,
            }
        return RewardBreakdown(sum(parts.values()), parts)
