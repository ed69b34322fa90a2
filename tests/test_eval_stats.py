"""The evaluation's statistics (pure, no Ray): bootstrap intervals and paired differences
(`pipelines.eval_stats`), their place in the result rows and results.md (`eval_rows.add_intervals`,
`format_intervals_markdown`), the predictions' turns (`prediction_line`), and that `untrained` runs
as `policy` does but for the weights (`plan_methods`)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

from actors.rollout.trajectory import TurnRecord
from pipelines.eval_rows import (
    ALL,
    QARecord,
    add_intervals,
    compute_rows,
    format_intervals_markdown,
    prediction_line,
    prediction_turns,
)
from pipelines.eval_stats import bootstrap_ci, bootstrap_means, paired_by_question, paired_difference

# ----------------------------------------------------------------------------- eval_stats


def test_ci_contains_the_mean_and_has_the_normal_width():
    rng = np.random.default_rng(1)
    em = (rng.random(400) < 0.3).astype(float)
    mean, lo, hi = bootstrap_ci(em)
    assert mean == pytest.approx(em.mean()) and lo < mean < hi
    half = 1.96 * np.sqrt(mean * (1 - mean) / em.size)  # the normal approximation's half-width
    assert hi - lo == pytest.approx(2 * half, rel=0.15)
    assert bootstrap_ci(em) == (mean, lo, hi)  # the fixed seed: reproducible
    assert bootstrap_ci(em, seed=5) != (mean, lo, hi)
    narrow = bootstrap_ci(em, confidence=0.5)
    assert lo < narrow[1] < narrow[2] < hi


def test_constant_series_has_a_zero_width_interval():
    for value in (0.0, 1.0, 0.25):
        mean, lo, hi = bootstrap_ci([value] * 17)
        assert mean == lo == hi == value


def test_bootstrap_means_shape_and_blocks():
    means = bootstrap_means([0.0, 1.0], resamples=1000, seed=3)  # more than one block of draws
    assert means.shape == (1000,) and set(np.unique(means)) <= {0.0, 0.5, 1.0}
    assert np.array_equal(means, bootstrap_means([0.0, 1.0], resamples=1000, seed=3))


def test_paired_difference_of_identical_series_is_exactly_zero():
    a = [0.0, 1.0, 0.5, 0.25, 1.0]
    assert paired_difference(a, list(a)) == (0.0, 0.0, 0.0)


def test_paired_difference_resamples_the_same_questions():
    """b = a − 0.1 on every question: the difference is 0.1 in every resample, a zero-width interval,
    though a alone has a wide one (unpaired resampling would give a wide difference too)."""
    rng = np.random.default_rng(0)
    a = rng.random(50)
    b = a - 0.1
    diff, lo, hi = paired_difference(a, b)
    assert diff == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    _, a_lo, a_hi = bootstrap_ci(a)
    assert a_hi - a_lo > 0.1
    d, dlo, dhi = paired_difference([1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0])
    assert d == 0.0 and dlo < 0.0 < dhi


def test_paired_by_question_matches_keys_not_positions():
    keys, a, b = paired_by_question({"q1": 1.0, "q2": 0.0, "q3": 1.0}, {"q3": 0.5, "q4": 0.0, "q1": 0.25})
    assert keys == ["q1", "q3"]
    assert a.tolist() == [1.0, 1.0] and b.tolist() == [0.25, 0.5]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: bootstrap_ci([]), r"values: empty"),
    (lambda: bootstrap_ci([[1.0, 0.0]]), r"values: expected a 1-D series.*\(1, 2\)"),
    (lambda: bootstrap_ci([1.0, float("nan")]), r"values: holds NaN or inf at index 1"),
    (lambda: bootstrap_ci([1.0], resamples=0), r"resamples=0: must be an integer >= 1"),
    (lambda: bootstrap_ci([1.0], confidence=1.0), r"confidence=1.0: must lie strictly between 0 and 1"),
    (lambda: paired_difference([], [1.0]), r"^a: empty"),
    (lambda: paired_difference([1.0], []), r"^b: empty"),
    (lambda: paired_difference([1.0, 0.0], [1.0]), r"b: 1 scores against a's 2"),
    (lambda: paired_by_question({"q1": 1.0}, {"q2": 1.0}), r"a and b share no question"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ----------------------------------------------------------------------------- rows and results.md


def _rec(method: str, qid: str, answer: str, dataset: str = "nq") -> QARecord:
    return QARecord(method, dataset, answer, ("Paris",), 1, answer == "Paris", qid=qid)


def test_add_intervals_pairs_by_question_id_not_position():
    """untrained answered the same questions as policy, in another order, plus one policy lacks:
    paired by id the difference is exactly 0 over the 4 shared questions; by position it would not be."""
    answers = {"q1": "Paris", "q2": "London", "q3": "Paris", "q4": "Rome"}
    policy = [_rec("policy", q, a) for q, a in answers.items()]
    untrained = [_rec("untrained", q, answers[q]) for q in ("q4", "q3", "q2", "q1")]
    untrained.append(_rec("untrained", "q5", "Paris"))  # policy has no record of q5: left out of the pairing
    records = policy + untrained + [_rec("direct", "q1", "Lyon")]
    rows = add_intervals(compute_rows(records), records)
    pooled = {r["method"]: r for r in rows if r["dataset"] == ALL}
    assert pooled["policy"]["paired"] == {"untrained": {"n": 4, "em": [0.0, 0.0, 0.0], "f1": [0.0, 0.0, 0.0],
                                                        "cover_em": [0.0, 0.0, 0.0]}}
    assert "paired" not in pooled["untrained"] and "paired" not in pooled["direct"]  # naive_rag not evaluated
    assert pooled["direct"]["ci"]["em"] == [0.0, 0.0]
    lo, hi = pooled["policy"]["ci"]["em"]
    assert lo <= pooled["policy"]["em"] == 0.5 <= hi
    assert all("ci" not in r for r in rows if r["dataset"] != ALL)  # the pooled rows only
    assert "ci" not in compute_rows(records)[0]  # the input rows are not modified


def test_add_intervals_paired_difference_values():
    """policy right on q1-q3, untrained on q1 only: EM difference 2/3, paired over those 3 questions;
    policy − naive_rag too; a question repeated in the file pairs occurrence by occurrence."""
    records = [_rec("policy", q, "Paris") for q in ("q1", "q2", "q3")]
    records += [_rec("untrained", "q1", "Paris"), _rec("untrained", "q2", "x"), _rec("untrained", "q3", "x")]
    records += [_rec("naive_rag", q, "Paris") for q in ("q3", "q2", "q1")]
    rows = add_intervals(compute_rows(records), records)
    paired = next(r for r in rows if (r["method"], r["dataset"]) == ("policy", ALL))["paired"]
    assert list(paired) == ["untrained", "naive_rag"]
    diff, lo, hi = paired["untrained"]["em"]
    assert diff == pytest.approx(2 / 3, abs=1e-6) and lo <= diff <= hi and hi == 1.0
    assert paired["naive_rag"]["em"] == [0.0, 0.0, 0.0]
    repeated = [_rec("policy", "q1", "Paris"), _rec("policy", "q1", "x"),
                _rec("untrained", "q1", "Paris"), _rec("untrained", "q1", "x")]
    rows = add_intervals(compute_rows(repeated), repeated)
    assert rows[1]["dataset"] == ALL
    assert rows[1]["paired"]["untrained"] == {"n": 2, "em": [0.0, 0.0, 0.0], "f1": [0.0, 0.0, 0.0],
                                              "cover_em": [0.0, 0.0, 0.0]}


def test_mirage_questions_are_paired_in_their_own_pool():
    records = [_rec("policy", "q1", "Paris"), _rec("untrained", "q1", "x"),
               _rec("policy", "m1", "Paris", "mirage/medqa"), _rec("untrained", "m1", "Paris", "mirage/medqa")]
    rows = {(r["method"], r["dataset"]): r for r in add_intervals(compute_rows(records), records)}
    assert rows[("policy", ALL)]["paired"]["untrained"]["em"] == [1.0, 1.0, 1.0]
    assert rows[("policy", "mirage/all")]["paired"]["untrained"]["em"] == [0.0, 0.0, 0.0]


def test_format_intervals_markdown():
    records = [_rec("policy", q, a) for q, a in (("q1", "Paris"), ("q2", "x"))]
    records += [_rec("untrained", q, "x") for q in ("q1", "q2")]
    text = format_intervals_markdown(add_intervals(compute_rows(records), records))
    lines = text.splitlines()
    assert lines[0] == "## 95% bootstrap intervals (percentile, 2000 resamples over questions, seed 0)"
    assert lines[2] == "| method | dataset | n | EM | F1 | cover-EM |"
    assert re.fullmatch(r"\| policy \| all \| 2 \| 0\.500 \[0\.000, 1\.000\] \| .* \| .* \|", lines[4])
    assert lines[5] == "| untrained | all | 2 | 0.000 [0.000, 0.000] | 0.000 [0.000, 0.000] | 0.000 [0.000, 0.000] |"
    assert lines[7] == "Paired over the same questions (all: 2 questions both answered):"
    assert lines[9] == "| metric | policy − untrained | 95% CI |"
    assert lines[11] == "| EM | 0.500 | [0.000, 1.000] |"
    assert len(lines) == 14 and text.endswith("|\n")
    assert format_intervals_markdown(compute_rows(records)) == ""  # rows without intervals


# ----------------------------------------------------------------------------- predictions.jsonl


def _turn(action: str, query: str | None, doc_ids: list[str]) -> TurnRecord:
    return TurnRecord(text=f"<{action}>", action=action, query=query, doc_ids=doc_ids, generated_tokens=5,
                      observation_tokens=9, finish_reason="stop", generate_s=0.1, search_s=0.2)


def test_prediction_line_from_the_eval_workers_record():
    """`EvalWorker.run_final`'s record: turns as dicts, `answer_forced` beside them."""
    record = {"id": "q1", "dataset": "nq", "answer": None, "searches": 1, "finish_reason": "max_turns",
              "answer_forced": False,
              "turns": [{"text": "<q>", "action": "search", "query": "q", "doc_ids": ("d1",), "finish_reason": "stop"}]}
    line = prediction_line("policy", "r1_searcher", record, gen_acc=False, judge=None, acc_l=None)
    assert line["turns"] == [{"text": "<q>", "action": "search", "query": "q", "doc_ids": ["d1"],
                              "finish_reason": "stop"}]
    assert (line["answer_forced"], line["finish_reason"], line["searches"]) == (False, "max_turns", 1)


def test_prediction_line_holds_the_turns():
    turns = [_turn("search", "capital of France", ["d1", "d2"]), _turn("answer", None, [])]
    want = [{"text": "<search>", "action": "search", "query": "capital of France", "doc_ids": ["d1", "d2"],
             "finish_reason": "stop"},
            {"text": "<answer>", "action": "answer", "query": None, "doc_ids": [], "finish_reason": "stop"}]
    assert prediction_turns(turns) == want
    record = {"id": "q1", "dataset": "nq", "answer": "Paris", "finish_reason": "answer", "turns": turns,
              "answer_forced": True}
    line = prediction_line("policy", "r1_searcher", record, gen_acc=True, judge=None, acc_l=None)
    assert line["turns"] == want and line["answer_forced"] is True and line["finish_reason"] == "answer"
    assert (line["method"], line["recipe"], line["gen_acc"], line["judge"], line["acc_l"]) == (
        "policy", "r1_searcher", True, None, None)
    assert record["turns"] is turns  # the record is not modified


def test_prediction_line_from_a_trajectory_dict():
    """A record carrying `Trajectory.to_json`: its turns and final's answer_forced, not its token ids."""
    traj = {"turns": [vars(_turn("search", "q", ["d9"]))], "final": {"answer": None}, "finish_reason": "invalid",
            "response_ids": [1, 2, 3]}
    line = prediction_line("untrained", "r1_searcher", {"id": "q1", "answer": None, "trajectory": traj},
                           gen_acc=False, judge=None, acc_l=None)
    assert line["turns"] == [{"text": "<search>", "action": "search", "query": "q", "doc_ids": ["d9"],
                              "finish_reason": "stop"}]
    assert line["answer_forced"] is None and line["finish_reason"] == "invalid"  # no answer_forced key: None
    assert "trajectory" not in line
    traj["final"]["answer_forced"] = False
    assert prediction_line("untrained", "r", {"trajectory": traj}, gen_acc=False, judge=None,
                           acc_l=None)["answer_forced"] is False


def test_baseline_prediction_lines_pass_through():
    record = {"id": "q1", "dataset": "nq", "answer": "Paris", "context": None, "finish_reason": "answer"}
    want = {"method": "naive_rag", "recipe": "naive_rag", **record, "gen_acc": True, "judge": True, "acc_l": None}
    assert prediction_line("naive_rag", "naive_rag", record, gen_acc=True, judge=True, acc_l=None,
                           searcher=False) == want
    with_turns = {**record, "turns": [_turn("answer", None, [])]}  # a worker that returns every recipe's turns
    assert prediction_line("naive_rag", "naive_rag", with_turns, gen_acc=True, judge=True, acc_l=None,
                           searcher=False) == want


# ----------------------------------------------------------------------------- untrained = policy's run


def test_untrained_runs_like_policy_but_for_the_weights(tmp_path):
    """Staged R1-Searcher: policy (a checkpoint) and untrained get the same recipe, options (training
    options, the last stage's, eval.topk / eval.max_turns), limits and chat; the engine spec differs in
    its model only. Sampling is one `eval_sampling(cfg)` for every method."""
    from configs import load_config
    from pipelines.evaluate import eval_sampling, plan_methods

    ckpt = tmp_path / "ckpt" / "policy" / "hf"
    ckpt.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (ckpt / name).write_text("{}")
    config = tmp_path / "staged.yaml"
    config.write_text(yaml.safe_dump({
        "train": {"recipe": "r1_searcher", "recipe_options": {"max_turns": 3},
                  "stages": [{"steps": 1, "recipe_options": {"stage": 1}},
                             {"steps": 1, "recipe_options": {"stage": 2}}]},
        "eval": {"topk": 4}, "rollout": {"chat": False},
    }))
    cfg = load_config(config, [])
    plans = {p.method: p for p in plan_methods(cfg, ["policy", "untrained"], str(tmp_path / "ckpt"))}
    policy, untrained = plans["policy"], plans["untrained"]
    assert policy.recipe == untrained.recipe == "r1_searcher"
    assert policy.recipe_config == untrained.recipe_config
    assert {k: policy.recipe_config[k] for k in ("stage", "max_turns", "topk")} == {"stage": 2, "max_turns": 3,
                                                                                     "topk": 4}
    assert (policy.limits, policy.chat, policy.resources) == (untrained.limits, untrained.chat, untrained.resources)
    assert policy.spec.model == str(ckpt.resolve()) and untrained.spec.model == cfg.learner.model
    assert policy.spec.model_copy(update={"model": untrained.spec.model}) == untrained.spec
    assert eval_sampling(cfg) == {"temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p, "seed": cfg.seed}
