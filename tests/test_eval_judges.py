"""The papers' extra evaluation judges: R1-Searcher's ACC_L (§3.1, its Judge Prompt, True/False
verdicts) and R-Search-as-a-Tool (Fig. 2: another model answers from the policy's evidence, Table 5's
template), on scripted actor handles; their place in the result table; bad method lists refused
before any actor starts."""

from __future__ import annotations

import pytest

from configs import load_config
from pipelines.eval_judges import acc_l_verdicts, rstool_records
from pipelines.eval_rows import QARecord, compute_rows, format_markdown
from pipelines.evaluate import EvaluationError, plan_methods
from recipes.metrics import acc_l_prompt, parse_true_false
from recipes.r_search import EVIDENCE_PROMPT


class FakeRay:
    @staticmethod
    def get(values):
        return values


class Method:
    def __init__(self, fn):
        self.remote = fn


def test_acc_l_prompt_is_the_papers_judge_prompt():
    p = acc_l_prompt("Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"], "Shakespeare")
    assert p.startswith("Given a Question and its Golden Answer, verify whether the Predicted Answer is correct. "
                        "The prediction is correct if it fully aligns with the meaning and key information of the "
                        "Golden Answer. Respond with True if the prediction is correct and False otherwise.")
    assert p.endswith("Question: Who wrote Hamlet?\nGolden Answer: William Shakespeare | Shakespeare\n"
                      "Predicted Answer: Shakespeare")


@pytest.mark.parametrize("reply, verdict", [("True", True), ("true.", True), ("True, it matches", True),
                                            ("False", False), ("", False), ("The answer is true", False),
                                            ("Yes", False)])
def test_parse_true_false(reply, verdict):
    assert parse_true_false(reply) is verdict


def test_acc_l_asks_the_judge_for_every_non_empty_answer():
    asked = []

    def acc_l(question, golds, prediction):
        asked.append(prediction)
        return prediction == "Paris"

    judge = type("Judge", (), {"acc_l": Method(acc_l)})()
    records = [{"question": "q", "golden_answers": ["Paris"], "answer": a} for a in ("Paris", "Lyon", "", None)]
    assert acc_l_verdicts(FakeRay, judge, records) == [True, False, False, False]
    assert asked == ["Paris", "Lyon"]


def test_rstool_hands_the_policys_evidence_to_the_generator():
    calls = []

    def generate_answer(question, context, template):
        calls.append((question, context, template))
        return f"from [{context}]"

    generator = type("Gen", (), {"generate_answer": Method(generate_answer)})()
    policy = [{"question": "q1", "answer": "own answer", "evidence": "Doc: Paris is the capital.", "searches": 2},
              {"question": "q2", "answer": "x", "evidence": None, "searches": 0}]
    out = rstool_records(FakeRay, generator, policy, EVIDENCE_PROMPT)
    assert [r["answer"] for r in out] == ["from [Doc: Paris is the capital.]", "from []"]
    assert [r["searches"] for r in out] == [2, 0] and policy[0]["answer"] == "own answer"  # copies
    assert all(t == EVIDENCE_PROMPT for _, _, t in calls)


def test_acc_l_column_appears_only_when_asked():
    with_acc = [QARecord("policy", "nq", "Paris", ("Paris",), 1, True, True),
                QARecord("policy", "nq", "Lyon", ("Paris",), 1, False, False)]
    rows = compute_rows(with_acc)
    assert [r["acc_l"] for r in rows] == [0.5, 0.5] and "| ACC_L |" in format_markdown(rows)
    plain = compute_rows([QARecord("policy", "nq", "Paris", ("Paris",), 1, True)])
    assert "acc_l" not in plain[0] and "ACC_L" not in format_markdown(plain)


def test_rstool_needs_an_evidence_recipe_and_the_policy():
    with pytest.raises(EvaluationError, match="writes no evidence"):
        plan_methods(load_config(None, ["train.recipe=search_r1"]), ["policy", "rstool"], None)
    with pytest.raises(EvaluationError, match="add policy"):
        plan_methods(load_config(None, ["train.recipe=r_search"]), ["rstool"], None)
    plans = plan_methods(load_config(None, ["train.recipe=r_search"]), ["direct", "policy", "rstool"], None)
    assert [p.method for p in plans] == ["direct", "policy"]  # rstool runs no episodes of its own


@pytest.mark.slow
def test_evaluate_reports_acc_l_and_rstool_through_the_actors(ray_local, small_index, data_dir, gemma_dir, tmp_path):
    """`scripts.evaluate` with R-Search, `--methods policy,rstool` and `eval.acc_l=true` on 2 dev
    questions (tiny random Gemma policy and frozen LLM, transformers backend, the real pool)."""
    import json

    import yaml

    from actors.engines.models import make_tiny_model
    from scripts.evaluate import main

    policy = make_tiny_model("gemma3", tmp_path / "policy", tokenizer_from=gemma_dir, seed=0)
    frozen = make_tiny_model("gemma3", tmp_path / "frozen", tokenizer_from=gemma_dir, seed=1)
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"dir": str(data_dir)}, "index": {"dir": str(small_index), "num_shards": 2},
        "retrieval": {"query_encoders": 1}, "learner": {"model": policy},
        "rollout": {"backend": "hf", "max_model_len": 2048, "max_total_tokens": 2000, "max_new_tokens_per_turn": 16,
                    "cpus_per_worker": 0.5},
        "frozen": {"backend": "hf", "model": frozen, "max_model_len": 2048, "max_answer_tokens": 8, "num_cpus": 0.5},
        "train": {"recipe": "r_search", "recipe_options": {"max_turns": 1}}, "eval": {"acc_l": True},
    }))
    out = tmp_path / "eval"
    assert main(["--config", str(config), "--qa", str(data_dir / "dev.jsonl.gz"), "--out", str(out), "--limit", "2",
                 "--methods", "policy,rstool"]) == 0
    rows = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in rows if r["dataset"] == "all"] == ["policy", "rstool"]
    assert all(0.0 <= r["acc_l"] <= 1.0 for r in rows)
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["method"] for p in preds] == ["policy"] * 2 + ["rstool"] * 2
    assert all(isinstance(p["acc_l"], bool) for p in preds)
    assert all(p["acc_l"] is False for p in preds if not (p["answer"] or "").strip())
    assert "| ACC_L |" in (out / "results.md").read_text()
