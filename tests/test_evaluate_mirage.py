"""MIRAGE in evaluation (s3 §5 Table 2, A.4): asked beside the QA sets, scored by the judge alone,
reported in rows of its own after the QA `all` row."""

from __future__ import annotations

import pytest

from pipelines.evaluate import ALL, QARecord, _judge_flags, compute_rows, format_markdown, mirage_examples


class FakeRay:
    @staticmethod
    def get(values):
        return values


class FakeJudge:
    """`judge.judge.remote(answer, golds)` answering from a fixed set of yes-answers."""

    def __init__(self, yes: set[str]):
        self.judge = self
        self.yes = yes

    def remote(self, answer, golds):
        return answer in self.yes


def test_mirage_is_judged_by_the_judge_alone():
    # s3 A.4: "For ... MIRAGE ... we exclusively use judge_check": span_check would accept "A. yes" for gold
    # "yes" in a wrong answer listing every option.
    records = [
        {"answer": "A. yes B. no C. maybe", "golden_answers": ["A. yes", "yes"], "dataset": "mirage/pubmedqa"},
        {"answer": "A. yes", "golden_answers": ["A. yes", "yes"], "dataset": "mirage/pubmedqa"},
        {"answer": "Paris", "golden_answers": ["Paris"], "dataset": "nq"},  # span_check decides: judge not needed
    ]
    flags, verdicts = _judge_flags(FakeRay, FakeJudge({"A. yes"}), records)
    assert flags == [False, True, True] and verdicts == [False, True, False]


def test_mirage_rows_come_after_the_qa_all_row_and_stay_out_of_it():
    records = [
        QARecord("policy", "nq", "Paris", ("Paris",), 1, True),
        QARecord("policy", "hotpotqa", "London", ("Paris",), 2, False),
        QARecord("policy", "mirage/medqa", "B", ("B. Tell", "Tell"), 1, True),
        QARecord("policy", "mirage/bioasq", "no", ("A. yes", "yes"), 1, False),
        QARecord("policy", "mirage/bioasq", "yes", ("A. yes", "yes"), 1, True),
    ]
    rows = compute_rows(records)
    assert [r["dataset"] for r in rows] == ["hotpotqa", "nq", ALL, "multi-hop", "mirage/bioasq", "mirage/medqa",
                                            "mirage/all"]
    by = {r["dataset"]: r for r in rows}
    assert (by[ALL]["n"], by[ALL]["gen_acc"]) == (2, 0.5)
    assert (by["mirage/all"]["n"], by["mirage/all"]["gen_acc"]) == (3, pytest.approx(2 / 3))
    assert "| **policy** | **mirage/all** | **3** |" in format_markdown(rows)


def test_mirage_examples_list_the_options_and_spread_over_the_five_sets(data_dir):
    examples = mirage_examples(data_dir / "mirage.jsonl.gz", 10, seed=0)
    assert len(examples) == 10
    assert {e["dataset"] for e in examples} == {"mirage/medqa", "mirage/medmcqa", "mirage/pubmedqa", "mirage/bioasq",
                                                "mirage/mmlu"}
    pub = next(e for e in examples if e["dataset"] == "mirage/pubmedqa")
    assert "\nOptions:\nA. yes\nB. no\nC. maybe" in pub["question"]
    letter, text = pub["golden_answers"][0].split(". ", 1)
    assert letter in "ABC" and pub["golden_answers"][1] == text
