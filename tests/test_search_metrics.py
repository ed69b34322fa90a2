"""The search itself, measured: own searches, retrieval recall and gold-paragraph recall per episode
(`recipes.search_metrics`), in the training metrics and dev curve, in the evaluation's rows with the `multi-hop`
pool and the `no_search` method, and the expert's candidate queries (`recipes.expert.search_candidates`)."""

from __future__ import annotations

import pytest

from pipelines.eval_rows import ALL, MULTI_HOP, QARecord, add_intervals, compute_rows, format_markdown, search_fields
from recipes import get_recipe
from recipes.base import Complete, Doc, Search, Turn
from recipes.expert import entity_phrases, search_candidates
from recipes.search_metrics import gold_paragraph_recall, search_record, search_summary

GOLD = "Vellmar"
FILM = Doc("p-film", "Quiet Harbor", "Quiet Harbor is a 1970 film directed by Ansel Kordova.")
BORN = Doc("p-born", "Ansel Kordova", "Ansel Kordova (born 1931 in Vellmar) is a director.")
OTHER = [Doc(f"p-x{i}", f"Other {i}", f"Passage {i}.") for i in range(1, 4)]


def episode(initial, searches, meta=None):
    recipe = get_recipe("search_r1", initial_search=True)
    ep = recipe.start("Where was the director of Quiet Harbor born?", [GOLD], initial, chat=False, meta=meta)
    for docs in searches:
        ep.turns.append(Turn("<search> q </search>", Search("q"), docs=list(docs)))
    return ep


def test_a_search_that_finds_a_new_gold_document_is_counted_as_found():
    ep = episode([FILM, *OTHER[:2]], [[BORN, FILM, OTHER[2]]], meta={"context_ids": ["p-film", "p-born"]})
    r = search_record(ep)
    assert r.own_searches == 1 and r.retrieval_hit and not r.initial_hit and r.found_by_search
    assert r.shown_doc_ids == ("p-film", "p-x1", "p-x2", "p-born", "p-x3")  # each once, in order shown
    assert r.gold_paragraph_recall == 1.0


def test_a_search_that_repeats_the_initial_gold_document_found_nothing():
    ep = episode([BORN, *OTHER[:2]], [[BORN, *OTHER[:2]]])
    r = search_record(ep)
    assert r.initial_hit and r.retrieval_hit and not r.found_by_search and r.own_searches == 1
    assert r.gold_paragraph_recall is None  # the row lists no gold paragraphs
    assert not search_record(episode(OTHER, [OTHER])).retrieval_hit


def test_gold_paragraph_recall_and_the_summary():
    assert gold_paragraph_recall(["a", "b"], ["a", "c"]) == 0.5 and gold_paragraph_recall(["a"], []) is None
    recs = [search_record(episode([FILM], [[BORN]], {"context_ids": ["p-born", "x"]})).to_json(),
            search_record(episode(OTHER, [])).to_json()]
    s = search_summary(recs)
    assert s == {"own_searches": 0.5, "retrieval_recall": 0.5, "initial_recall": 0.0, "found_by_search_rate": 0.5,
                 "gold_paragraph_recall": 0.5}


@pytest.mark.parametrize("selected, hit", [((1,), True), ((2,), False)])
def test_s3_context_recall_is_what_its_selection_kept_of_what_its_search_showed(selected, hit):
    """The search shows the gold document (retrieval hit) either way; the generator's context holds it
    only when the selection keeps it. Naive RAG's context is its top-k; Search-R1's policy answers itself."""
    s3 = get_recipe("s3", max_turns=1)
    ep = s3.start("Where was the director of Quiet Harbor born?", [GOLD], [FILM, *OTHER[:2]], chat=False)
    ep.turns.append(Turn("<query>q</query>", Search("q", selected=()), docs=[BORN, OTHER[2]]))
    ep.turns.append(Turn("<search_complete>True</search_complete>", Complete(selected)))
    r = search_record(ep, s3.generator_context(ep))
    assert r.retrieval_hit and r.found_by_search and r.context_hit is hit
    assert search_summary([r.to_json()])["context_recall"] == float(hit)
    rag = get_recipe("naive_rag")
    rag_ep = rag.start("q", [GOLD], [BORN], chat=False)
    assert search_record(rag_ep, rag.generator_context(rag_ep)).context_hit is True
    assert get_recipe("search_r1").generator_context(episode([BORN], [])) is None
    assert "context_recall" not in search_summary([search_record(episode([BORN], [])).to_json()])
    row = compute_rows([QARecord("s3", "nq", GOLD, (GOLD,), 2, True, **search_fields(r.to_json()))])[0]
    assert row["context_recall"] == float(hit) and "| context recall |" in format_markdown([row])


def test_rollout_metrics_and_the_dev_curve_carry_the_search():
    from pipelines.train_metrics import dev_curve, rollout_metrics

    def traj(rec):
        return {"reward": 0.0, "turns": [], "response_ids": [], "loss_mask": [], "golden_answers": [GOLD],
                "question": "q", "final": {"answer": "x", "search": rec}, "timings": {"score_s": 0.0},
                "finish_reason": "answer"}

    m = rollout_metrics([traj(search_record(episode([FILM], [[BORN]])).to_json()),
                         traj(search_record(episode(OTHER, [])).to_json())], prefix="dev")
    assert m["dev/own_searches"] == 0.5 and m["dev/retrieval_recall"] == 0.5 and m["dev/found_by_search_rate"] == 0.5
    curve = dev_curve([{"step": 0, **m}])
    assert curve[0]["own searches"] == 0.5 and curve[0]["retrieval recall"] == 0.5


def records():
    """policy searches and finds on the multi-hop rows; no_search answers from the top-k alone."""
    out = []
    for i, ds in enumerate(["hotpotqa", "musique", "nq", "hotpotqa"]):
        out.append(QARecord("policy", ds, GOLD, (GOLD,), 2, True, qid=str(i),
                            **search_fields({"own_searches": 1, "retrieval_hit": True,
                                             "gold_paragraph_recall": 0.5 if ds != "nq" else None})))
        right = ds == "nq"
        out.append(QARecord("no_search", ds, GOLD if right else "x", (GOLD,), 1, right, qid=str(i),
                            **search_fields({"own_searches": 0, "retrieval_hit": right, "gold_paragraph_recall": None})))
    out.append(QARecord("direct", "nq", "x", (GOLD,), 0, False, qid="2"))  # retrieves nothing: no search columns
    return out


def test_rows_carry_the_search_and_pool_the_multi_hop_questions():
    rows = {(r["method"], r["dataset"]): r for r in compute_rows(records())}
    assert rows[("policy", ALL)]["own_searches_per_question"] == 1.0 and rows[("policy", ALL)]["retrieval_recall"] == 1.0
    assert rows[("policy", ALL)]["gold_paragraph_recall"] == 0.5  # over the 3 rows that list gold paragraphs
    assert rows[("no_search", ALL)]["retrieval_recall"] == 0.25 and rows[("no_search", MULTI_HOP)]["n"] == 3
    assert rows[("no_search", MULTI_HOP)]["f1"] == 0.0 and ("no_search", "gold_paragraph_recall") not in rows
    assert "retrieval_recall" not in rows[("direct", "nq")] and ("direct", MULTI_HOP) not in rows
    md = format_markdown(compute_rows(records()))
    assert "| own searches/q | retrieval recall | gold-paragraph recall |" in md and "**multi-hop**" in md


def test_policy_is_paired_with_its_own_no_search_row_over_all_and_the_multi_hop_rows():
    rows = add_intervals(compute_rows(records()), records(), resamples=200)
    by = {(r["method"], r["dataset"]): r for r in rows}
    all_pair, multi = by[("policy", ALL)]["paired"]["no_search"], by[("policy", MULTI_HOP)]["paired"]["no_search"]
    assert all_pair["n"] == 4 and all_pair["f1"][0] == pytest.approx(0.75)
    assert multi["n"] == 3 and multi["f1"] == [1.0, 1.0, 1.0]


def test_no_search_is_the_policy_checkpoint_with_its_searches_switched_off():
    from configs import load_config
    from pipelines.evaluate import _same_run, plan_methods

    cfg = load_config("configs/main_cpu.yaml", [])
    plans = {p.method: p for p in plan_methods(cfg, ["policy", "no_search"], None)}
    assert plans["no_search"].spec == plans["policy"].spec and plans["policy"].recipe_config["max_turns"] == 2
    assert plans["no_search"].recipe_config == {**plans["policy"].recipe_config, "searches": False}
    assert not _same_run(plans["policy"], plans["no_search"])
    s3 = load_config("configs/s3_main_cpu.yaml", [])  # select-only: no turn to search in, one run for both rows
    plans = {p.method: p for p in plan_methods(s3, ["policy", "no_search"], None)}
    assert _same_run(plans["policy"], plans["no_search"])


def test_a_search_written_with_searches_switched_off_is_not_run_and_the_answer_is_forced():
    recipe = get_recipe("search_r1", initial_search=True, force_answer=True, max_turns=2, searches=False,
                        invalid_feedback="\nTry again.\n")
    ep = recipe.start("Where?", [GOLD], OTHER, chat=False)
    assert recipe.step(ep, "no tag here").observation == "\nTry again.\n"  # an invalid turn keeps its retry
    turn = recipe.step(ep, "<search> Vellmar </search>")
    assert turn.skipped and not turn.needs_retrieval and ep.answer_forced and not ep.done
    recipe.step(ep, f" {GOLD} </answer>")
    assert ep.done and ep.final.answer == GOLD and search_record(ep).own_searches == 0


def test_the_expert_candidates_start_with_the_missing_supporting_title_as_a_shown_document_writes_it():
    cands = search_candidates("Where was the director of the film Quiet Harbor born?", [FILM], [FILM],
                              ["Quiet Harbor", "Ansel Kordova"])
    assert cands[0].query == "Ansel Kordova" and cands[0].reason.startswith("Doc 1 mentions Ansel Kordova")
    assert "Quiet Harbor" not in [c.query for c in cands]  # a title already shown is not searched again
    assert cands[-1].query == "Where was the director of the film Quiet Harbor born?"
    rest = [len(c.query.split()) for c in cands[1:-1]]
    assert rest == sorted(rest)  # the shortest first


def test_entity_phrases():
    assert entity_phrases("Who wrote The Bank of England report in 1990 with Mira Tolven?") == [
        "Bank of England", "Mira Tolven"]  # a leading question word or article dropped, the year too


def test_the_finding_term_pays_for_a_new_gold_document_not_for_a_search():
    """Search-R1's `found_reward`: paid once for a gold-holding document beyond the initial top-k that
    the policy's own search returned; a search that repeats the top-k, or none, earns nothing from it."""
    recipe = get_recipe("search_r1", initial_search=True, found_reward=0.5)

    def answered(ep, answer):
        ep.turns.append(Turn(f"<answer> {answer} </answer>", recipe.parse(f"<answer> {answer} </answer>")))
        recipe.finish(ep, "answer")
        return recipe.reward(ep)

    found = answered(episode([FILM], [[BORN, FILM]]), GOLD)
    assert found.components == {"em": 1.0, "found": 0.5} and found.total == 1.5
    repeated = answered(episode([BORN], [[BORN], [BORN]]), "x")
    assert repeated.components == {"em": 0.0, "found": 0.0}
    assert answered(episode(OTHER, []), GOLD).components == {"em": 1.0, "found": 0.0}
    stage = get_recipe("search_r1", initial_search=True, found_reward=1.0, outcome_weight=0.0)
    recipe = stage
    assert answered(episode([FILM], [[BORN]]), GOLD).total == 1.0  # a recall stage: the answer earns nothing
    assert get_recipe("search_r1").reward(episode([FILM], [[BORN]])).components == {"em": 0.0}  # off by default
