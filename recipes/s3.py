"""s3 (seed 000): train only the searcher; a frozen generator answers from what it selected.

Loop (§3.1, searcher prompt of Fig. 11): begin with search (q0 = the question, top-k documents
in the prompt), then turns of `<query>` (JSON `{"query": ...}`; raw text accepted) →
`<information>` → `<important_info>[ids]` (≤ 3 ids of the current block) →
`<search_complete>True/False</search_complete>`, until complete or the turn limit.

Generation stops at `</query>` and `</search_complete>`. A turn ending in
`<search_complete>False</search_complete>` with no query is a `Select`: nothing is inserted and
the searcher goes on to write its query. A turn may carry a selection together with its query.

Final context (Appendix A.5): an `<important_info>` applies to the most recent information block;
a block without one contributes all its documents; documents are deduplicated by content and
keep their original order. Reward = Gain Beyond RAG (Eq. 1): GenAcc of the frozen generator's
answer from the s3 context minus GenAcc of its answer from naive top-k RAG, the baseline term
computed once per question and cached; the released code's `(s3 − RAG) + s3` is an option.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import Field

from recipes.base import (
    ANSWER_PROMPT,
    Action,
    Complete,
    Doc,
    Episode,
    FinalOutput,
    Invalid,
    Prompt,
    Recipe,
    RecipeConfig,
    RewardBreakdown,
    Scorer,
    Search,
    Select,
    format_docs,
    prefilled,
    require_scorer,
)
from recipes.expert import (
    ExpertQuery,
    after_prefix,
    docs_holding_answer,
    key_words_query,
    key_words_search,
    search_candidates,
)
from recipes.metrics import cover_exact_match, exact_match, f1_score, gen_acc, normalize_answer
from recipes.search_metrics import shown_docs
from recipes.tags import Block, clean, find_blocks

SEARCHER_PROMPT = (
    "You are a search copilot for a generation model. Based on a user's query and initial searched results, you "
    "will first determine if the searched results are enough to produce an answer. If the searched results are "
    "enough, you will use <search_complete>True</search_complete> to indicate that you have gathered enough "
    "information for the generation model to produce an answer. If the searched results are not enough, you will "
    "go through a loop of <query> -> <information> -> <important_info> -> <search_complete> -> <query> (if not "
    "complete) ..., to help the generation model to generate a better answer with more relevant information "
    "searched. You should show the search query between <query> and </query> in JSON format. Based on the search "
    "query, we will return the top searched results between <information> and </information>. You need to put "
    "the doc ids of the important documents (up to 3 documents, within the current information window) between "
    "<important_info> and </important_info> (e.g., <important_info>[1, 4]</important_info>). A search query must "
    "be followed by a <search_complete> tag if the search is not complete. After reviewing the information, you "
    "must decide whether to continue searching with a new query or indicate that the search is complete. If you "
    "need more information, use <search_complete>False</search_complete>. Otherwise, use "
    "<search_complete>True</search_complete> to terminate the search. Note: Only the content between "
    "<important_info> will be used by the generation model to produce an answer.\n\n"
    "<question>\n{question}\n</question>\n"
    "<information>\n{initial_search_result}\n</information>\n"
)

FEEDBACK = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <query> and </query>. "
    "If the information is enough, I should put <search_complete>True</search_complete>. Let me try again.\n"
)

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
_YES_NO_ANSWERS = {"yes", "no", "true", "false"}


class S3Config(RecipeConfig):
    """s3 constants (§3, §4.1, Appendix A.1)."""

    topk: int = Field(3, ge=1, description="Documents per search, q0 included (s3: k = 3).")
    max_turns: int = Field(4, ge=0, description="Search turns after begin-with-search (App. A.1: 4). 0: the "
                           "searcher's one turn selects among the initial top-k and ends the episode (select-only): "
                           "generation also stops at `</important_info>`. Not in the paper.")
    max_selected: int = Field(3, ge=1, description="Documents an <important_info> may select (Fig. 11: up to 3).")
    max_selected_search: int | None = Field(
        None, ge=1, description="Documents an <important_info> may select from a search's block (the ids written "
        "first are kept); None = `max_selected`. With 1 of k = 3 and `unselected_search_block: none`, adding a "
        "document means choosing one (with up to 3 of 3 a GRPO searcher selected [1, 2, 3], every "
        "document, then nothing). Not in the paper.")
    invalid_feedback: str | None = Field(FEEDBACK, description="Appended after an invalid action.")
    reward_variant: Literal["paper", "code"] = Field(
        "paper", description="paper: GenAcc_s3 − GenAcc_RAG (Eq. 1); code: (GenAcc_s3 − GenAcc_RAG) + GenAcc_s3."
    )
    use_judge: bool = Field(True, description="GenAcc = span_check ∨ judge_check (Eq. 3); False = span_check only.")
    prefill: str = Field(
        "", description="Text the searcher's response is forced to start with (e.g. '<important_info>['); it counts "
        "as policy text for parsing. Not in the paper's prompt.")
    reward_metric: Literal["gen_acc", "f1", "cover_em", "em"] = Field(
        "gen_acc", description="The accuracy in Eq. 1: gen_acc (the paper) or the answer's token F1, cover-EM or EM "
        "against the gold answers (a dense gain where a small generator's GenAcc is almost always 0; no judge).")
    no_selection_reward: float | None = Field(
        None, description="The reward of an episode whose searcher selected nothing (no parsed <important_info> or "
        "selection: malformed, or cut at the token limit) instead of Eq. 1. By App. A.5 such an episode's context "
        "is the whole top-k, i.e. naive RAG, so its gain is exactly 0: a safe harbour a weak policy's GRPO update "
        "drifts to, after which every reward is 0 and nothing is left to learn (measured with "
        "configs/learn_cpu.yaml: valid selections 0.77 -> 0.02 on dev in 8 steps). None = the paper. Not in the paper.")
    expert_searches: Literal["when_needed", "always", "key_words"] = Field(
        "when_needed", description="The expert warm start's searches, with search turns (`max_turns` >= "
        "1): when_needed searches only when the latest block holds no gold answer, with a query checked to bring "
        "one into view; always also searches once when the initial top-k holds one (it selects those documents, "
        "then searches with the question's key words, unchecked, and selects what of the results holds the "
        "answer), so that every demonstration shows a search; key_words chooses no query by the answer ("
        "a policy cannot copy a choice that needed the gold): it selects the answer-holding documents of "
        "each block, searches with the question's key words first whatever the top-k holds, and again while no "
        "document shown holds a gold answer (with `fresh_docs`: the ranking's next documents). Not in the paper.")
    expert_unsure_block: Literal["select_none", "leave_first"] = Field(
        "select_none", description="What the expert writes for a block without a gold answer. "
        "select_none: `<important_info>[]</important_info>`, so the generator reads none of it. leave_first: the "
        "initial top-k gets no selection, so it is read whole (App. A.5): naive RAG's context is the default a "
        "policy learns when it cannot tell whether the block holds the answer, not an empty context (the "
        "select_none warm start wrote [] in every block: context recall 0); a search's block without one still "
        "gets []. Not in the paper.")
    expert_search_pick: Literal["answer", "first"] = Field(
        "answer", description="What the expert selects of a search's block that holds no gold answer. "
        "answer: nothing (`[]`). first: its document 1, so every demonstrated search keeps one document and a "
        "GRPO searcher starts from selecting, for the reward to teach which (a warm start from `answer` wrote `[]` "
        "after 80% of its searches and kept 2 of the 27 gold answers its searches found beyond a top-k without one). "
        "Not in the paper.")
    unselected_search_block: Literal["all", "none"] = Field(
        "all", description="What a search's block without an `<important_info>` gives the generator. all: "
        "every document of it (App. A.5). none: nothing, so a search adds only what the searcher selects; the "
        "initial top-k keeps App. A.5 (read whole unless selected), so leaving everything unselected is naive RAG; "
        "the searcher's prompt (Fig. 11) already says only the content between <important_info> is used. "
        "Against the leave-all shortcut: a GRPO searcher (`fresh_docs`, a 270M reader) stopped selecting and read "
        "12 documents, which the reader answered from worse than from 3. Not in the paper.")
    found_reward: float = Field(
        0.0, ge=0.0, description="Added to Eq. 1 when the generator's context holds a gold answer (span check) that "
        "the initial top-k lacks, i.e. the searcher kept a gold-holding document its own search returned ("
        "component `found`). Against the searcher that drops what it finds: with `initial_block: keep` and GenAcc, "
        "where the top-k held no gold answer its searches found one in 27 of 384 episodes and its context kept it in "
        "2, and Eq. 1 pays only where the 270M reader's answer turns. 0 = the paper. Not in the paper.")
    initial_block: Literal["select", "keep"] = Field(
        "select", description="What the generator reads of the initial top-k. select: what the searcher "
        "selects of it, all of it unselected (App. A.5). keep: all of it whatever the searcher writes, so the context "
        "holds naive RAG's and a searcher gains only by what its searches add (a selection on the initial block is "
        "parsed, and ignored). Against the searchers that dropped two of the top-3 (first-turn `[1]`: context "
        "recall 0.45 against naive RAG's 0.63 on test). Not in the paper.")


def parse_ids(content: str) -> tuple[int, ...]:
    """Document ids from an `<important_info>` body such as `[1, 4]` (any integers found)."""
    ids: list[int] = []
    for token in "".join(ch if ch.isdigit() else " " for ch in content).split():
        try:
            ids.append(int(token))
        except ValueError:  # e.g. non-ASCII digits int() rejects
            continue
    return tuple(ids)


def parse_query(content: str) -> str:
    """The query of a `<query>` body: JSON `{"query": ...}` or a JSON string, else the raw text."""
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict) and isinstance(value.get("query"), str):
        return value["query"].strip()
    if isinstance(value, str):
        return value.strip()
    return clean(content).strip('"').strip()


T = TypeVar("T")


def _dedupe(items: Iterable[T], key: Callable[[T], Any]) -> list[T]:
    seen: set = set()
    out = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def _complete_value(block: Block) -> bool | None:
    word = block.content.strip().strip("[]\"'").strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


def _selection(block: Block | None) -> tuple[int, ...] | None:
    return None if block is None else parse_ids(block.content)


def selected_ids(action: Action) -> tuple[int, ...] | None:
    """The document ids a parsed turn selects (1-based, as written, within the turn's latest block); None when
    it writes no `<important_info>` (the block is then unselected: App. A.5)."""
    if isinstance(action, (Search, Complete)):
        return action.selected
    if isinstance(action, Select):
        return action.doc_ids
    return None


def is_yes_no(golden_answers: Sequence[str]) -> bool:
    """True for a yes/no or true/false question, judged by its gold answers (s3 §4.1 drops them:
    span_check accepts "not true" for "true")."""
    return any(normalize_answer(g) in _YES_NO_ANSWERS for g in golden_answers)


def naive_rag_gen_acc(
    question: str,
    docs: Sequence[Doc],
    golden_answers: Sequence[str],
    scorer: Scorer,
    use_judge: bool = True,
    doc_template: str | None = None,
) -> float:
    """GenAcc of the frozen generator answering from naive top-k RAG, Acc(G(Q, D_RAG), A) of s3 Eq. 1.

    `docs`: the top-k documents retrieved for the question itself (D_RAG = R(Q)). Returns 0.0 or 1.0.
    """
    context = format_docs(docs, doc_template) if doc_template else format_docs(docs)
    answer = scorer.generate_answer(question, context, ANSWER_PROMPT)
    return gen_acc(answer, list(golden_answers), scorer.judge if use_judge else None)


def filter_training_set(examples: Iterable[T], rag_gen_acc: Callable[[T], float]) -> list[T]:
    """The s3 training filter (§4.1): drop yes/no/true/false questions and questions naive RAG
    already answers (GenAcc 1). `examples` need a `golden_answers` attribute; `rag_gen_acc(example)`
    returns its naive-RAG GenAcc (precomputed or computed with `naive_rag_gen_acc`)."""
    return [ex for ex in examples if not is_yes_no(ex.golden_answers) and rag_gen_acc(ex) < 1.0]


class S3(Recipe):
    """s3 searcher: query / information / important_info / search_complete; Gain Beyond RAG reward."""

    name = "s3"
    config_cls = S3Config
    paper_stop_strings = ("</query>", "</search_complete>")

    @property
    def select_only(self) -> bool:
        """`max_turns` 0: the searcher selects among the initial top-k once and the episode ends."""
        return self.config.max_turns == 0

    @property
    def stop_strings(self) -> tuple[str, ...]:  # type: ignore[override]
        """`</query>` and `</search_complete>` (s3); select-only adds `</important_info>`: what the model
        writes after its selection would be trained on and, were it another `<important_info>`, replace it."""
        return self.paper_stop_strings + (("</important_info>",) if self.select_only else ())
    initial_search = True
    generator_answers = True  # the searcher selects documents; the frozen generator answers (s3 §3)

    def frozen_roles(self) -> tuple[str, ...]:
        """The generator answers from the s3 and naive-RAG contexts; the judge decides GenAcc when
        `use_judge` (Eq. 3) and the reward metric is GenAcc."""
        judged = self.config.use_judge and self.config.reward_metric == "gen_acc"
        return ("generator", "judge") if judged else ("generator",)

    def accuracy(self, answer: str, golden_answers: Sequence[str], scorer: Scorer) -> float:
        """Acc(answer, A) of Eq. 1 under `reward_metric`: GenAcc (Eq. 3; 0 or 1) or the token F1,
        cover-EM or EM of the answer against the gold answers (in [0, 1])."""
        golds, metric = list(golden_answers), self.config.reward_metric
        if metric == "gen_acc":
            return gen_acc(answer, golds, scorer.judge if self.config.use_judge else None)
        return {"f1": f1_score, "cover_em": cover_exact_match, "em": exact_match}[metric](answer, golds)

    def __init__(self, config: RecipeConfig | Mapping[str, Any] | None = None, **overrides: Any):
        super().__init__(config, **overrides)
        self.rag_cache: dict[str, float] = {}  # question key -> naive-RAG GenAcc (Eq. 1 baseline term)

    def build_prompt(self, question: str, initial_docs: Sequence[Doc], chat: bool) -> Prompt:
        text = SEARCHER_PROMPT.format(question=question, initial_search_result=self.format_docs(initial_docs))
        return prefilled(Prompt(({"role": "user", "content": text},), text, chat), self.config.prefill)

    def parse(self, turn_text: str) -> Action:
        """The turn's first `</query>` → `Search`, or first `<search_complete>True` → `Complete`,
        whichever comes first, carrying the last `<important_info>` before it; otherwise a
        `<search_complete>False` or a lone `<important_info>` → `Select`; otherwise `Invalid`.
        Select-only (`max_turns` 0): the first `<important_info>` → `Complete` with its ids."""
        infos = find_blocks(turn_text, "<important_info>", "</important_info>")
        if self.select_only and infos:
            return Complete(_selection(infos[0]))
        completes = find_blocks(turn_text, "<search_complete>", "</search_complete>")
        events = [(b.end, 0, "query", b) for b in find_blocks(turn_text, "<query>", "</query>")[:1]]
        events += [(b.end, 1, "complete", b) for b in completes if _complete_value(b) is True][:1]
        if events:
            end, _, kind, block = min(events, key=lambda e: e[:2])
            selected = _selection(next((b for b in reversed(infos) if b.end <= end), None))
            if kind == "complete":
                return Complete(selected)
            query = parse_query(block.content)
            return Search(query, selected) if query else Invalid("empty query")
        if infos or any(_complete_value(b) is False for b in completes):
            return Select(_selection(infos[-1] if infos else None))
        if completes:
            return Invalid("<search_complete> must hold True or False")
        return Invalid("no <query>, <important_info> or <search_complete>")

    def observation_text(self, docs: Sequence[Doc]) -> str:
        return f"\n\n<information>\n{self.format_docs(docs)}\n</information>\n\n"

    def _expert_block(self, episode: Episode) -> list[Doc] | None:
        """The documents the expert's next turn reads: the initial top-k at the start, the latest search's right
        after it; None elsewhere (the expert has no turn to write)."""
        if not episode.turns:
            return list(episode.initial_docs)
        last = episode.turns[-1]
        return list(last.docs) if isinstance(last.action, Search) and last.docs is not None else None

    def expert_queries(self, episode: Episode) -> list[ExpertQuery]:
        """`recipes.expert.search_candidates` (the searching expert, here for s3's search turns) when
        the latest block holds no gold answer and a search turn is left (`max_turns`); with `expert_searches:
        always`, when the initial top-k holds one, the question's key words (`checked=False`: a check search a
        policy can copy); with `expert_searches: key_words`, the question's key words first and again (with
        `fresh_docs`) while no document shown holds a gold answer; [] otherwise and in select-only."""
        block = self._expert_block(episode)
        if self.select_only or block is None or episode.num_steps >= self.config.max_turns:
            return []
        if self.config.expert_searches == "key_words":  # the same query every time: no choice that needs the answer
            found = docs_holding_answer(shown_docs(episode), episode.golden_answers)
            if episode.num_searches and (found or not self.config.fresh_docs):
                return []  # found, or a repeat would show the same documents
            return [key_words_search(episode)]
        if docs_holding_answer(block, episode.golden_answers):
            if self._checks_once(episode):
                words = key_words_query(episode.question)
                return [ExpertQuery(words, "Let me check with one more search.", checked=False)]
            return []
        if episode.turns and docs_holding_answer(shown_docs(episode), episode.golden_answers):
            return []  # the check search brought nothing new: the earlier selection holds the answer
        titles = episode.meta.get("supporting_titles") or ()
        return search_candidates(episode.question, block, shown_docs(episode), titles)

    def _checks_once(self, episode: Episode) -> bool:
        """`expert_searches: always` or `key_words` and no search yet: the expert searches even though the block
        holds the answer."""
        return self.config.expert_searches in ("always", "key_words") and episode.num_searches == 0

    def expert_turn(self, episode: Episode, query: Any = None) -> str | None:
        """The expert searcher: select the documents of the latest information block that hold a gold answer
        (at most `max_selected`) and complete; when the block holds none and a search turn is left, select none of
        it and search with `query` (the candidate of `expert_queries` that the agent loop checked brings a gold
        answer into view), then select from its results. With `expert_searches: always` it also searches (with
        the check query) after selecting the initial block's answer-holding documents, and a search that brings
        none completes with an empty selection (the earlier selection stands). No gold answer in view and no
        query: None. With `expert_unsure_block: leave_first` an initial top-k without a gold answer gets no
        selection (it is read whole); with `expert_search_pick: first` a search's block without one gets `[1]`.
        """
        docs = self._expert_block(episode)
        if docs is None:
            return None
        cap = self.selection_cap(0 if not episode.turns else 1)
        ids = [i for i, _ in docs_holding_answer(docs, episode.golden_answers)][:cap]
        picked = ids or ([1] if episode.turns and docs and self.config.expert_search_pick == "first" else [])
        selection = f"<important_info>[{', '.join(map(str, picked))}]</important_info>"  # [] selects none of it
        if not ids and self._leaves_whole(episode):
            selection = ""  # no <important_info>: the block is read whole (App. A.5)
        searching = query is not None and not self.select_only and episode.num_steps < self.config.max_turns
        if searching and (not ids or self._checks_once(episode)):
            # a block without a selection would give all of it (App. A.5): even none is written out
            text = selection + "<query>" + json.dumps({"query": query.query}) + "</query>"
        elif ids or (episode.turns and docs_holding_answer(shown_docs(episode), episode.golden_answers)):
            text = selection + ("" if self.select_only else "<search_complete>True</search_complete>")
        else:
            return None
        return after_prefix(episode, text)

    def selection_cap(self, block_index: int) -> int:
        """Documents a selection may keep from block `block_index` (0: the initial top-k; 1, 2, ...: the searches'
        blocks): `max_selected`, or `max_selected_search` for a search's block when set."""
        search_cap = self.config.max_selected_search
        return search_cap if block_index > 0 and search_cap is not None else self.config.max_selected

    def _leaves_whole(self, episode: Episode) -> bool:
        """`expert_unsure_block: leave_first` and the block is the initial top-k (no turn yet)."""
        return self.config.expert_unsure_block == "leave_first" and not episode.turns

    def context_docs(self, episode: Episode) -> list[Doc]:
        """D_s3 = ∪_t D_t^sel by the extraction rules of Appendix A.5.

        Blocks are the initial top-k and each executed search's documents. A selection applies to
        the most recent block before it (the last selection wins); ids outside the block are
        dropped and at most `selection_cap` kept (the first written); a block without a selection contributes all its
        documents (with `unselected_search_block: none`, only the initial top-k does; a search's block
        gives none); with `initial_block: keep` the initial top-k is whole whatever its selection; duplicates
        (same title and text) are dropped, the first occurrence kept.
        """
        blocks: list[list[Doc]] = [list(episode.initial_docs)] if episode.initial_docs else []
        selections: dict[int, tuple[int, ...]] = {}
        for turn in episode.turns:
            selected = selected_ids(turn.action)
            if selected is not None and blocks:
                selections[len(blocks) - 1] = selected
            if turn.docs is not None:
                blocks.append(turn.docs)
        if self.config.initial_block == "keep" and episode.initial_docs:
            selections.pop(0, None)  # the question's top-k is read whole: a searcher only adds to it
        docs: list[Doc] = []
        first_search = 1 if episode.initial_docs else 0  # the initial top-k stays whole by App. A.5 either way
        skip_unselected = self.config.unselected_search_block == "none"
        for i, block in enumerate(blocks):
            if i not in selections:
                if not (skip_unselected and i >= first_search):
                    docs.extend(block)
                continue
            cap = self.selection_cap(i - first_search + 1)
            ids = [j for j in dict.fromkeys(selections[i]) if 1 <= j <= len(block)][:cap]
            docs.extend(block[j - 1] for j in sorted(ids))
        return _dedupe(docs, key=lambda d: (d.title.strip(), d.text.strip()))

    def generator_context(self, episode: Episode) -> list[Doc]:
        """What the frozen generator reads: `context_docs` (s3 §3.1, D_s3)."""
        return self.context_docs(episode)

    def final_output(self, episode: Episode) -> FinalOutput:
        """The selected documents; `answer` is filled by `reward` with the frozen generator's answer."""
        return FinalOutput(selected_docs=self.context_docs(episode))

    def rag_gen_acc(self, episode: Episode, scorer: Scorer) -> float:
        """The baseline term Acc(G(Q, D_RAG), A): `episode.meta["rag_gen_acc"]` when precomputed (a
        GenAcc: used only under `reward_metric` gen_acc), else computed from the episode's initial
        top-k once per question and cached, keyed by the dataset-unique `group_id` (two datasets'
        question "17" are different questions), else `qid`, else the text."""
        if "rag_gen_acc" in episode.meta and self.config.reward_metric == "gen_acc":
            return float(episode.meta["rag_gen_acc"])
        key = episode.group_id or episode.qid or episode.question
        if key not in self.rag_cache:  # D_RAG = the initial top-k, read as the s3 context is (same template)
            answer = scorer.generate_answer(episode.question, self.format_docs(episode.initial_docs), ANSWER_PROMPT)
            self.rag_cache[key] = self.accuracy(answer, episode.golden_answers, scorer)
        return self.rag_cache[key]

    def reward(self, episode: Episode, scorer: Scorer | None = None) -> RewardBreakdown:
        """Gain Beyond RAG (s3 Eq. 1): Acc(G(Q, D_s3)) − Acc(G(Q, D_RAG)), in {−1, 0, 1} for GenAcc
        (in [−1, 1] for F1); the `code` variant adds Acc_s3 (range [−1, 2]). Acc is `reward_metric`
        (`accuracy`). With `no_selection_reward` set, an episode that selected nothing gets that value
        instead (component `no_selection`: 1.0 for such an episode). With `found_reward`, that much more where the
        context holds a gold answer the initial top-k lacks (component `found`). Also stores the generator's answer in
        `episode.final.answer`.

        Components keep the paper's names whatever the metric: `gen_acc_s3` and `gen_acc_rag` hold
        the configured accuracy.

        Components: `gen_acc_s3`, `gen_acc_rag`, `gain_beyond_rag`.

        Raises:
            ScorerRequiredError: no scorer (the frozen generator is needed).
        """
        scorer = require_scorer(scorer, self.name)
        final = episode.final or self.final_output(episode)
        golds = list(episode.golden_answers)
        answer = scorer.generate_answer(episode.question, self.format_docs(final.selected_docs), ANSWER_PROMPT)
        final.answer = answer
        acc_s3 = self.accuracy(answer, golds, scorer)
        acc_rag = self.rag_gen_acc(episode, scorer)
        gain = acc_s3 - acc_rag
        total = gain + acc_s3 if self.config.reward_variant == "code" else gain
        components = {"gen_acc_s3": acc_s3, "gen_acc_rag": acc_rag, "gain_beyond_rag": gain}
        if self.config.found_reward:
            found = bool(docs_holding_answer(final.selected_docs, golds)) and not docs_holding_answer(
                episode.initial_docs, golds)
            components["found"] = float(found)
            total += self.config.found_reward * found
        if self.config.no_selection_reward is not None:
            selected = any(selected_ids(t.action) is not None for t in episode.turns)
            components["no_selection"] = 0.0 if selected else 1.0
            total = total if selected else self.config.no_selection_reward
        return RewardBreakdown(total, components)
