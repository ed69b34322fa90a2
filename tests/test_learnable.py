"""Learnable-question selection (pipelines/prepare/learnable.py): which questions GRPO can learn
from, the cache beside the index, and its invalidation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipelines.data import spread_sample
from pipelines.prepare import learnable
from pipelines.prepare.learnable import answer_scores, cache_path, is_learnable, select_learnable


def traj(qid, i, answer, golds=("Paris",), dataset="nq"):
    return {"group_id": f"{dataset}/{qid}", "sample_index": i, "golden_answers": list(golds),
            "final": {"answer": answer}}


def question(qid, dataset="nq", gold="Paris"):
    return {"id": qid, "question": f"q {qid}?", "golden_answers": [gold], "dataset": dataset}


def cfg(tmp_path, questions=4, samples=2):
    return SimpleNamespace(
        index=SimpleNamespace(dir=str(tmp_path / "idx")), retrieval=SimpleNamespace(topk=3),
        learner=SimpleNamespace(model="gemma3-270m"),
        train=SimpleNamespace(recipe="r1_searcher", select_questions=questions, select_samples=samples),
        rollout=SimpleNamespace(backend="vllm", chat=None, temperature=0.8, top_p=1.0, max_new_tokens_per_turn=128,
                                max_observation_tokens=256, max_total_tokens=2048),
        frozen=SimpleNamespace(model="gemma3-270m", judge_model=None, backend="vllm", max_model_len=4096,
                               max_answer_tokens=64))


@pytest.fixture(autouse=True)
def fake_index(monkeypatch):
    monkeypatch.setattr(learnable, "index_identity", lambda c: {"dir": c.index.dir, "num_docs": 10})


def test_scores_and_learnable():
    scores = answer_scores([traj("1", 1, "Paris"), traj("1", 0, "London"), traj("2", 0, None), traj("2", 1, "")])
    assert scores["nq/1"] == {"f1": [0.0, 1.0], "cover_em": [0.0, 1.0]}  # sample order
    assert scores["nq/2"]["f1"] == [0.0, 0.0]
    assert is_learnable([0.0, 1.0]) and is_learnable([0.5, 0.5, 0.0])
    assert not is_learnable([0.0, 0.0]) and not is_learnable([1.0, 1.0]) and not is_learnable([0.3])


def test_select_keeps_differing_questions_and_caches(tmp_path):
    pool = [question("a"), question("b"), question("c", "hotpotqa"), question("d", "hotpotqa")]
    calls = []

    def rollout(examples, n):
        calls.append([e["id"] for e in examples])
        answers = {"a": ["Paris", "Rome"], "b": ["Rome", "Rome"], "c": ["Paris", "Paris"], "d": ["Paris city", "no"]}
        return [traj(e["id"], i, answers[e["id"]][i], dataset=e["dataset"]) for e in examples for i in range(n)]

    c = cfg(tmp_path)
    kept, report = select_learnable(c, pool, {"stage": 2}, rollout, report_to=tmp_path / "learnable_questions.json")
    assert [q["id"] for q in kept] == ["a", "d"]
    written = json.loads((tmp_path / "learnable_questions.json").read_text())
    assert written["ids"] == ["a", "d"] and written["kept"] == 2
    assert report["kept"] == 2 and report["share_kept"] == 0.5 and not report["cached"]
    assert report["share_cover_em_hit"] == 0.75
    assert cache_path(c.index.dir, "x").parent == tmp_path / "idx.learnable"
    again, report2 = select_learnable(c, pool, {"stage": 2}, rollout)
    assert [q["id"] for q in again] == ["a", "d"] and report2["cached"] and len(calls) == 1
    select_learnable(c, pool, {"stage": 2, "prefill": "<x>"}, rollout)  # another prompt: rolled out again
    assert len(calls) == 2
    # For s3 the frozen generator's answers decide the selection; another generator is rolled out again.
    for field, value in (("model", "smollm2-135m-instruct"), ("max_answer_tokens", 16)):
        other = cfg(tmp_path)
        setattr(other.frozen, field, value)
        _, report3 = select_learnable(other, pool, {"stage": 2}, rollout)
        assert not report3["cached"], field
    assert len(calls) == 4


def test_a_warm_started_run_does_not_reuse_the_untrained_policys_selection(tmp_path):
    """The selection runs after the warm start, on the warm-started policy: a run with a warm start (or another one)
    rolls out again instead of reading the cache an untrained run of the same settings wrote."""
    from configs.schema_train import WarmStart

    pool = [question("a"), question("b")]
    calls = []

    def rollout(examples, n):
        calls.append(len(examples))
        return [traj(e["id"], i, ["Paris", "Rome"][i], dataset=e["dataset"]) for e in examples for i in range(n)]

    select_learnable(cfg(tmp_path), pool, {}, rollout)
    for ws in (WarmStart(source="expert", questions=8), WarmStart(source="expert", questions=8, epochs=2)):
        warm = cfg(tmp_path)
        warm.train.warm_start = ws
        _, report = select_learnable(warm, pool, {}, rollout)
        assert not report["cached"]
    again = cfg(tmp_path)
    again.train.warm_start = WarmStart(source="expert", questions=8)
    assert select_learnable(again, pool, {}, rollout)[1]["cached"] and len(calls) == 3


def test_select_with_nothing_learnable_says_what_to_change(tmp_path):
    def rollout(examples, n):
        return [traj(e["id"], i, "Rome") for e in examples for i in range(n)]

    with pytest.raises(ValueError, match="train.select_questions"):
        select_learnable(cfg(tmp_path), [question("a"), question("b")], {}, rollout)


def test_spread_sample_spreads_and_keeps_order():
    rows = [question(str(i), "a") for i in range(10)] + [question(str(i), "b") for i in range(10, 13)]
    picked = spread_sample(rows, 6, seed=0)
    assert sum(r["dataset"] == "b" for r in picked) == 3 and len(picked) == 6
    assert picked == sorted(picked, key=rows.index)
    assert spread_sample(rows, 6, seed=0) == picked and spread_sample(rows, None, 0) == rows
