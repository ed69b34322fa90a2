"""Expert demonstrations for the warm start (`train.warm_start.source: expert`): each recipe's rule-based expert
writes its turns through the real agent loop (the recipe's prompt, tags, tokenization and loss mask), answering
or selecting with what retrieval showed; a question whose gold answer retrieval never shows gives none."""

from __future__ import annotations

import asyncio

import pytest

from actors.engines.base import Sampling
from actors.rollout.agent_loop import NO_DEMONSTRATION, AgentLoop, RolloutLimits
from pipelines.warm_start import demonstrations
from recipes import RECIPES, get_recipe
from recipes.base import Search
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
def test_the_expert_searches_with_the_question_then_answers_with_the_gold_it_read(gemma_tokenizer, name):
    recipe = get_recipe(name)
    trajs, calls = run_expert(gemma_tokenizer, recipe, {Q: 2}, [ex("q1", Q, [GOLD, "M. Tolven"])])
    t = trajs[0]
    assert calls == [Q] and t.finish_reason == "answer" and t.final["answer"] == GOLD
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


def test_s3_searches_once_when_the_initial_documents_hold_no_gold(gemma_tokenizer):
    recipe = get_recipe("s3", max_turns=2)
    other = "Zorblax Rising"
    # the initial top-k (query = the question) holds nothing; the expert's query is the question again, so a
    # searcher that answers the second call differently stands for a changed index state: use a call counter
    calls_seen: list = []

    async def search(query, k):
        calls_seen.append(query)
        at = 1 if len(calls_seen) == 2 else None
        return [{"doc_id": f"d{len(calls_seen)}-{i}", "title": f"T{i}",
                 "text": f"{other} was written by {GOLD}." if i == at else "nothing", "score": 1.0}
                for i in range(1, k + 1)]

    engine = ScriptedEngine(gemma_tokenizer, lambda c: "never asked")
    loop = AgentLoop(engine, recipe, search, Sampling(), RolloutLimits(max_new_tokens_per_turn=64), chat=False,
                     compute_reward=False, expert=True)
    t = asyncio.run(loop.run_batch([ex("q1", Q, [GOLD])], 1))[0]
    assert [turn.text for turn in t.turns] == [
        '<important_info>[]</important_info><query>{"query": "Who wrote the novel Zorblax Rising?"}</query>',
        "<important_info>[1]</important_info><search_complete>True</search_complete>"]
    assert t.finish_reason == "complete" and t.final["selected_doc_ids"] == ["d2-1"]


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
    assert calls == [Q] and t.finish_reason == "answer" and t.final["answer"] == GOLD
    assert t.turns[0].text.startswith(f" {Q} ")  # after the prefilled tag, as a policy's turn would be


def test_the_main_job_adds_the_warm_start_row_when_the_run_kept_one(tmp_path):
    from configs import Config
    from scripts.main import EVAL_METHODS, eval_methods

    warm = Config(train={"warm_start": {"source": "expert"}})
    assert eval_methods(warm, tmp_path) == EVAL_METHODS  # no warm-started policy written (yet)
    (tmp_path / "checkpoints" / "warm-start" / "policy" / "hf").mkdir(parents=True)
    (tmp_path / "checkpoints" / "warm-start" / "policy" / "hf" / "config.json").write_text("{}")
    assert eval_methods(warm, tmp_path) == (*EVAL_METHODS, "warm_start")
    assert eval_methods(Config(), tmp_path) == EVAL_METHODS
