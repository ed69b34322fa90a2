"""scripts.compare_evals: two evaluations' predictions.jsonl paired question by question."""

import json

import pytest

from pipelines.eval_rows import prediction_line
from scripts import compare_evals

GOLD = {"q1": "Paris", "q2": "Rome", "q3": "Oslo", "q4": "Bern"}


def _eval_dir(tmp_path, name, answers, method="policy", dataset="hotpotqa", order=None, search=None):
    """An evaluation directory whose predictions.jsonl answers `answers[qid]` for each question (in `order`);
    `search[qid]`: (initial_hit, found_by_search) of that question's search record."""
    d = tmp_path / name
    d.mkdir()
    lines = []
    for qid in order or list(answers):
        record = {"id": qid, "dataset": dataset, "question": f"where {qid}?", "golden_answers": [GOLD[qid]],
                  "answer": answers[qid], "searches": 2, "finish_reason": "answer",
                  "search": {"own_searches": 1, "retrieval_hit": qid != "q4", "gold_paragraph_recall": None}}
        if search is not None:
            record["search"].update(initial_hit=search[qid][0], found_by_search=search[qid][1])
        lines.append(prediction_line(method, "search_r1", record, gen_acc=False, judge=None, acc_l=None))
    (d / "predictions.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return d


def test_pairs_by_question_id_not_by_line_order(tmp_path):
    a = _eval_dir(tmp_path, "rl", {"q1": "Paris", "q2": "Rome", "q3": "Oslo", "q4": "nope"})
    # B answers q1 right only, and lists the questions in another order: pairing by position would mix them
    b = _eval_dir(tmp_path, "warm", {"q1": "Paris", "q2": "x", "q3": "y", "q4": "Bern"},
                  order=["q4", "q3", "q2", "q1"])
    rows, md = compare_evals.compare(str(a), str(b), ("rl", "warm_start"))
    rl_all = next(r for r in rows if r["method"] == "rl" and r["dataset"] == "all")
    p = rl_all["paired"]["warm_start"]
    assert p["n"] == 4
    assert p["em"][0] == pytest.approx((1 + 1 - 1) / 4)   # q2, q3 gained; q4 lost
    assert rl_all["own_searches_per_question"] == 1 and rl_all["retrieval_recall"] == pytest.approx(0.75)
    assert "rl − warm_start" in md and "multi-hop" in md   # hotpotqa pools into the multi-hop row too


def test_same_file_two_methods_and_default_names(tmp_path):
    a = _eval_dir(tmp_path, "ev", {"q1": "Paris", "q2": "Rome"})
    with open(a / "predictions.jsonl", "a") as f:
        for qid in ("q1", "q2"):
            f.write(json.dumps(prediction_line("no_search", "search_r1", {
                "id": qid, "dataset": "hotpotqa", "golden_answers": [GOLD[qid]], "answer": "no", "searches": 1},
                gen_acc=False, judge=None, acc_l=None)) + "\n")
    rows, _ = compare_evals.compare(f"{a}", f"{a}:no_search")
    assert {r["method"] for r in rows} == {"policy", "no_search"}
    p = next(r for r in rows if r["method"] == "policy" and r["dataset"] == "all")["paired"]["no_search"]
    assert p["n"] == 2 and p["em"][0] == pytest.approx(1.0)
    # the same method in both files: named (A) and (B)
    b = _eval_dir(tmp_path, "ev2", {"q1": "x", "q2": "Rome"})
    rows, _ = compare_evals.compare(str(a), str(b / "predictions.jsonl"))
    assert {r["method"] for r in rows} == {"policy (A)", "policy (B)"}
    p = next(r for r in rows if r["method"] == "policy (A)" and r["dataset"] == "all")["paired"]["policy (B)"]
    assert p["f1"][0] == pytest.approx(0.5)


def test_errors_name_the_fix(tmp_path, capsys):
    a = _eval_dir(tmp_path, "a", {"q1": "Paris"})
    b = _eval_dir(tmp_path, "b", {"q2": "Rome"})
    with pytest.raises(ValueError, match="share no question"):
        compare_evals.compare(str(a), str(b))
    with pytest.raises(ValueError, match=r"no method 'untrained'.*\['policy'\]"):
        compare_evals.compare(f"{a}:untrained", str(a))
    with pytest.raises(ValueError, match="same name twice"):
        compare_evals.compare(str(a), str(a), ("x", "x"))
    with pytest.raises(FileNotFoundError, match="scripts.evaluate"):
        compare_evals.compare(str(tmp_path / "missing"), str(a))
    assert compare_evals.main([str(tmp_path / "missing"), str(a)]) == 2
    assert "error:" in capsys.readouterr().err


def test_main_prints_and_writes(tmp_path, capsys):
    a = _eval_dir(tmp_path, "a", {"q1": "Paris", "q2": "Rome"})
    b = _eval_dir(tmp_path, "b", {"q1": "x", "q2": "Rome"})
    out = tmp_path / "paired.md"
    assert compare_evals.main([str(a), str(b), "--names", "rl", "warm", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| metric | rl − warm | 95% CI |" in printed and out.read_text() == printed


def test_by_search_splits_the_paired_questions_by_what_a_s_own_search_found(tmp_path, capsys):
    """A answers right only where its own search found the gold beyond the top-k (q3, q4); B (its `no_search`)
    only where the top-k held it (q1): the parts say the search is why A wins, and where A lost."""
    parts = {"q1": (True, True), "q2": (True, False), "q3": (False, True), "q4": (False, True)}
    a = _eval_dir(tmp_path, "a", {"q1": "x", "q2": "Rome", "q3": "Oslo", "q4": "Bern"}, search=parts)
    b = _eval_dir(tmp_path, "b", {"q1": "Paris", "q2": "Rome", "q3": "x", "q4": "y"}, order=["q4", "q2", "q1", "q3"])
    got, md = compare_evals.by_search(str(a), str(b), ("policy", "no_search"))
    by_part = {p["part"]: p for p in got}
    found = by_part["top-k holds none; A's search found one"]
    assert found["n"] == 2 and found["f1_a"] == 1.0 and found["f1_b"] == 0.0 and found["paired"][0] == 1.0
    lost = by_part["top-k holds a gold answer; A's search found another"]
    assert lost["n"] == 1 and lost["f1_a"] == 0.0 and lost["paired"] is None  # one question: no interval
    assert by_part["top-k holds none; nor did A's search"]["n"] == 0
    assert "| top-k holds none; A's search found one | 2 | 1.000 | 0.000 | 1.000 [1.000, 1.000] |" in md
    assert compare_evals.main([str(a), str(b), "--by-search"]) == 0
    assert "Answer F1 by A's search" in capsys.readouterr().out
    # B first: its lines carry no initial_hit, so there is nothing to split by
    with pytest.raises(ValueError, match="no search record"):
        compare_evals.by_search(str(b), str(a))
