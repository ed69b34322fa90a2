"""The evaluation pipeline: row math and Markdown (pure), checkpoint / argument errors before any
actor starts, and one end-to-end CLI run through the real actors on the local Ray cluster."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from pipelines.eval_rows import MULTI_HOP
from pipelines.evaluate import (
    ALL,
    EvaluationError,
    QARecord,
    compute_rows,
    evaluate,
    format_intervals_markdown,
    format_markdown,
    load_questions,
    parse_methods,
    resolve_checkpoint,
)

ROW_KEYS = {"method", "dataset", "n", "em", "f1", "cover_em", "span_check", "gen_acc", "searches_per_question"}


def _records() -> list[QARecord]:
    return [
        QARecord("s3", "nq", "Paris", ("Paris",), 2, True),
        # F1: "city of paris" vs "paris" -> P 1/3, R 1 -> 0.5; covered, span found.
        QARecord("s3", "hotpotqa", "the city of Paris", ("Paris",), 4, True),
        # Wrong on every rule metric; the judge said yes (GenAcc = span_check OR judge).
        QARecord("s3", "hotpotqa", "London", ("Paris", "Lyon"), 1, True),
        QARecord("s3", "hotpotqa", None, ("x",), 0, False),  # no answer: scores 0
        QARecord("direct", "nq", "paris.", ("Paris",), 0, True),
    ]


def test_compute_rows_hand_computed():
    rows = compute_rows(_records())
    assert [(r["method"], r["dataset"]) for r in rows] == [
        ("s3", "hotpotqa"), ("s3", "nq"), ("s3", ALL), ("s3", "multi-hop"), ("direct", "nq"), ("direct", ALL)]
    assert all(set(r) == ROW_KEYS for r in rows)  # no search columns: these records carry no search
    hotpot, nq, s3_all, s3_multi, direct_nq, direct_all = rows
    assert {k: v for k, v in s3_multi.items() if k != "dataset"} == {k: v for k, v in hotpot.items() if k != "dataset"}
    expect = {
        "hotpot": (hotpot, 3, 0.0, 0.5 / 3, 1 / 3, 1 / 3, 2 / 3, 5 / 3),
        "nq": (nq, 1, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0),
        # `all` = mean over the 4 questions (micro), e.g. EM 1/4, not the dataset mean (0 + 1) / 2.
        "all": (s3_all, 4, 0.25, 0.375, 0.5, 0.5, 0.75, 1.75),
        "direct": (direct_nq, 1, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0),
    }
    for name, (row, n, em, f1, cover, span, gen, searches) in expect.items():
        got = (row["n"], row["em"], row["f1"], row["cover_em"], row["span_check"], row["gen_acc"],
               row["searches_per_question"])
        assert got == pytest.approx((n, em, f1, cover, span, gen, searches)), name
    assert s3_all["em"] != pytest.approx((hotpot["em"] + nq["em"]) / 2)
    assert {k: v for k, v in direct_all.items() if k != "dataset"} == {
        k: v for k, v in direct_nq.items() if k != "dataset"}


def test_format_markdown():
    text = format_markdown(compute_rows(_records()), title="Eval")
    lines = text.splitlines()
    assert lines[:2] == ["# Eval", ""]
    assert lines[2] == "| method | dataset | n | EM | F1 | cover-EM | span_check | GenAcc | searches/q |"
    assert lines[3].startswith("| --- | --- | ---: |")
    assert lines[4] == "| s3 | hotpotqa | 3 | 0.000 | 0.167 | 0.333 | 0.333 | 0.667 | 1.67 |"
    assert lines[6] == ("| **s3** | **all** | **4** | **0.250** | **0.375** | **0.500** | **0.500** | **0.750** "
                        "| **1.75** |")
    assert lines[7].startswith("| **s3** | **multi-hop** | **3** |")  # HotpotQA pooled as the multi-hop row
    assert len(lines) == 4 + 6 and text.endswith("|\n")
    assert format_markdown([]).count("\n") == 2  # header only


def test_parse_methods():
    assert parse_methods("direct, policy,direct") == ["direct", "policy"]
    with pytest.raises(EvaluationError, match="--methods.*unknown.*'rag'.*direct,naive_rag,policy,no_search,untrained"):
        parse_methods("direct,rag")


def _fake_model_dir(d):
    d.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (d / name).write_text("{}")
    return d


def test_sample_spreads_over_datasets(data_dir):
    """The pack's test split is sorted by dataset: its first 64 questions are one dataset, a sample of
    64 holds every dataset (10-11 each of 6), is seeded, keeps file order and has no repeats."""
    first = load_questions("test.jsonl.gz", data_dir, 64)
    assert len({q["dataset"] for q in first}) == 1
    everything = load_questions("test.jsonl.gz", data_dir)
    datasets = {q["dataset"] for q in everything}
    sample = load_questions("test.jsonl.gz", data_dir, 64, sample_seed=0)
    counts = {d: sum(q["dataset"] == d for q in sample) for d in datasets}
    assert len(sample) == 64 and len({q["id"] for q in sample}) == 64
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    order = {q["id"]: i for i, q in enumerate(everything)}
    assert [order[q["id"]] for q in sample] == sorted(order[q["id"]] for q in sample)
    assert sample == load_questions("test.jsonl.gz", data_dir, 64, sample_seed=0)
    assert sample != load_questions("test.jsonl.gz", data_dir, 64, sample_seed=1)
    assert load_questions("test.jsonl.gz", data_dir, 5000, sample_seed=0) == everything


def test_resolve_checkpoint_layouts(tmp_path):
    hf = _fake_model_dir(tmp_path / "ckpt" / "policy" / "hf")
    assert resolve_checkpoint(tmp_path / "ckpt") == str(hf.resolve())  # the learner's layout
    assert resolve_checkpoint(hf) == str(hf.resolve())  # a model directory itself
    (tmp_path / "broken" / "policy" / "hf").mkdir(parents=True)
    with pytest.raises(EvaluationError, match=r"broken.*policy/hf: no config\.json, weights"):
        resolve_checkpoint(tmp_path / "broken")
    run = tmp_path / "run"  # a run directory: its newest finished checkpoint, as scripts.serve takes it
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(EvaluationError, match="--checkpoint .*: a run directory with no complete checkpoint"):
        resolve_checkpoint(run)
    from pipelines.checkpoints import STATE_FILE

    for step in (4, 8):
        _fake_model_dir(run / "checkpoints" / f"step-{step}" / "policy" / "hf")
        (run / "checkpoints" / f"step-{step}" / STATE_FILE).write_text("{}")
    assert resolve_checkpoint(run) == str((run / "checkpoints" / "step-8" / "policy" / "hf").resolve())


def test_bad_checkpoint_fails_before_any_actor(tmp_path, monkeypatch, capsys):
    import actors.retrieval.pool
    import cluster.ray_init
    from configs import load_config
    from scripts.evaluate import main

    def no_actors(*a, **k):
        raise AssertionError("an actor or Ray was started before the checkpoint was checked")

    monkeypatch.setattr(cluster.ray_init, "init_ray", no_actors)
    monkeypatch.setattr(actors.retrieval.pool, "start_retrieval_pool", no_actors)
    missing = tmp_path / "no-such-ckpt"
    cfg = load_config(None, [])
    with pytest.raises(EvaluationError, match=f"--checkpoint {missing}: does not exist"):
        evaluate(cfg, "dev.jsonl.gz", tmp_path / "out", checkpoint=missing, limit=1)
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(missing), "--qa", "dev.jsonl.gz", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"error: --checkpoint {missing}: does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_evaluate_end_to_end_through_the_actors(ray_local, small_index, data_dir, gemma_dir, tmp_path, capsys):
    """`scripts.evaluate` on the first 3 dev questions: direct + naive_rag + policy + no_search + expert (s3,
    max_turns 2).

    Engines: the "hf" (transformers) backend everywhere, for start-up in seconds on 2 cores. The
    policy is a tiny random Gemma 3 written in the learner's checkpoint layout (`<ckpt>/policy/hf`);
    the generator and judge are another tiny random Gemma 3 (real tokenizer). Retrieval: the real
    RetrievalPool over the 2-shard `small_index`, on the session's Ray cluster (joined, not shut down).
    """
    from actors.engines.models import make_tiny_model
    from scripts.evaluate import main

    ckpt = tmp_path / "ckpt"
    make_tiny_model("gemma3", ckpt / "policy" / "hf", tokenizer_from=gemma_dir, seed=0)
    frozen = make_tiny_model("gemma3", tmp_path / "frozen", tokenizer_from=gemma_dir, seed=1)
    out = tmp_path / "eval"
    config = tmp_path / "eval.yaml"  # recipe_options is a dict: a config file, not a key=value override
    config.write_text(yaml.safe_dump({
        "data": {"dir": str(data_dir)},
        "index": {"dir": str(small_index), "num_shards": 2},
        "retrieval": {"query_encoders": 1},
        "rollout": {"backend": "hf", "max_model_len": 2048, "max_total_tokens": 2000, "max_new_tokens_per_turn": 16,
                    "cpus_per_worker": 0.5},
        "frozen": {"backend": "hf", "model": frozen, "max_model_len": 2048, "max_answer_tokens": 8, "num_cpus": 0.5},
        "train": {"recipe": "s3", "recipe_options": {"max_turns": 2}},
    }))
    code = main(["--config", str(config), "--checkpoint", str(ckpt), "--qa", str(data_dir / "dev.jsonl.gz"),
                 "--out", str(out), "--limit", "3", "--methods", "direct,naive_rag,policy,no_search,expert"])
    assert code == 0
    assert ray_local.is_initialized()  # a running cluster is joined and left running

    rows = json.loads((out / "results.json").read_text())
    methods = ["direct", "naive_rag", "policy", "no_search", "expert"]
    assert [r["method"] for r in rows if r["dataset"] == ALL] == methods
    pooled = (ALL, MULTI_HOP)
    for r in rows:  # pooled rows: bootstrap intervals; policy's and expert's also paired differences (naive_rag, ...)
        paired = r["method"] in ("policy", "expert")
        extra = set() if r["dataset"] not in pooled else {"ci", "paired"} if paired else {"ci"}
        if r["method"] != "direct":  # every method that retrieves: the search itself
            extra |= {"own_searches_per_question", "retrieval_recall", "context_recall"}  # s3 and RAG: a generator reads
        assert ROW_KEYS | extra <= set(r) <= ROW_KEYS | extra | {"gold_paragraph_recall"}
        for m in ("em", "f1", "cover_em", "span_check", "gen_acc"):
            assert 0.0 <= r[m] <= 1.0 and not math.isnan(r[m])
        assert r["span_check"] <= r["gen_acc"]  # GenAcc = span_check OR judge
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        assert [r["n"] for r in mine if r["dataset"] == ALL] == [3]
        assert sum(r["n"] for r in mine if r["dataset"] not in pooled) == 3
    by = {r["method"]: r for r in rows if r["dataset"] == ALL}
    searches = {m: r["searches_per_question"] for m, r in by.items()}
    assert searches["direct"] == 0.0 and searches["naive_rag"] == 1.0
    assert 1.0 <= searches["policy"] <= 3.0  # s3: the initial top-k + at most max_turns searches
    assert by["policy"]["own_searches_per_question"] == searches["policy"] - 1.0  # the initial top-k not counted
    assert searches["no_search"] == 1.0 and by["no_search"]["own_searches_per_question"] == 0.0  # searches off
    assert by["naive_rag"]["own_searches_per_question"] == 0.0
    assert by["no_search"]["retrieval_recall"] == by["naive_rag"]["retrieval_recall"]  # the same top-3 shown
    assert by["policy"]["retrieval_recall"] >= by["no_search"]["retrieval_recall"]
    assert by["naive_rag"]["context_recall"] == by["naive_rag"]["retrieval_recall"]  # RAG's generator reads all it shows
    assert by["policy"]["context_recall"] <= by["policy"]["retrieval_recall"]  # s3's generator reads what it selected
    assert by["policy"]["paired"]["no_search"]["n"] == 3
    # the s3 expert selects every shown document that holds a gold answer: its generator reads at least what
    # naive RAG's reads wherever the top-3 holds one; the tiny random policy's selections do not
    assert by["expert"]["context_recall"] >= by["naive_rag"]["context_recall"]
    assert by["expert"]["paired"]["naive_rag"]["n"] == 3

    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 15
    expert = [p for p in preds if p["method"] == "expert"]
    assert all(t["text"].rstrip().endswith(("</important_info>", "</query>", "</search_complete>"))
               for p in expert for t in p["turns"])  # the expert's s3 turns: each writes a selection
    assert all(len(p["search"]["shown_doc_ids"]) >= 3 for p in preds if p["method"] != "direct")
    s3_preds = [p for p in preds if p["method"] == "policy"]
    assert all(p["recipe"] == "s3" and isinstance(p["answer"], str) for p in s3_preds)  # the generator's answers
    assert any(p["context"].startswith("Doc 1(Title:") for p in s3_preds)  # the searcher's selected documents

    md = (out / "results.md").read_text()
    assert md.startswith("# Evaluation on dev.jsonl.gz (3 questions): recipe s3")
    table = format_markdown(rows)
    assert "\n\n" + table + "\nGenAcc judge (" in md and "| **policy** | **all** | **3** |" in table
    assert md.endswith(format_intervals_markdown(rows)) and "| metric | policy − naive_rag | 95% CI |" in md
    agreement = json.loads((out / "judge_agreement.json").read_text())
    assert agreement["span_positive"] + agreement["no_overlap"] <= sum(p["judge"] is not None for p in preds)
    assert all(p["judge"] is None for p in preds if not (p["answer"] or "").strip())
    printed = capsys.readouterr().out
    assert table in printed  # the CLI prints the table, then each method's seconds per question
    timing = json.loads((out / "timing.json").read_text())
    assert set(timing) == set(methods)
    assert all(t["questions"] == 3 and t["s_per_question"] > 0 for t in timing.values())
    assert f"seconds per question: direct {timing['direct']['s_per_question']:.2f}, naive_rag " in printed

    # The naive-RAG row is the generator's own naive RAG (it once was the untrained s3 searcher):
    # the frozen model, run here on its own with the naive_rag recipe, gives the same answers.
    import ray

    from actors.engines.spec import EngineSpec
    from actors.retrieval.pool import start_retrieval_pool
    from actors.rollout.eval_worker import EvalWorker
    from configs.loader import load_config

    cfg = load_config(str(config))
    pool = start_retrieval_pool(str(small_index), cfg.retrieval)
    worker = ray.remote(EvalWorker).options(num_cpus=0.5).remote(
        EngineSpec(backend="hf", model=frozen, max_model_len=2048), pool)
    examples = load_questions(data_dir / "dev.jsonl.gz", None, 3)
    own = ray.get(worker.run_final.remote(examples, "naive_rag", recipe_config={"topk": 3},
                                          sampling={"temperature": 0.0, "seed": cfg.seed},
                                          limits={"max_new_tokens_per_turn": 8, "max_total_tokens": 2048}))
    ray.kill(worker), ray.kill(pool)
    rag = [p for p in preds if p["method"] == "naive_rag"]
    assert all(p["recipe"] == "naive_rag" and "turns" not in p for p in rag)
    assert [p["answer"] for p in rag] == [r["answer"] for r in own]


def test_judge_agreement_where_the_rules_decide():
    from pipelines.evaluate import agreement_note, judge_agreement

    recs = [{"answer": "It was Paris.", "golden_answers": ["Paris"]},      # span: the judge should say yes
            {"answer": "Paris", "golden_answers": ["Paris", "City of Light"]},
            {"answer": "London", "golden_answers": ["Paris"]},              # no shared token: should say no
            {"answer": "Paris Hilton", "golden_answers": ["Paris, France"]},  # shares a token, no span: undecided
            {"answer": "", "golden_answers": ["Paris"]}]                    # never asked
    a = judge_agreement(recs, [True, False, True, True, None])
    assert (a["span_positive"], a["no_overlap"]) == (2, 1)
    assert a["judge_yes_on_span_positive"] == 0.5 and a["judge_no_on_no_overlap"] == 0.0
    assert a["agreement"] == pytest.approx(1 / 3) and not a["trusted"]
    assert "cannot judge" in agreement_note(a, "gemma3-270m")
    good = judge_agreement(recs, [True, True, False, False, None])
    assert good["agreement"] == 1.0 and good["trusted"] and "can be read" in agreement_note(good, "qwen")
    assert judge_agreement(recs[3:], [True, None])["agreement"] is None


def test_every_method_plans_its_own_system():
    """A baseline is the frozen generator answering with the baseline's own recipe, whatever
    recipe trains (naive_rag is trainable, and was once planned as the training recipe on the policy
    model, so "naive RAG" measured the untrained searcher). Only `policy` and `untrained` run the
    training recipe (and `expert`, the recipe's expert in the policy's place); without a checkpoint policy and
    untrained are the same system and may share a plan."""
    from pathlib import Path

    from actors.engines.spec import engine_spec
    from configs.loader import load_config
    from pipelines.evaluate import _same_run, plan_methods

    methods = ["direct", "naive_rag", "policy", "untrained", "expert"]
    for path in sorted(Path("configs").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        if "train" not in raw and "base" not in raw:
            continue  # a retrieval-only config
        cfg = load_config(str(path))
        plans = {p.method: p for p in plan_methods(cfg, methods, None)}
        generator = engine_spec(cfg, "generator")
        for name in ("direct", "naive_rag"):
            assert plans[name].recipe == name and plans[name].spec == generator, (path, name)
        assert plans["untrained"].recipe == plans["policy"].recipe == cfg.train.recipe, path
        assert plans["untrained"].spec.model == cfg.learner.model, path
        for a in methods:
            for b in methods:
                if a < b and {a, b} != {"policy", "untrained"}:
                    assert not _same_run(plans[a], plans[b]), (path, a, b)
        assert _same_run(plans["policy"], plans["untrained"]), path
        # the expert writes in the policy's place: the policy's engine (its tokenizer), its own run
        assert plans["expert"].spec == plans["policy"].spec and plans["expert"].recipe == cfg.train.recipe, path
        assert plans["expert"].expert and not any(p.expert for m, p in plans.items() if m != "expert"), path


def test_seconds_per_question_of_each_method():
    from pipelines.evaluate import method_timing, timing_line

    timing = method_timing({"direct": 2.0, "naive_rag": 8.0, "policy": 31.0}, 10)
    assert timing["policy"] == {"seconds": 31.0, "questions": 10, "s_per_question": 3.1}
    assert timing_line(timing) == "seconds per question: direct 0.20, naive_rag 0.80, policy 3.10"


def test_the_warm_start_row_is_the_runs_warm_started_policy(tmp_path, tiny_gemma_dir):
    import shutil

    from configs import Config
    from pipelines.evaluate import EvaluationError, plan_methods
    from pipelines.eval_inputs import resolve_warm_start

    run = tmp_path / "run"
    model = run / "checkpoints" / "warm-start" / "policy" / "hf"
    shutil.copytree(tiny_gemma_dir, model)
    shutil.copytree(tiny_gemma_dir, run / "checkpoints" / "step-3" / "policy" / "hf")
    assert resolve_warm_start(run) == str(model.resolve())
    assert resolve_warm_start(run / "checkpoints" / "step-3") == str(model.resolve())  # a checkpoint of that run
    with pytest.raises(EvaluationError, match="--methods warm_start: .*trained with train.warm_start"):
        resolve_warm_start(tmp_path / "elsewhere")
    with pytest.raises(EvaluationError, match="--methods warm_start: pass --checkpoint"):
        plan_methods(Config(), ["warm_start"], None)
    step = run / "checkpoints" / "step-3"
    plans = plan_methods(Config(learner={"model": tiny_gemma_dir}), ["untrained", "warm_start", "policy"], str(step))
    assert [p.spec.model for p in plans] == [tiny_gemma_dir, str(model.resolve()), str((step / "policy/hf").resolve())]


class _Ref:
    """A stand-in ObjectRef: the worker a `run_final` call went to and the questions it was sent."""

    def __init__(self, worker, examples):
        self.worker, self.examples = worker, examples


class _Worker:
    """A stand-in EvalWorker: records every `run_final` call and the most questions in flight at once."""

    def __init__(self):
        from types import SimpleNamespace

        self.sent, self.in_flight, self.most_in_flight = [], 0, 0
        self.run_final = SimpleNamespace(remote=self._send)

    def _send(self, examples, recipe, **_):
        self.sent.append([ex["id"] for ex in examples])
        self.in_flight += len(examples)
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return _Ref(self, examples)


class _LastFirstRay:
    """A stand-in for `ray` whose `wait` returns the newest pending call first (out of input order), and whose
    `get` answers a call with one record per question."""

    def wait(self, refs, num_returns=1):
        assert num_returns == 1
        return [refs[-1]], refs[:-1]

    def get(self, ref):
        ref.worker.in_flight -= len(ref.examples)
        return [{"id": ex["id"]} for ex in ref.examples]


def test_the_progress_bar_moves_before_the_last_question_is_sent_and_records_keep_input_order(monkeypatch):
    """A bounded number of questions in the worker at once: the bar moves after the first one comes back, long
    before the last is sent (sending all at once, every question came back together near the end), and the
    records come back in the order of the questions even when the calls finish out of order."""
    import tqdm

    from actors.engines.spec import EngineSpec
    from pipelines.evaluate import _Plan, _run_questions, in_flight

    updates = []

    class _Bar:
        def __init__(self, total, **_):
            self.total, self.n = total, 0

        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

        def update(self, n):
            self.n += n
            updates.append((self.n, sum(map(len, worker.sent))))

    monkeypatch.setattr(tqdm, "tqdm", _Bar)
    ray, worker = _LastFirstRay(), _Worker()
    examples = [{"id": f"q{i}", "question": f"question {i}"} for i in range(100)]
    plan = _Plan("policy", "search_r1", {}, EngineSpec(backend="hf", model="m"), {"num_cpus": 1, "num_gpus": 0},
                 {}, None)
    records = _run_questions(ray, worker, plan, examples, {"temperature": 0.0}, progress=True, max_in_flight=8)

    assert [r["id"] for r in records] == [ex["id"] for ex in examples]
    assert sorted(i for ids in worker.sent for i in ids) == sorted(ex["id"] for ex in examples)  # each sent once
    assert worker.most_in_flight == 8 and worker.in_flight == 0
    first_done, sent_then = updates[0]
    assert first_done == 1 and sent_then == 8  # the bar moved while 92 questions were still unsent
    assert [n for n, _ in updates] == list(range(1, 101))
    # the default bound: a CPU engine's batch, a GPU engine's larger one
    assert in_flight(plan) == 64
    assert in_flight(_Plan("policy", "search_r1", {}, plan.spec, {"num_cpus": 1, "num_gpus": 1}, {}, None)) > 64
