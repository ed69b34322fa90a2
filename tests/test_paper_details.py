"""The smaller paper details: F1's yes/no rule as a named option, token-level
cover-EM, an empty answer ends the episode, and s3's naive-RAG baseline cached per dataset-unique group."""

from __future__ import annotations

import pytest

from pipelines.prepare.r1_difficulty import answer_correct
from recipes import get_recipe
from recipes.base import Answer
from recipes.metrics import cover_exact_match, f1_score, span_check
from tests.test_recipes import INITIAL, SECOND, TABLE7_TURNS, ScriptedScorer, run


def test_f1_yes_no_rule_is_flashrag_s_and_the_paper_rewards_use_plain_f1():
    # Plain F1 (R1-Searcher Eq. 4, R-Search Eq. 3): "no" against "no way" has P = 1, R = 1/2, F1 = 2/3.
    assert f1_score("no", ["no way"], yes_no_rule=False) == pytest.approx(2 / 3)
    assert f1_score("no", ["no way"]) == 0.0  # HotpotQA's / FlashRAG's rule, kept for the evaluation table
    r1 = get_recipe("r1_searcher", stage=2)
    ep = r1.start("Is it?", ["no way"], chat=False)
    run(r1, ep, [" plan </think><answer> no </answer>"])
    assert ep.stop_reason == "answer" and r1.reward(ep).components["answer_f1"] == pytest.approx(2 / 3)
    hotpot = get_recipe("r1_searcher", stage=2, f1_yes_no_rule=True)
    ep = hotpot.start("Is it?", ["no way"], chat=False)
    run(hotpot, ep, [" plan </think><answer> no </answer>"])
    assert hotpot.reward(ep).components["answer_f1"] == 0.0
    rs = get_recipe("r_search", evidence_reward=False)
    ep = rs.start("Is it?", ["no way"])
    run(rs, ep, ["<answer> no </answer>"])
    assert rs.reward(ep).components["answer_f1"] == pytest.approx(2 / 3)


def test_token_level_cover_em():
    # Where character cover-EM is too lenient: it accepts gold "2" in "2022" and "art" in "party".
    assert cover_exact_match("in 2022", ["2"]) == 1.0 and cover_exact_match("a party", ["art"]) == 1.0
    assert cover_exact_match("in 2022", ["2"], token_level=True) == 0.0
    assert cover_exact_match("a party", ["art"], token_level=True) == 0.0
    assert cover_exact_match("the year 2 BC", ["2"], token_level=True) == 1.0 == float(span_check("the year 2 BC", ["2"]))
    # Where it matters: Eval-RAR's R_eval (Eq. 4) and R1-Searcher's difficulty buckets (§2.1).
    for match, expected in (("substring", 0.1), ("token", 0.0)):
        er = get_recipe("eval_rar", eval_match=match)
        ep = er.start("When?", ["2"])
        run(er, ep, ["<search> year </search>", "<evaluate> it was 2022 </evaluate><answer> 2022 </answer>"],
            [INITIAL[:1]])
        assert er.reward(ep).total == pytest.approx(expected), match
    assert answer_correct("2022", ["2"], "cover_em") and not answer_correct("2022", ["2"], "span_check")


def test_an_empty_answer_ends_the_episode():
    # Search-R1's loop ends on any <answer> block; an empty one scores 0 instead of drawing feedback.
    for name in ("search_r1", "eval_rar", "r_search"):
        recipe = get_recipe(name, **({"evidence_reward": False} if name == "r_search" else {}))
        ep = recipe.start("q?", ["a"])
        run(recipe, ep, ["<answer>  </answer>"])
        assert ep.done and ep.stop_reason == "answer" and ep.turns[0].action == Answer(""), name
        reward = recipe.reward(ep)  # R-Search keeps its format reward (Eq. 5: the answer box is well formed)
        assert (reward.components["answer_f1"] == 0.0) if name == "r_search" else (reward.total == 0.0), name
    sr1 = get_recipe("search_r1")
    assert type(sr1.parse("<search> </search>")).__name__ == "Invalid"


def test_s3_rag_baseline_is_cached_per_dataset_unique_group():
    # Two datasets' question "17" are different questions: each gets its own naive-RAG GenAcc.
    from tests.test_recipes import EARTHSHIP_Q, RAG_ANSWER

    s3 = get_recipe("s3")
    scorer = ScriptedScorer({"Garbage Warrior": "2007"}, default=RAG_ANSWER)
    for group in ("nq/17", "hotpotqa/17", "nq/17"):
        ep = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False, qid="17", group_id=group)
        s3.reward(run(s3, ep, TABLE7_TURNS, [SECOND]), scorer)
    assert sorted(s3.rag_cache) == ["hotpotqa/17", "nq/17"]
