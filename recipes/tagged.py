"""The search-tag / answer-tag loop that Search-R1, R1-Searcher, R-Search and Eval-RAR share.

A turn ends at the closing tag of a search or an answer; the first complete block of either (in
reading order) is the turn's action, as Search-R1's `postprocess_predictions` reads it. Each
method sets its tags, its observation wrapper and its reward.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from recipes.base import (
    Action,
    Answer,
    Doc,
    Episode,
    Invalid,
    Prompt,
    Recipe,
    RecipeConfig,
    Search,
    prefilled,
)
from recipes.expert import (
    CHECK_NEXT,
    ExpertQuery,
    after_prefix,
    docs_holding_answer,
    key_words_query,
    key_words_search,
    search_candidates,
)
from recipes.metrics import span_check
from recipes.search_metrics import shown_docs
from recipes.tags import clean, find_blocks

# One worked example of the loop (two searches, then the answer), written in each recipe's own tags.
# Not in the papers' prompts (s3 Fig. 11 has an "[An abstractive example of s3 loop]" slot); small
# untrained models close a search tag almost only with it (../shared/CPU-STACK.md, base rates).
EXAMPLE_QUESTION = "What is the capital of the country where the Eiffel Tower stands?"
EXAMPLE_STEPS = (
    ("I need the country of the Eiffel Tower first.", "Eiffel Tower country",
     Doc("ex-1", "Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.")),
    ("The tower is in France. Now I need the capital of France.", "capital of France",
     Doc("ex-2", "Paris", "Paris is the capital and largest city of France.")),
)
EXAMPLE_ANSWER = ("The capital of France is Paris.", "Paris")
# A second, one-search example (`worked_examples: 2`): the query is the question's own key words and the
# answer a short span, the two habits a small base model lacks most (README, base rates).
SECOND_EXAMPLE = (
    "Who wrote the novel War and Peace?",
    (("I need the author of War and Peace.", "War and Peace novel author",
      Doc("ex-3", "War and Peace", "War and Peace is a novel by the Russian author Leo Tolstoy, published in 1869.")),),
    ("War and Peace was written by Leo Tolstoy.", "Leo Tolstoy"),
)


def sentence_holding(text: str, answer: str, max_chars: int = 300) -> str:
    """The first sentence of `text` that holds `answer` as a token span (`span_check`), else the text's
    start; at most `max_chars` characters."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    hit = next((s for s in sentences if span_check(s, [answer])), text.strip())
    return hit[:max_chars]


class TaggedConfig(RecipeConfig):
    """Prompt options every search-tag recipe has, beside its paper's constants."""

    worked_example: bool = Field(
        False, description="Put one worked example of the whole loop, in this recipe's tags, before the question "
        "(not in the papers' prompts; small untrained models rarely search without it).")
    prefill: str = Field(
        "", description="Text the response is forced to start with, after the recipe's own prefix (e.g. '<search>'); "
        "it counts as policy text for format checks.")
    worked_examples: int = Field(
        1, ge=1, le=2, description="How many worked examples `worked_example` puts first: 1 (two searches) or 2 "
        "(then a one-search example whose query copies the question's key words and whose answer is a short span).")
    initial_search: bool = Field(
        False, description="Begin with search (s3 §3.1's loop start, here for any search-tag recipe): the question's "
        "top-k documents follow the question in the prompt, in this recipe's observation tags; the policy may search "
        "more or answer. Not in these papers' prompts.")
    force_answer: bool = Field(
        False, description="When the turn budget is spent or a turn closes neither a query nor an answer, open one "
        "last turn with the answer tag already written (loss mask 0) instead of ending without an answer. The "
        "episode records `answer_forced`; format rewards count it as a format error. Not in the papers.")
    forced_answer_tokens: int = Field(
        32, ge=1, description="Token budget of the forced answer turn (an answer is a short span).")
    answer_room: bool = Field(
        False, description="With `force_answer`: the agent loop keeps the answer tag's and `forced_answer_tokens` "
        "tokens free before `rollout.max_total_tokens`; a turn is cut short of them, and a search whose documents "
        "(or feedback) would eat into them is skipped and the answer opened instead, so no episode runs out of "
        "tokens before answering (22% of the key_words warm start's dev episodes did). False: the "
        "episode ends at the limit without an answer. Not in the papers.")
    expert_searches: Literal["when_needed", "question_first", "always", "verify", "key_words", "question"] = Field(
        "when_needed", description="When and how the warm start's expert (`train.warm_start.source: expert`) searches: "
        "`when_needed`, when the documents shown hold no gold answer, with a query checked to bring one into view; "
        "`question_first`, the question itself, verbatim, as the episode's first search wherever the documents shown "
        "hold no gold answer (unchecked: a policy copies it from the prompt; in the paper's loop, without "
        "`initial_search`, every demonstration starts with it), then as `when_needed`; "
        "`always`, also once before answering when they do (a query that brings a new gold-holding document when one "
        "exists, else its best candidate); `verify`, as `always`, but where the documents shown hold the answer its "
        "first turn names it ('Doc 2 says the answer is X.') before the check search, and after that search it "
        "answers with what it named, so its reason to search on is written after reading; `key_words`, a rule a "
        "policy can follow without knowing the answer: its first search is always the question's key words, and "
        "while no document shown holds a gold answer it searches them again (with `fresh_docs`, the next "
        "documents; without, it never repeats a search), then answers from the document that holds one; "
        "`question`, the expert "
        "that never searched: its one query is the question itself (under `initial_search` it repeats the top-k, so it "
        "never finds anything and never searches). "
        "Not in the papers.")

    @model_validator(mode="after")
    def _answer_room_needs_force_answer(self) -> "TaggedConfig":
        if self.answer_room and not self.force_answer:
            raise ValueError("answer_room keeps room for a forced answer: set force_answer: true as well, or "
                             "answer_room: false")
        return self


class TaggedSearchRecipe(Recipe):
    """A recipe whose actions are `search_tags` (query) and `answer_tags` (final answer) blocks."""

    search_tags: ClassVar[tuple[str, str]] = ("<search>", "</search>")
    answer_tags: ClassVar[tuple[str, str]] = ("<answer>", "</answer>")
    observation_tags: ClassVar[tuple[str, str]] = ("<information>", "</information>")
    think_tags: ClassVar[tuple[str, str] | None] = ("<think>", "</think>")  # None: free reasoning (R-Search)
    instruction: ClassVar[str] = ""  # one user message with a {question} slot (Search-R1, Eval-RAR)
    config_cls: ClassVar[type[RecipeConfig]] = TaggedConfig

    def __init__(self, config=None, **overrides):
        super().__init__(config, **overrides)
        self.initial_search = self.config.initial_search  # the rollout fetches the question's top-k first

    def build_prompt(self, question: str, initial_docs: Sequence[Doc], chat: bool) -> Prompt:
        """The `instruction` with the question filled in, as one user message (or plain text); the
        worked example, when on, comes first."""
        text = self.example_block() + self.instruction.format(question=self.question_block(question, initial_docs))
        return self.with_prefill(Prompt(({"role": "user", "content": text},), text, chat))

    # -- prompt options (TaggedConfig) ------------------------------------------------------
    def example_step_extra(self, step: int) -> str:
        """Text a recipe's loop requires after observation `step` of the example (Eval-RAR: an evaluation)."""
        return ""

    def example_before_answer(self) -> str:
        """Text a recipe's loop requires before the answer (R-Search: the evidence block)."""
        return ""

    def example_block(self) -> str:
        """`Example:` + `worked_examples` worked loops in this recipe's tags + a blank line, or "" when
        `worked_example` is off."""
        if not self.config.worked_example:
            return ""
        examples = ((EXAMPLE_QUESTION, EXAMPLE_STEPS, EXAMPLE_ANSWER), SECOND_EXAMPLE)[: self.config.worked_examples]
        return "".join(self.worked_loop(*ex) for ex in examples)

    def worked_loop(self, question: str, steps: Sequence[tuple[str, str, Doc]], answer: tuple[str, str]) -> str:
        """One worked example: the question, then (thought, query, document) steps, then the answer."""

        think = self._think
        parts = [f"Example:\nQuestion: {question}\n"]
        for i, (thought, query, doc) in enumerate(steps):
            parts.append(think(thought) + f"{self.search_tags[0]} {query} {self.search_tags[1]}")
            parts.append(self.observation_text([doc]) + self.example_step_extra(i))
        reason, short = answer
        parts.append(think(reason) + self.example_before_answer() + f"{self.answer_tags[0]} {short} {self.answer_tags[1]}")
        return "".join(parts).strip() + "\n\n"

    def question_block(self, question: str, initial_docs: Sequence[Doc]) -> str:
        """The question, followed with `initial_search` by its top-k documents in this recipe's
        observation tags (s3 §3.1: the searcher starts from the RAG documents)."""
        if not (self.config.initial_search and initial_docs):
            return question
        return f"{question}\n{self.observation_text(initial_docs).strip()}\n"

    def with_prefill(self, prompt: Prompt) -> Prompt:
        """`prompt` with `prefill` appended to the forced response prefix (and to the completion text)."""
        return prefilled(prompt, self.config.prefill)

    def reserved_answer(self) -> tuple[str, int] | None:
        """The forced answer's opener and `forced_answer_tokens` when `force_answer` and `answer_room`, else None."""
        prefix = self.forced_answer_prefix()
        return (prefix, self.config.forced_answer_tokens) if prefix is not None and self.config.answer_room else None

    def forced_answer_prefix(self) -> str | None:
        """`"\\n<answer>"` (this recipe's answer tag) when `force_answer` is on, else None."""
        return f"\n{self.answer_tags[0]}" if self.config.force_answer else None

    def parse_forced_answer(self, turn_text: str) -> Action:
        """The forced turn's answer: its text up to the closing answer tag (or all of it when the token
        budget cut it), tags removed, first non-empty line (as the naive-RAG baseline reads its
        generator), cleaned; an empty answer is still an answer (it scores 0)."""
        text = re.sub(r"</?[A-Za-z|_][^<>\n]{0,40}>", " ", turn_text.split(self.answer_tags[1], 1)[0])
        line = next((ln for ln in text.splitlines() if ln.strip()), "")
        return Answer(clean(" ".join(line.split())))

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
        if kind == "answer":  # an empty answer is still the answer: the episode ends and scores 0 (Search-R1)
            return Answer(content)
        return Search(content) if content else Invalid("empty search")

    # -- expert demonstrations (train.warm_start.source: expert) -------------------------------
    def expert_evaluation(self, holding: tuple[int, str] | None, first_documents: bool = False) -> str:
        """Text a recipe's loop requires after an observation, before the expert's next action (Eval-RAR: an
        evaluation after every search, Algorithm 1): `holding` is (1-based position, gold answer) of the document
        the expert answers from, or None when it searches on (the documents do not answer yet);
        `first_documents`: that position is among the documents shown first (the initial top-k), not the latest."""
        return ""

    def expert_before_answer(self, evidence: str) -> str:
        """Text a recipe's loop requires before the answer, given the sentence that holds it (R-Search: evidence)."""
        return ""

    def _expert_blocks(self, episode: Episode) -> tuple[list[Doc], list[Doc]] | None:
        """(the latest observation's documents, every document shown so far) where the expert has a turn to write:
        at the start (the initial top-k with `initial_search`, else none) or right after a search; else None."""
        last = episode.turns[-1] if episode.turns else None
        if last is None:
            latest = list(episode.initial_docs) if self.config.initial_search else []
        elif isinstance(last.action, Search) and last.docs is not None:
            latest = list(last.docs)
        else:
            return None
        return latest, shown_docs(episode)

    def expert_queries(self, episode: Episode) -> list[ExpertQuery]:
        """`recipes.expert.search_candidates` when the documents shown hold no gold answer and a search is still
        allowed (`max_turns`); with `expert_searches: always`, also before the first search of the episode when
        they do: then one query, the question's key words, kept whatever it brings (`checked=False`: a check
        search), and the same query first where nothing was shown yet (no `initial_search`); with `expert_searches:
        key_words`, the question's key words first and again while nothing shown holds the answer (`fresh_docs`);
        with `expert_searches: question`, the question itself at the first turn only; with `question_first`, the
        question itself, unchecked, before the episode's first search, then as `when_needed`."""
        blocks = self._expert_blocks(episode)
        if blocks is None or episode.num_steps >= self.config.max_turns:
            return []
        latest, shown = blocks
        holding = docs_holding_answer(shown, episode.golden_answers)
        held = bool(holding)
        always = self._searches_first(episode)
        if held and not always:
            return []
        if self.config.expert_searches == "question":
            return [] if held or episode.turns else [ExpertQuery(episode.question, "I need to search for the answer.")]
        if self.config.expert_searches == "question_first" and not episode.num_searches:
            # The first query a policy can always write: the question's own BM25 top-k is the best first look
            # (key words as the first query lost half of it).
            return [ExpertQuery(episode.question, "I need to search for the answer.", checked=False)]
        if self.config.expert_searches == "key_words":  # the same query every time: no choice that needs the answer
            if episode.num_searches and not self.config.fresh_docs:  # (held after a search: returned above)
                return []
            return [key_words_search(episode)]
        if always and not shown:  # the first search of a loop without initial_search: words a policy can copy
            words = key_words_query(episode.question)
            return [ExpertQuery(words, "I need to search for the answer.", checked=False)]
        if held:
            # A check search: the question's key words, which a policy can copy. The first candidate that happened
            # to bring another gold-holding document (an entity of some shown document) taught arbitrary queries.
            words = key_words_query(episode.question)
            if self.config.expert_searches == "verify":  # the reason reads the documents before it searches on
                position, gold = holding[0]
                return [ExpertQuery(words, f"Doc {position} says the answer is {gold}. {CHECK_NEXT}", checked=False)]
            return [ExpertQuery(words, "Let me check the answer with one more search.", checked=False)]
        return search_candidates(episode.question, latest, shown, episode.meta.get("supporting_titles") or ())

    def expert_turn(self, episode: Episode, query: ExpertQuery | None = None) -> str | None:
        """The expert searcher-answerer: search with `query` (the agent loop checked it brings a gold answer into
        view; `expert_queries`) when the documents shown hold none, or when `expert_searches: always` and it has
        not searched yet; otherwise answer with the gold answer that the latest documents hold, citing it (or,
        after a search that found nothing new, the earlier document that holds it). Its reasoning goes in this
        recipe's think tags (free text for R-Search), as the worked example's does. No query where one is
        needed, or nothing to answer from: None."""
        blocks = self._expert_blocks(episode)
        if blocks is None:
            return None
        latest, shown = blocks
        last = episode.turns[-1] if episode.turns else None
        found = docs_holding_answer(latest, episode.golden_answers)
        earlier = docs_holding_answer(shown, episode.golden_answers)
        always = self._searches_first(episode)
        named = self._named_before_check(episode)
        after_search = last is not None  # an observation just came: a recipe may evaluate it first (Eval-RAR)
        if query is not None and (not earlier or always):
            lead = (self.expert_evaluation(None) if after_search else "") + self._think(query.reason)
            action = f"{self.search_tags[0]} {query.query} {self.search_tags[1]}"
        elif named:  # `verify` after its check search: the answer its first turn named, whatever the search brought
            position, gold = named[0]
            lead = self.expert_evaluation(named[0], first_documents=True) + self._think(f"So the answer is {gold}.")
            lead += self.expert_before_answer(sentence_holding(episode.initial_docs[position - 1].text, gold))
            action = f"{self.answer_tags[0]} {gold} {self.answer_tags[1]}"
        elif found:
            position, gold = found[0]
            lead = self.expert_evaluation(found[0]) if after_search else ""
            lead += self._think(f"Doc {position} says the answer is {gold}.")
            lead += self.expert_before_answer(sentence_holding(latest[position - 1].text, gold))
            action = f"{self.answer_tags[0]} {gold} {self.answer_tags[1]}"
        elif earlier and last is not None:  # the search found nothing new: answer from the first documents
            position, gold = earlier[0]
            lead = self.expert_evaluation(earlier[0], first_documents=True)
            lead += self._think(f"The search found nothing new. Doc {position} of the first documents says the "
                                f"answer is {gold}.")
            lead += self.expert_before_answer(sentence_holding(shown[position - 1].text, gold))
            action = f"{self.answer_tags[0]} {gold} {self.answer_tags[1]}"
        else:
            return None
        text = after_prefix(episode, lead + action)
        prefill = self.config.prefill
        if text is None and last is None and prefill and action.startswith(prefill):
            text = action[len(prefill):]  # the prefill opens the action itself: no room for reasoning first
        return text

    def _searches_first(self, episode: Episode) -> bool:
        """The expert searches at this turn even where the documents shown hold a gold answer: `expert_searches`
        `always`, `verify` or `key_words`, before the episode's first search."""
        return self.config.expert_searches in ("always", "verify", "key_words") and episode.num_searches == 0

    def _named_before_check(self, episode: Episode) -> list[tuple[int, str]]:
        """With `expert_searches: verify`, right after the episode's one search, when the initial top-k held a gold
        answer (so that search was the check and the first turn named the answer): `docs_holding_answer` of the
        initial documents; else []."""
        if (self.config.expert_searches != "verify" or episode.num_searches != 1
                or not isinstance(episode.turns[-1].action, Search)):
            return []  # (no initial top-k, no `initial_search`: nothing below holds a gold answer)
        return docs_holding_answer(list(episode.initial_docs), episode.golden_answers)

    def _think(self, text: str) -> str:
        return f"{self.think_tags[0]} {text} {self.think_tags[1]}\n" if self.think_tags else f"{text}\n"

    def observation_text(self, docs: Sequence[Doc]) -> str:
        """`\\n\\n<information>Doc 1(Title: "...") text\\n…</information>\\n\\n` with this recipe's tags."""
        open_tag, close_tag = self.observation_tags
        return f"\n\n{open_tag}{self.format_docs(docs)}{close_tag}\n\n"
