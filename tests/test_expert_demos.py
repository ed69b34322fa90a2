"""Expert demonstrations for the warm start (`train.warm_start.source: expert`): each recipe's rule-based expert
writes its turns through the real agent loop (the recipe's prompt, tags, tokenization and loss mask), answering
or selecting with what retrieval showed; a question whose gold answer retrieval never shows gives none."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.engines.base import Sampling
from actors.rollout.agent_loop import EXPERT_TURN_OVER_LIMIT, NO_DEMONSTRATION, AgentLoop, RolloutLimits
from pipelines.warm_start import demonstrations
from recipes import RECIPES, get_recipe
from recipes.base import Search
from recipes.expert import key_words
from tests.scripted_engine import ScriptedEngine
from tests.test_agent_loop import ex

Q = "Who wrote the novel Zorblax Rising?"
GOLD = "Mira Tolven"


def searcher_holding(answer_at: dict[str, int], calls: list):
    """Top-k documents for a query; the document at position `answer_at[query]` (1-based) holds the gold answer."""

    async def search(query: str, k: int):
        calls.append(query)
        at = answer_at.get(query)
        return [{"doc_id": f"d{i}", "title": f"Title {i}",
                 "text": (f"Zorblax Rising is a novel. It was written by {GOLD} in 1990." if i == at
                          else f"Passage {i} about something else."), "score": 1.0} for i in range(1, k + 1)]

    return search


def run_expert(tokenizer, recipe, answer_at, examples, compute_reward=False):
    engine = ScriptedEngine(tokenizer, lambda context: "never asked")
    calls: list = []
    loop = AgentLoop(engine, recipe, searcher_holding(answer_at, calls), Sampling(temperature=0.0),
                     RolloutLimits(max_new_tokens_per_turn=128), chat=False, compute_reward=compute_reward, expert=True)
    trajs = asyncio.run(loop.run_batch(examples, 1))
    assert engine.requests == []  # the expert wrote every turn
    return trajs, calls


@pytest.mark.parametrize("name", ["search_r1", "r1_searcher", "r_search", "eval_rar"])
def test_the_expert_searches_with_the_query_that_finds_the_gold_then_answers_with_it(gemma_tokenizer, name):
    """Only the question itself finds the gold here: the shorter candidates are checked against the index and
    dropped, the question is checked, then searched."""
    recipe = get_recipe(name)
    trajs, calls = run_expert(gemma_tokenizer, recipe, {Q: 2}, [ex("q1", Q, [GOLD, "M. Tolven"])])
    t = trajs[0]
    assert calls[-2:] == [Q, Q] and Q not in calls[:-2] and len(calls) > 2
    assert t.finish_reason == "answer" and t.final["answer"] == GOLD
    ep = t.episode
    assert isinstance(ep.turns[0].action, Search) and ep.turns[0].action.query == Q
    mask = t.loss_mask
    policy = gemma_tokenizer.decode([i for i, m in zip(t.response_ids, mask) if m])
    inserted = gemma_tokenizer.decode([i for i, m in zip(t.response_ids, mask) if not m])
    assert GOLD in policy and "Passage 1 about something else" in inserted  # observations stay out of the loss
    assert "Passage 1" not in policy
    if name == "r_search":  # the evidence block holds the sentence that holds the answer
        assert ep.final.evidence == f"It was written by {GOLD} in 1990."
    if name == "eval_rar":  # its evaluation cites the document: the evaluation reward's condition holds too
        breakdown = recipe.reward(ep)
        assert breakdown.components["answer_em"] == 1.0 and breakdown.components["eval_contains_gold"] == 1.0
    if name == "r1_searcher":  # the base-model prompt's forced <think> is not written twice
        assert not t.turns[0].text.startswith("<think>") and ep.generated_text.startswith("<think> I need")


def test_no_demonstration_where_retrieval_never_shows_the_gold(gemma_tokenizer):
    trajs, _ = run_expert(gemma_tokenizer, get_recipe("search_r1", reward_metric="f1"), {},
                          [ex("q1", Q, [GOLD]), ex("q2", "Where is X?", ["Y"])], compute_reward=True)
    assert [t.finish_reason for t in trajs] == [NO_DEMONSTRATION, NO_DEMONSTRATION]
    assert all(t.reward is None for t in trajs)  # not scored
    jsons = [t.to_json() for t in trajs]
    assert demonstrations(jsons) == []


def test_search_r1_demonstration_earns_the_full_reward(gemma_tokenizer):
    trajs, _ = run_expert(gemma_tokenizer, get_recipe("search_r1"), {Q: 3}, [ex("q1", Q, [GOLD])],
                          compute_reward=True)
    assert trajs[0].reward == 1.0 and len(demonstrations([trajs[0].to_json()])) == 1


def test_s3_select_only_selects_the_documents_that_hold_the_gold(gemma_tokenizer):
    """The main job's searcher: select-only with the prefilled `<important_info>[`."""
    recipe = get_recipe("s3", max_turns=0, prefill="<important_info>[")
    trajs, calls = run_expert(gemma_tokenizer, recipe, {Q: 2}, [ex("q1", Q, [GOLD]), ex("q2", "Who else?", ["Z"])])
    good, none = trajs
    assert calls == [Q, "Who else?"]  # begin with search: the initial top-k
    assert good.turns[0].text == "2]</important_info>" and good.finish_reason == "complete"
    assert good.final["selected_doc_ids"] == ["d2"]
    assert none.finish_reason == NO_DEMONSTRATION


def test_an_expert_turn_longer_than_the_turn_limit_is_no_demonstration_and_the_probe_names_the_limit(gemma_tokenizer):
    """s3's selection "2]</important_info>" does not fit 3 new tokens a turn: the episode ends with
    `EXPERT_TURN_OVER_LIMIT` (not scored, not kept), apart from the question retrieval never answers, and the
    expert-ceiling probe says which limit to raise instead of reporting a silent 0 demonstrated."""
    from scripts.probes.expert_ceiling import undemonstrated_lines

    recipe = get_recipe("s3", max_turns=0, prefill="<important_info>[")
    loop = AgentLoop(ScriptedEngine(gemma_tokenizer, lambda context: "never asked"), recipe,
                     searcher_holding({Q: 2}, []), Sampling(temperature=0.0), RolloutLimits(max_new_tokens_per_turn=3),
                     chat=False, compute_reward=True, expert=True)
    over, none = asyncio.run(loop.run_batch([ex("q1", Q, [GOLD]), ex("q2", "Who else?", ["Z"])], 1))
    assert (over.finish_reason, none.finish_reason) == (EXPERT_TURN_OVER_LIMIT, NO_DEMONSTRATION)
    assert over.reward is None and demonstrations([over.to_json()]) == []
    lines = undemonstrated_lines([over, none], 3, 1536)
    assert lines[0] == f"not demonstrated: 1 {EXPERT_TURN_OVER_LIMIT}, 1 {NO_DEMONSTRATION}"
    assert "rollout.max_new_tokens_per_turn (3)" in lines[1]
    assert undemonstrated_lines([], 3, 1536) == []


def test_s3_searches_with_a_checked_query_when_the_initial_documents_hold_no_gold(gemma_tokenizer):
    """s3 with search turns: the question's top-3 holds nothing; the expert's query is the first
    candidate (`search_candidates`) whose results hold the gold, checked against the index, and it selects only the
    document that holds it. A question no query answers gives no demonstration."""
    recipe = get_recipe("s3", max_turns=2)
    calls: list = []

    async def search(query, k):
        calls.append(query)
        hit = query != Q and "Zorblax" in query  # the novel's page: found by its name, not by the whole question
        return [{"doc_id": f"{query}-{i}", "title": f"T{i}",
                 "text": f"Zorblax Rising was written by {GOLD}." if hit and i == 2 else "nothing", "score": 1.0}
                for i in range(1, k + 1)]

    engine = ScriptedEngine(gemma_tokenizer, lambda c: "never asked")
    loop = AgentLoop(engine, recipe, search, Sampling(), RolloutLimits(max_new_tokens_per_turn=64), chat=False,
                     compute_reward=False, expert=True)
    t, none = asyncio.run(loop.run_batch([ex("q1", Q, [GOLD]), ex("q2", "Who else?", ["Z"])], 1))
    query = t.turns[0].query
    assert query != Q and "Zorblax" in query and calls[0] == Q  # the initial top-k, then the checks
    assert t.turns[0].text == '<important_info>[]</important_info><query>' + json.dumps({"query": query}) + "</query>"
    assert t.turns[1].text == "<important_info>[2]</important_info><search_complete>True</search_complete>"
    assert t.finish_reason == "complete" and t.final["selected_doc_ids"] == [f"{query}-2"]
    assert none.finish_reason == NO_DEMONSTRATION and none.turns == []


@pytest.mark.parametrize("found_again", [True, False])
def test_s3_always_checks_with_the_question_s_key_words_after_selecting_the_answer(gemma_tokenizer, found_again):
    """s3 with `expert_searches: always`: the question's top-3 holds the gold at position 2; the expert
    selects that document, searches once with the key words (unchecked) and selects what of the results holds the
    gold; a search that brings none completes with an empty selection and the first selection stands."""
    recipe = get_recipe("s3", max_turns=2, expert_searches="always")
    words = " ".join(key_words(Q))
    trajs, calls = run_expert(gemma_tokenizer, recipe, {Q: 2, **({words: 1} if found_again else {})},
                              [ex("q1", Q, [GOLD])])
    t = trajs[0]
    assert calls == [Q, words]  # the check query is not checked against the index first
    assert t.turns[0].text == '<important_info>[2]</important_info><query>' + json.dumps({"query": words}) + "</query>"
    second = "[1]" if found_again else "[]"
    assert t.turns[1].text == f"<important_info>{second}</important_info><search_complete>True</search_complete>"
    assert t.finish_reason == "complete"
    assert t.final["selected_doc_ids"] == (["d2", "d1"] if found_again else ["d2"])
    when_needed, _ = run_expert(gemma_tokenizer, get_recipe("s3", max_turns=2), {Q: 2}, [ex("q1", Q, [GOLD])])
    assert [turn.text for turn in when_needed[0].turns] == [
        "<important_info>[2]</important_info><search_complete>True</search_complete>"]


def test_every_rl_recipe_has_an_expert_and_the_baselines_none():
    assert {name for name, cls in RECIPES.items() if cls.has_expert()} == {
        "s3", "search_r1", "r1_searcher", "r_search", "eval_rar"}


def test_an_expert_warm_start_on_a_recipe_without_one_fails_before_any_actor():
    from configs import load_config
    from pipelines.train_checks import TrainConfigError, validate

    cfg = load_config("configs/search_r1_cpu.yaml", ["train.recipe=naive_rag", "train.warm_start.source=expert"])
    with pytest.raises(TrainConfigError, match="train.warm_start.source=expert: recipe 'naive_rag' has no expert"):
        validate(cfg, need_index=False)


@pytest.mark.parametrize("name, prefill", [("search_r1", "<search>"), ("r1_searcher", "<|begin_of_query|>")])
def test_a_prefilled_action_tag_is_continued(gemma_tokenizer, name, prefill):
    """The CPU configs prefill the search tag: the expert's first turn continues it (no reasoning first)."""
    trajs, calls = run_expert(gemma_tokenizer, get_recipe(name, prefill=prefill), {Q: 1}, [ex("q1", Q, [GOLD])])
    t = trajs[0]
    assert calls[-2:] == [Q, Q] and t.finish_reason == "answer" and t.final["answer"] == GOLD
    assert t.turns[0].text.startswith(f" {Q} ")  # after the prefilled tag, as a policy's turn would be


def test_the_main_job_adds_the_warm_start_row_when_the_run_kept_one(tmp_path):
    from configs import Config
    from scripts.main import EVAL_METHODS, eval_methods

    warm = Config(train={"warm_start": {"source": "expert"}})
    assert eval_methods(warm, tmp_path) == EVAL_METHODS  # no warm-started policy written (yet)
    (tmp_path / "checkpoints" / "warm-start" / "policy" / "hf").mkdir(parents=True)
    (tmp_path / "checkpoints" / "warm-start" / "policy" / "hf" / "config.json").write_text("{}")
    assert eval_methods(warm, tmp_path) == (*EVAL_METHODS, "warm_start")
    assert eval_methods(warm, tmp_path, tmp_path / "checkpoints" / "step-8") == (*EVAL_METHODS, "warm_start")
    # dev chose the warm start: the trained row is the warm start, evaluated once
    assert eval_methods(warm, tmp_path, tmp_path / "checkpoints" / "warm-start") == EVAL_METHODS
    assert eval_methods(Config(), tmp_path) == EVAL_METHODS


# -- the expert that searches with purpose, under the answering loop ------------------------------------------

BRIDGE_Q = "Where was the director of the film Quiet Harbor born?"
BRIDGE = "Ansel Kordova"


def bridge_searcher(calls: list, answer_query: str):
    """A searcher whose answer ("Vellmar") only `answer_query` finds; every other query (the question included)
    returns the film's page, which names the director (the bridge entity), and two unrelated passages."""

    async def search(query: str, k: int):
        calls.append(query)
        if query == answer_query:
            docs = [("p-born", BRIDGE, f"{BRIDGE} (born 1931 in Vellmar) is a film director.")]
        else:
            docs = [("p-film", "Quiet Harbor", f"Quiet Harbor is a 1970 drama film directed by {BRIDGE}.")]
        docs += [(f"p-x{i}", f"Other {i}", f"Passage {i} about something else.") for i in range(1, 20)]
        return [{"doc_id": d, "title": t, "text": x, "score": 1.0} for d, t, x in docs[:k]]

    return search


def main_job_recipe(**overrides):
    """Search-R1 with the answering loop's settings (configs/search_r1_expert_em_cpu.yaml's recipe options, the main
    job's before it searched: the question's top-3 in the prompt, at most 2 searches, a forced answer), the expert
    that searches when needed unless overridden (that config's own expert is `question`:
    test_the_question_expert_...)."""
    from configs import load_config

    cfg = load_config("configs/search_r1_expert_em_cpu.yaml", [])
    assert cfg.train.recipe_options["expert_searches"] == "question"
    return get_recipe(cfg.train.recipe, {**cfg.train.recipe_options, "expert_searches": "when_needed", **overrides})


def run_main_loop(tokenizer, recipe, search, examples, compute_reward=True):
    engine = ScriptedEngine(tokenizer, lambda context: "never asked")
    loop = AgentLoop(engine, recipe, search, Sampling(temperature=0.0), RolloutLimits(128, 256, 1536), chat=False,
                     compute_reward=compute_reward, expert=True)
    return asyncio.run(loop.run_batch(examples, 1))


def test_under_the_main_jobs_loop_the_expert_searches_for_the_missing_supporting_title(gemma_tokenizer):
    """initial_search holds the question's top-3 (no gold); the missing supporting paragraph's title, as the film's
    page writes it, finds the answer: one search of its own, then the answer, paid in full."""
    recipe = main_job_recipe()
    assert recipe.config.initial_search and recipe.config.max_turns == 2
    calls: list = []
    row = {**ex("q1", BRIDGE_Q, ["Vellmar"], dataset="hotpotqa"),
           "meta": {"supporting_titles": ["Quiet Harbor", BRIDGE], "context_ids": ["p-film", "p-born"]}}
    t = run_main_loop(gemma_tokenizer, recipe, bridge_searcher(calls, BRIDGE), [row])[0]
    assert calls == [BRIDGE_Q, BRIDGE, BRIDGE]  # the initial top-3, the check, the turn's search
    assert [turn.query for turn in t.turns] == [BRIDGE, None]
    assert "Doc 1 mentions Ansel Kordova" in t.turns[0].text and t.final["answer"] == "Vellmar" and t.reward == 1.0
    s = t.final["search"]
    assert s["own_searches"] == 1 and s["found_by_search"] and s["retrieval_hit"] and not s["initial_hit"]
    assert s["gold_paragraph_recall"] == 1.0


def test_without_supporting_titles_the_expert_writes_the_bridge_entity_from_a_shown_document(gemma_tokenizer):
    query = f"{BRIDGE} director born"  # the entity the film's page names, with the key words the page lacks
    calls: list = []
    t = run_main_loop(gemma_tokenizer, main_job_recipe(), bridge_searcher(calls, query),
                      [ex("q1", BRIDGE_Q, ["Vellmar"])])[0]
    assert t.turns[0].query == query and t.final["answer"] == "Vellmar"
    assert calls[0] == BRIDGE_Q and calls[-2:] == [query, query]


def test_no_query_that_finds_the_gold_means_no_demonstration_after_a_bounded_number_of_checks(gemma_tokenizer):
    from recipes.expert import MAX_EXPERT_QUERIES

    calls: list = []
    t = run_main_loop(gemma_tokenizer, main_job_recipe(), bridge_searcher(calls, "no such query"),
                      [ex("q1", BRIDGE_Q, ["Vellmar"])])[0]
    assert t.finish_reason == NO_DEMONSTRATION and t.reward is None
    assert 1 < len(calls) <= 1 + MAX_EXPERT_QUERIES


def test_the_always_variant_searches_once_even_when_the_top3_holds_the_gold(gemma_tokenizer):
    """The top-3 holds the gold: `always` still searches once, a check search with the question's key words (a query
    a policy can copy), whatever it brings, and then answers from what it was shown."""
    calls: list = []
    t = run_main_loop(gemma_tokenizer, main_job_recipe(expert_searches="always"), bridge_searcher(calls, "x"),
                      [ex("q1", "Who directed the film Quiet Harbor?", [BRIDGE])])[0]
    assert [turn.action.__class__.__name__ for turn in t.episode.turns] == ["Search", "Answer"]
    assert t.final["answer"] == BRIDGE and t.final["search"]["own_searches"] == 1
    assert t.turns[0].query == "directed film quiet harbor" and calls == ["Who directed the film Quiet Harbor?",
                                                                           "directed film quiet harbor"]
    assert t.turns[0].doc_ids == ["p-film", "p-x1", "p-x2"]
    assert "Doc 1 says the answer is Ansel Kordova" in t.turns[1].text  # read from what its search showed
    assert "Let me check the answer with one more search." in t.turns[0].text  # no "do not give the answer"
    assert "directed film quiet harbor" not in t.turns[0].text.split("</think>")[0]  # the reason never ends on the query


def test_the_always_variant_searches_with_purpose_when_the_top3_lacks_the_gold(gemma_tokenizer):
    """`always` where the top-3 holds no gold: the checked query that finds it (as `when_needed`); a question no query
    answers gives no demonstration and no wasted search."""
    calls: list = []
    row = {**ex("q1", BRIDGE_Q, ["Vellmar"], dataset="hotpotqa"),
           "meta": {"supporting_titles": ["Quiet Harbor", BRIDGE], "context_ids": ["p-film", "p-born"]}}
    t = run_main_loop(gemma_tokenizer, main_job_recipe(expert_searches="always"), bridge_searcher(calls, BRIDGE),
                      [row])[0]
    assert [turn.query for turn in t.turns] == [BRIDGE, None] and t.final["answer"] == "Vellmar"
    assert "Doc 1 mentions Ansel Kordova, but no document gives the answer. I will search for it." in t.turns[0].text
    calls = []
    none = run_main_loop(gemma_tokenizer, main_job_recipe(expert_searches="always"),
                         bridge_searcher(calls, "no such query"), [ex("q2", BRIDGE_Q, ["Vellmar"])])[0]
    assert none.finish_reason == NO_DEMONSTRATION and none.turns == []


@pytest.mark.parametrize("fresh_docs", [True, False])
def test_the_verify_variant_names_the_answer_it_read_then_checks_it_and_answers_with_it(gemma_tokenizer, fresh_docs):
    """`verify` where the top-3 holds the gold (Doc 1): the first reason names it before the check search (the
    decision to search on is made by reading), and the answer turn repeats it whether the check search brought the
    gold again (`fresh_docs: false`: the film's page once more) or nothing (`fresh_docs: true`)."""
    calls: list = []
    recipe = main_job_recipe(expert_searches="verify", fresh_docs=fresh_docs)
    t = run_main_loop(gemma_tokenizer, recipe, bridge_searcher(calls, "x"),
                      [ex("q1", "Who directed the film Quiet Harbor?", [BRIDGE])])[0]
    assert [turn.action.__class__.__name__ for turn in t.episode.turns] == ["Search", "Answer"]
    assert t.turns[0].query == "directed film quiet harbor"
    assert "Doc 1 says the answer is Ansel Kordova. Let me check it with one more search." in t.turns[0].text
    assert ("p-film" in t.turns[0].doc_ids) is not fresh_docs
    assert "So the answer is Ansel Kordova." in t.turns[1].text and t.final["answer"] == BRIDGE
    assert t.reward == 1.0 and t.final["search"]["own_searches"] == 1


def test_the_verify_variant_searches_with_purpose_when_the_top3_lacks_the_gold(gemma_tokenizer):
    """`verify` where the top-3 holds no gold: it says so and searches with the checked query (as `always`), then
    answers from the document its search found."""
    calls: list = []
    row = {**ex("q1", BRIDGE_Q, ["Vellmar"], dataset="hotpotqa"),
           "meta": {"supporting_titles": ["Quiet Harbor", BRIDGE], "context_ids": ["p-film", "p-born"]}}
    t = run_main_loop(gemma_tokenizer, main_job_recipe(expert_searches="verify", fresh_docs=True),
                      bridge_searcher(calls, BRIDGE), [row])[0]
    assert [turn.query for turn in t.turns] == [BRIDGE, None] and t.final["answer"] == "Vellmar"
    assert "but no document gives the answer. I will search for it." in t.turns[0].text
    assert "Doc 1 says the answer is Vellmar." in t.turns[1].text and "So the answer" not in t.turns[1].text


def test_the_always_variant_without_initial_search_first_searches_with_the_question_s_key_words(gemma_tokenizer):
    """The paper's loop (no documents in the prompt) with `always`: the first search is the question's key words,
    unchecked (a query a policy can copy); where its results lack the gold, the checked query that finds it; then
    the answer from what was shown."""
    words = " ".join(key_words(BRIDGE_Q))
    recipe = main_job_recipe(expert_searches="always", initial_search=False)
    calls: list = []
    hop = f"{BRIDGE} director born"  # the bridge entity the film's page names, with the question's next-hop words
    t = run_main_loop(gemma_tokenizer, recipe, bridge_searcher(calls, hop), [ex("q1", BRIDGE_Q, ["Vellmar"])])[0]
    assert [turn.query for turn in t.turns] == [words, hop, None] and t.final["answer"] == "Vellmar"
    assert calls == [words, hop, hop]  # the key words unchecked, the second hop checked, then searched
    assert "I need to search for the answer." in t.turns[0].text
    calls = []
    direct = run_main_loop(gemma_tokenizer, recipe, bridge_searcher(calls, words), [ex("q2", BRIDGE_Q, ["Vellmar"])])[0]
    assert [turn.query for turn in direct.turns] == [words, None] and direct.final["answer"] == "Vellmar"
    assert calls == [words] and direct.final["search"]["own_searches"] == 1


def test_the_question_first_expert_searches_with_the_question_verbatim_then_a_checked_query(gemma_tokenizer):
    """The paper's loop with `question_first`: the first search is the question itself, unchecked (the query a policy
    can copy from its prompt); where its results lack the gold, the checked query that brings it (the bridge entity
    with the next hop's words); where they hold it, the answer after one search."""
    recipe = main_job_recipe(expert_searches="question_first", initial_search=False, fresh_docs=True)
    hop = f"{BRIDGE} director born"
    calls: list = []
    t = run_main_loop(gemma_tokenizer, recipe, bridge_searcher(calls, hop), [ex("q1", BRIDGE_Q, ["Vellmar"])])[0]
    assert [turn.query for turn in t.turns] == [BRIDGE_Q, hop, None] and t.final["answer"] == "Vellmar"
    assert calls[0] == BRIDGE_Q and calls[-1] == hop  # the question unchecked, then the hop checked and searched
    assert "I need to search for the answer." in t.turns[0].text and t.final["search"]["own_searches"] == 2
    calls = []
    direct = run_main_loop(gemma_tokenizer, recipe, bridge_searcher(calls, BRIDGE_Q),
                           [ex("q2", BRIDGE_Q, ["Vellmar"])])[0]
    assert [turn.query for turn in direct.turns] == [BRIDGE_Q, None] and direct.final["answer"] == "Vellmar"
    assert calls == [BRIDGE_Q] and direct.reward == 1.0
    calls = []
    none = run_main_loop(gemma_tokenizer, recipe, bridge_searcher(calls, "no query finds it"),
                         [ex("q3", BRIDGE_Q, ["Vellmar"])])[0]
    assert none.finish_reason == NO_DEMONSTRATION  # no checked query brings the gold: no demonstration


def test_fresh_docs_returns_documents_not_yet_shown(gemma_tokenizer):
    """A repeated query (the question again) shows the next documents with `fresh_docs`, the same ones without."""
    def policy(context):
        return "<think> more </think>\n<search> same query </search>" if context.count("<search> same") < 2 \
            else "<answer> Vellmar </answer>"

    for fresh, expect_new in ((True, True), (False, False)):
        calls: list = []
        recipe = main_job_recipe(fresh_docs=fresh)
        engine = ScriptedEngine(gemma_tokenizer, policy)
        loop = AgentLoop(engine, recipe, bridge_searcher(calls, "none"), Sampling(temperature=0.0),
                         RolloutLimits(128, 256, 2048), chat=False, compute_reward=False)
        t = asyncio.run(loop.run_batch([ex("q1", BRIDGE_Q, ["Vellmar"])], 1))[0]
        ids = [d for turn in t.turns for d in turn.doc_ids]
        shown = t.final["search"]["shown_doc_ids"]
        assert len(ids) == 6
        assert (len(set(ids)) == 6 and not set(ids) & {"p-film", "p-x1", "p-x2"}) if expect_new else set(ids) == set(shown)
        assert len(shown) == (9 if expect_new else 3)


def test_the_expert_ceiling_probe_summarizes_what_the_expert_found(gemma_tokenizer):
    """`scripts.probes.expert_ceiling`'s table over the main job's loop: one question found by its own search, one
    that no query answers."""
    from scripts.probes.expert_ceiling import summarize

    calls: list = []
    rows = [{**ex("q1", BRIDGE_Q, ["Vellmar"], dataset="hotpotqa"), "meta": {"supporting_titles": [BRIDGE]}},
            ex("q2", "Who founded Zorblax?", ["Nobody Knows"], dataset="nq")]
    table = summarize(run_main_loop(gemma_tokenizer, main_job_recipe(), bridge_searcher(calls, BRIDGE), rows))
    assert table["all"]["demonstrated"] == 0.5 and table["all"]["f1"] == 0.5
    assert table["hotpotqa"]["found_by_search"] == 1.0 and table["nq"]["retrieval_recall"] == 0.0
    assert table["all"]["own_searches"] == 0.5 and table["all"]["initial_recall"] == 0.0


def test_the_question_expert_is_the_one_before_issue_61_and_never_searches_under_initial_search(gemma_tokenizer):
    """`expert_searches: question` keeps the main job's measured demonstrations: under `initial_search` its only
    query (the question) repeats the top-3, so a question whose top-3 lacks the gold gets no demonstration."""
    calls: list = []
    recipe = main_job_recipe(expert_searches="question")
    lacks, holds = run_main_loop(gemma_tokenizer, recipe, bridge_searcher(calls, BRIDGE),
                                 [ex("q1", BRIDGE_Q, ["Vellmar"]), ex("q2", "Who directed Quiet Harbor?", [BRIDGE])])
    assert lacks.finish_reason == NO_DEMONSTRATION and holds.final["answer"] == BRIDGE and not holds.episode.turns[0].docs
    assert calls.count(BRIDGE_Q) == 2 and BRIDGE not in calls  # the initial top-3 and the one check, nothing else
    paper = get_recipe("search_r1", expert_searches="question")  # without initial_search it searches with the question
    trajs, search_calls = run_expert(gemma_tokenizer, paper, {Q: 1}, [ex("q1", Q, [GOLD])])
    assert search_calls == [Q, Q] and trajs[0].final["answer"] == GOLD


def test_eval_rar_s_expert_evaluates_every_observation_before_its_next_action(gemma_tokenizer):
    """Eval-RAR asks for an evaluation after each search (Algorithm 1): the expert's turn after a check search
    (`verify`) cites the document it answers from, and a turn that searches on after an observation says the
    question cannot be answered yet."""
    from recipes.eval_rar import evaluation_text

    recipe = get_recipe("eval_rar", {"initial_search": True, "max_turns": 2, "force_answer": True,
                                     "expert_searches": "verify", "fresh_docs": True})
    t = run_main_loop(gemma_tokenizer, recipe, bridge_searcher([], "x"),
                      [ex("q1", "Who directed the film Quiet Harbor?", [BRIDGE])])[0]
    assert [turn.action.__class__.__name__ for turn in t.episode.turns] == ["Search", "Answer"]
    assert t.turns[1].text.startswith(  # Doc 1 of the prompt's top-3, not of the check search's documents
        f"<evaluate> The question can be answered: Doc 1 of the first documents says {BRIDGE}. </evaluate>")
    assert recipe.reward(t.episode).components["eval_contains_gold"] == 1.0

    recipe = get_recipe("eval_rar", {"expert_searches": "always"})  # the paper's loop: no documents in the prompt
    query = f"{BRIDGE} director born"  # the bridge entity the film's page names: it finds the answer
    t = run_main_loop(gemma_tokenizer, recipe, bridge_searcher([], query), [ex("q1", BRIDGE_Q, ["Vellmar"])])[0]
    assert [turn.query for turn in t.turns] == [" ".join(key_words(BRIDGE_Q)), query, None]
    assert not t.turns[0].text.startswith("<evaluate>")  # nothing to evaluate before the first search
    assert t.turns[1].text.startswith("<evaluate> The question cannot be answered yet")
    assert t.final["answer"] == "Vellmar" and "Vellmar" in evaluation_text(t.episode.generated_text)


def ranked_searcher(calls: list):
    """Every query gets the same ranking: the film's page (names the director, not the answer), five unrelated
    passages, then the director's page (the answer, "Vellmar": seventh), then more unrelated passages."""
    docs = [("p-film", "Quiet Harbor", f"Quiet Harbor is a 1970 drama film directed by {BRIDGE}.")]
    docs += [(f"p-x{i}", f"Other {i}", f"Passage {i} about something else.") for i in range(1, 6)]
    docs += [("p-born", BRIDGE, f"{BRIDGE} (born 1931 in Vellmar) is a film director.")]
    docs += [(f"p-y{i}", f"More {i}", f"Passage {i} about another thing.") for i in range(1, 20)]

    async def search(query: str, k: int):
        calls.append(query)
        return [{"doc_id": d, "title": t, "text": x, "score": 1.0} for d, t, x in docs[:k]]

    return search


@pytest.mark.parametrize("fresh_docs", [True, False])
def test_the_key_words_variant_searches_the_question_s_key_words_until_a_shown_document_holds_the_answer(
        gemma_tokenizer, fresh_docs):
    """`key_words` uses no choice that needs the answer: its first search is the question's key words even where
    the top-3 holds the gold, and it searches them again while nothing shown holds it. With `fresh_docs` the second
    search brings documents 7-9, which hold it; without, a repeat would show the same documents, so it never
    repeats and the question gives no demonstration."""
    words = " ".join(key_words(BRIDGE_Q))
    calls: list = []
    recipe = main_job_recipe(expert_searches="key_words", fresh_docs=fresh_docs)
    t = run_main_loop(gemma_tokenizer, recipe, ranked_searcher(calls), [ex("q1", BRIDGE_Q, ["Vellmar"])])[0]
    if not fresh_docs:
        assert t.finish_reason == NO_DEMONSTRATION and [turn.query for turn in t.turns] == [words]
        return
    assert [turn.query for turn in t.turns] == [words, words, None] and t.final["answer"] == "Vellmar"
    assert "I will search for the question's key words." in t.turns[0].text
    assert "No document gives the answer yet. I will search for the question's key words again." in t.turns[1].text
    assert t.turns[1].doc_ids == ["p-born", "p-y1", "p-y2"] and "Doc 1 says the answer is Vellmar." in t.turns[2].text
    assert t.reward == 1.0 and t.final["search"]["own_searches"] == 2 and t.final["search"]["found_by_search"]

    held = run_main_loop(gemma_tokenizer, recipe, ranked_searcher([]),
                         [ex("q2", "Who directed the film Quiet Harbor?", [BRIDGE])])[0]  # the top-3 holds it
    assert [turn.query for turn in held.turns] == ["directed film quiet harbor", None]
    assert "I will search for the question's key words." in held.turns[0].text and "says the answer" not in (
        held.turns[0].text)
    assert held.final["answer"] == BRIDGE and "Doc 1 of the first documents says" in held.turns[1].text


@pytest.mark.parametrize("fresh_docs", [True, False])
def test_s3_key_words_searches_the_question_s_key_words_and_selects_what_holds_the_answer(gemma_tokenizer, fresh_docs):
    """s3 with `expert_searches: key_words`: no query is chosen by the answer (such queries taught arbitrary ones).
    Its first turn selects nothing of a top-3 without the gold and searches the question's key words; with
    `fresh_docs` it searches them again (documents 4-6, then 7-9) until a block holds the gold, and selects only that document;
    without, a repeat would show the same documents, so it never repeats and the question gives no demonstration.
    Where the top-3 holds the gold, it selects it and still searches once."""
    assert not get_recipe("s3", expert_searches="key_words").config.fresh_docs  # the paper's retrieval by default
    words = " ".join(key_words(BRIDGE_Q))
    recipe = get_recipe("s3", max_turns=3, expert_searches="key_words", fresh_docs=fresh_docs)
    t = run_main_loop(gemma_tokenizer, recipe, ranked_searcher([]), [ex("q1", BRIDGE_Q, ["Vellmar"])], False)[0]
    search_turn = '<important_info>[]</important_info><query>' + json.dumps({"query": words}) + "</query>"
    if not fresh_docs:
        assert t.finish_reason == NO_DEMONSTRATION and [turn.text for turn in t.turns] == [search_turn]
        return
    assert [turn.text for turn in t.turns] == [
        search_turn, search_turn, "<important_info>[1]</important_info><search_complete>True</search_complete>"]
    assert [turn.doc_ids for turn in t.turns[:2]] == [["p-x3", "p-x4", "p-x5"], ["p-born", "p-y1", "p-y2"]]
    assert t.final["selected_doc_ids"] == ["p-born"]

    held = run_main_loop(gemma_tokenizer, recipe, ranked_searcher([]),
                         [ex("q2", "Who directed the film Quiet Harbor?", [BRIDGE])], False)[0]  # the top-3 holds it
    held_words = json.dumps({"query": "directed film quiet harbor"})
    assert [turn.text for turn in held.turns] == [
        f"<important_info>[1]</important_info><query>{held_words}</query>",
        "<important_info>[]</important_info><search_complete>True</search_complete>"]  # new documents, no gold
    assert held.final["selected_doc_ids"] == ["p-film"]  # the first selection stands


def test_s3_leave_first_reads_an_initial_top_k_without_the_answer_whole_and_still_selects_none_of_a_search(
        gemma_tokenizer):
    """`expert_unsure_block: leave_first`: the select_none warm start learned `[]` for every block. Here
    the initial top-k without the gold gets no `<important_info>`, so the generator reads it whole (naive RAG's
    context, App. A.5); a search's block without it still gets `[]`, one with it its document."""
    words = json.dumps({"query": " ".join(key_words(BRIDGE_Q))})
    recipe = get_recipe("s3", max_turns=3, expert_searches="key_words", fresh_docs=True,
                        expert_unsure_block="leave_first")
    t = run_main_loop(gemma_tokenizer, recipe, ranked_searcher([]), [ex("q1", BRIDGE_Q, ["Vellmar"])], False)[0]
    assert [turn.text for turn in t.turns] == [
        f"<query>{words}</query>", f"<important_info>[]</important_info><query>{words}</query>",
        "<important_info>[1]</important_info><search_complete>True</search_complete>"]
    first = [d.doc_id for d in t.episode.initial_docs]
    assert len(first) == 3 and t.final["selected_doc_ids"] == [*first, "p-born"]
    held = run_main_loop(gemma_tokenizer, recipe, ranked_searcher([]),
                         [ex("q2", "Who directed the film Quiet Harbor?", [BRIDGE])], False)[0]  # the top-3 holds it
    assert held.turns[0].text.startswith("<important_info>[1]</important_info><query>")
    assert held.final["selected_doc_ids"] == ["p-film"]


def test_s3_expert_search_pick_first_keeps_document_1_of_a_search_without_the_answer(gemma_tokenizer):
    """`expert_search_pick: first`: a search's block without the gold gets `[1]` instead of `[]`, so
    every demonstrated search keeps a document; a block with the gold still gets the gold-holding one, and a
    question whose searches never show the gold still gives no demonstration."""
    words = json.dumps({"query": " ".join(key_words(BRIDGE_Q))})
    recipe = get_recipe("s3", max_turns=3, expert_searches="key_words", fresh_docs=True,
                        expert_unsure_block="leave_first", expert_search_pick="first")
    t = run_main_loop(gemma_tokenizer, recipe, ranked_searcher([]), [ex("q1", BRIDGE_Q, ["Vellmar"])], False)[0]
    assert [turn.text for turn in t.turns] == [
        f"<query>{words}</query>", f"<important_info>[1]</important_info><query>{words}</query>",
        "<important_info>[1]</important_info><search_complete>True</search_complete>"]
    first = [d.doc_id for d in t.episode.initial_docs]
    assert t.final["selected_doc_ids"] == [*first, "p-x3", "p-born"]  # document 1 of each search's block
    held = run_main_loop(gemma_tokenizer, recipe, ranked_searcher([]),
                         [ex("q2", "Who directed the film Quiet Harbor?", [BRIDGE])], False)[0]  # the top-3 holds it
    assert held.turns[1].text == "<important_info>[1]</important_info><search_complete>True</search_complete>"
    assert held.final["selected_doc_ids"][0] == "p-film" and len(held.final["selected_doc_ids"]) == 2
    never = get_recipe("s3", max_turns=3, expert_searches="key_words", fresh_docs=False,
                       expert_unsure_block="leave_first", expert_search_pick="first")
    t = run_main_loop(gemma_tokenizer, never, ranked_searcher([]), [ex("q1", BRIDGE_Q, ["Vellmar"])], False)[0]
    assert t.finish_reason == NO_DEMONSTRATION
