"""Training-set preparation (pipelines.prepare, scripts.prepare_data).

Pure parts without Ray: the s3 filter decisions, R1-Searcher difficulty bucketing and rounds,
Table-1 scaling and mixing, FlashRAG import, the result cache. Then the drivers on a local Ray
cluster with the real 2-shard index: `s3` on 4 real dev questions with a tiny random Gemma 3 as
frozen generator / judge (transformers "hf" backend), rerun from the cache; `r1_difficulty` on 2
questions x n=2 with the same tiny model as the reference policy (RolloutWorker, hf backend).
"""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest

from pipelines.data import BadRowError, iter_corpus, iter_qa
from pipelines.prepare.common import PrepareError, ResultCache, read_qa_rows, write_jsonl_gz
from pipelines.prepare.flashrag import flashrag_corpus_row, import_flashrag_corpus, import_flashrag_qa
from pipelines.prepare.r1_difficulty import (
    R1_TABLE1,
    answer_correct,
    difficulty_bucket,
    first_correct,
    mix_by_quotas,
    normalize_dataset,
    prepare_r1_difficulty,
    run_difficulty_rounds,
    scale_table,
)
from pipelines.prepare.s3_filter import needs_judge_actor, prepare_s3, s3_filter_decision, s3_filter_rows

REPO = Path(__file__).resolve().parents[1]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def read_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ============================================================================ s3 filter (pure)


def test_s3_filter_decisions_on_hand_made_rows():
    from recipes.s3 import filter_training_set

    rows = [
        {"id": "a", "question": "Is Paris in France?", "golden_answers": ["yes"], "source": "hotpotqa"},
        {"id": "b", "question": "Is it true?", "golden_answers": ["True", "correct"], "source": "nq"},
        {"id": "c", "question": "Capital of France?", "golden_answers": ["Paris"], "source": "nq",
         "type": "single-hop"},
        {"id": "d", "question": "Author of Emma?", "golden_answers": ["Jane Austen"], "source": "hotpotqa"},
        {"id": "e", "question": "Answer no?", "golden_answers": ["No."], "source": "nq"},
    ]
    assert [s3_filter_decision(r["golden_answers"], None if r["id"] in "abe" else 0.0) for r in rows] == \
        ["yes_no", "yes_no", "kept", "kept", "yes_no"]
    assert s3_filter_decision(["Paris"], 1.0) == "answered"
    with pytest.raises(ValueError, match="rag_gen_acc is needed"):
        s3_filter_decision(["Paris"], None)

    kept, counts = s3_filter_rows(rows, {"c": 1.0, "d": 0.0})
    assert [r["id"] for r in kept] == ["d"]
    assert kept[0] == {**rows[3], "rag_gen_acc": 0.0} and "rag_gen_acc" not in rows[3]  # a copy, fields kept
    assert {k: counts[k] for k in ("in", "yes_no_dropped", "answered_dropped", "out")} == \
        {"in": 5, "yes_no_dropped": 3, "answered_dropped": 1, "out": 1}
    assert counts["by_dataset"]["nq"] == {"in": 3, "yes_no_dropped": 2, "answered_dropped": 1}
    assert counts["by_dataset"]["hotpotqa"] == {"in": 2, "yes_no_dropped": 1, "out": 1}

    # Same decisions as the recipe's own filter.
    class Ex:
        def __init__(self, row):
            self.id, self.golden_answers = row["id"], row["golden_answers"]

    accs = {"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0, "e": 0.0}
    assert [e.id for e in filter_training_set(map(Ex, rows), lambda e: accs[e.id])] == [r["id"] for r in kept]


def test_keep_answered_keeps_a_seeded_share_of_what_naive_rag_answers():
    rows = [{"id": f"q{i}", "question": f"Q{i}?", "golden_answers": [f"a{i}"], "source": "nq" if i % 2 else "hotpotqa"}
            for i in range(40)]
    rows.append({"id": "yn", "question": "Is it?", "golden_answers": ["yes"], "source": "nq"})
    accs = {f"q{i}": float(i < 30) for i in range(40)}  # 30 answered, 10 not
    kept, counts = s3_filter_rows(rows, accs, keep_answered=0.2, seed=3)
    answered_kept = [r for r in kept if r["rag_gen_acc"] == 1.0]
    assert len(answered_kept) == 6 and len(kept) == 16  # round(0.2 * 30) + the 10 naive RAG fails
    assert [r["id"] for r in kept] == [r["id"] for r in rows if r["id"] in {k["id"] for k in kept}]  # file order
    assert {k: counts[k] for k in ("in", "yes_no_dropped", "answered_dropped", "answered_kept", "out")} == \
        {"in": 41, "yes_no_dropped": 1, "answered_dropped": 24, "answered_kept": 6, "out": 16}
    by_ds = counts["by_dataset"]
    assert sum(d.get("answered_kept", 0) for d in by_ds.values()) == 6
    assert sum(d.get("out", 0) for d in by_ds.values()) == 16
    again, _ = s3_filter_rows(rows, accs, keep_answered=0.2, seed=3)
    other, _ = s3_filter_rows(rows, accs, keep_answered=0.2, seed=4)
    assert again == kept and {r["id"] for r in other} != {r["id"] for r in kept}  # seeded
    assert len(s3_filter_rows(rows, accs, keep_answered=1.0)[0]) == 40
    assert s3_filter_rows(rows, accs)[0] == [r for r in kept if r["rag_gen_acc"] == 0.0]  # default: the paper's
    with pytest.raises(ValueError, match="keep_answered must be a share"):
        s3_filter_rows(rows, accs, keep_answered=1.5)


def test_the_filters_genacc_gets_its_own_judge_whatever_the_reward_metric():
    # The filter's baseline is GenAcc (s3 Eq. 3) even when training rewards F1: a judge_model of its
    # own is started for it (before, an F1 config had the generator answer the judge prompt).
    from types import SimpleNamespace

    from recipes.s3 import S3Config

    frozen = SimpleNamespace(model="reader", judge_model="judge")
    for metric in ("f1", "gen_acc", "em"):
        assert needs_judge_actor(frozen, S3Config(reward_metric=metric)), metric
    assert not needs_judge_actor(frozen, S3Config(use_judge=False))  # span_check only
    assert not needs_judge_actor(SimpleNamespace(model="reader", judge_model=None), S3Config())  # the generator judges
    assert not needs_judge_actor(SimpleNamespace(model="reader", judge_model="reader"), S3Config())


def test_bad_keep_answered_is_refused_by_the_cli(tmp_path, capsys):
    from scripts.prepare_data import main

    qa = write_jsonl(tmp_path / "qa.jsonl", [{"id": "a", "question": "q?", "golden_answers": ["x"]}])
    assert main(["s3", "--input", str(qa), "--keep-answered", "-0.1", "--out", str(tmp_path / "o.jsonl.gz")]) == 2
    assert "--keep-answered" in capsys.readouterr().err and not (tmp_path / "o.jsonl.gz").exists()


def test_prepared_rag_gen_acc_reaches_the_s3_recipe_through_iter_qa(tmp_path):
    """Written as a row field, `rag_gen_acc` lands in QAExample.meta, which the agent loop passes to
    Recipe.start(meta=...): the s3 reward then uses it and never calls the generator for the baseline."""
    from recipes import get_recipe
    from recipes.base import Doc

    kept, _ = s3_filter_rows([{"id": "q1", "question": "Who wrote Emma?", "golden_answers": ["Jane Austen"],
                               "source": "nq"}], {"q1": 0.0})
    write_jsonl_gz(tmp_path / "s3.jsonl.gz", kept)
    (ex,) = iter_qa(tmp_path / "s3.jsonl.gz")
    assert ex.meta == {"rag_gen_acc": 0.0} and ex.dataset == "nq"
    recipe = get_recipe("s3")
    ep = recipe.start(ex.question, ex.golden_answers, [Doc("1", "Emma", "A novel.")], chat=False, meta=ex.meta)

    class NoScorer:
        def generate_answer(self, *a, **k):
            raise AssertionError("the baseline must come from meta")

        judge = generate_answer

    assert recipe.rag_gen_acc(ep, NoScorer()) == 0.0


# ============================================================================ R1-Searcher (pure)


def test_difficulty_buckets_follow_the_papers_thresholds():
    # §2.1: easy < 10 rollouts to a correct answer, medium 10..20, difficult > 20 (or never).
    assert [difficulty_bucket(k) for k in (1, 9, 10, 15, 20, 21, None)] == \
        ["easy", "easy", "medium", "medium", "medium", "hard", "hard"]
    assert [difficulty_bucket(k, 2, 3) for k in (1, 2, 3, 4, None)] == ["easy", "medium", "medium", "hard", "hard"]
    with pytest.raises(ValueError):
        difficulty_bucket(1, 0, 5)
    assert first_correct([False, False, True, True]) == 3
    assert first_correct([False]) is None and first_correct([]) is None
    assert answer_correct("It is Paris, France", ["Paris"]) and not answer_correct("Lyon", ["Paris"])
    assert not answer_correct(None, ["Paris"]) and not answer_correct("  ", ["Paris"])
    assert not answer_correct("It is Paris", ["Paris"], "em") and answer_correct("the Paris", ["Paris"], "em")
    assert answer_correct("Paris city", ["Paris"], "f1", 0.6) and not answer_correct("Paris city", ["Paris"], "f1")


def test_difficulty_rounds_stop_at_the_first_correct_rollout():
    """Rounds of n=2; a question leaves after the round with its first correct rollout."""
    correct_at = {"q1": {1}, "q2": {3, 4}, "q3": set()}  # global 1-based rollout indices that are correct
    calls, done = [], []

    def rollout_fn(examples, k, rnd):
        calls.append(([e["id"] for e in examples], k, rnd))
        return [{"qid": e["id"], "sample_index": i,
                 "final": {"answer": "Paris" if rnd * 2 + i + 1 in correct_at[e["id"]] else "Lyon"}}
                for e in examples for i in range(k)]

    examples = [{"id": q, "question": f"{q}?", "golden_answers": ["Paris"]} for q in ("q1", "q2", "q3")]
    out = run_difficulty_rounds(examples, rollout_fn, n=2, max_rollouts=5,
                                on_done=lambda qid, r: done.append(qid))
    assert calls == [(["q1", "q2", "q3"], 2, 0), (["q2", "q3"], 2, 1), (["q3"], 1, 2)]  # the last round is capped
    assert out == {"q1": {"correct_of_n": 1, "rollouts": 2, "rollouts_to_correct": 1},
                   "q2": {"correct_of_n": 2, "rollouts": 4, "rollouts_to_correct": 3},
                   "q3": {"correct_of_n": 0, "rollouts": 5, "rollouts_to_correct": None}}
    assert done == ["q1", "q2", "q3"]
    with pytest.raises(ValueError, match="expected 2 rollouts"):
        run_difficulty_rounds(examples[:1], lambda e, k, r: [], n=2, max_rollouts=2)


def test_r1_difficulty_rounds_on_scripted_agent_loop_trajectories(gemma_tokenizer):
    """2 questions x n=2 through the real agent loop (r1_searcher recipe, scripted policy): one is
    answered in every rollout (easy), the other never (hard after max_rollouts)."""
    from actors.engines.base import Sampling
    from actors.rollout.agent_loop import AgentLoop
    from recipes import get_recipe
    from tests.scripted_engine import ScriptedEngine, turn_policy

    q_ok, q_bad = "Which city is the capital of France?", "Who painted the Zorblax mural?"
    turns = {q_ok: [" Let me search.<|begin_of_query|> capital France<|end_of_query|>",
                    " Found it.</think><answer> Paris</answer>"],
             q_bad: [" I guess.</think><answer> Nobody</answer>"]}

    async def search(query, k):
        return [{"doc_id": "d1", "title": "France", "text": "Paris is the capital of France.", "score": 1.0}]

    def rollout_fn(examples, k, rnd):
        loop = AgentLoop(ScriptedEngine(gemma_tokenizer, turn_policy(turns)), get_recipe("r1_searcher", stage=2),
                         search, Sampling(seed=rnd), chat=False, compute_reward=False)
        return [t.to_json() for t in asyncio.run(loop.run_batch(examples, k))]

    examples = [{"id": "ok", "question": q_ok, "golden_answers": ["Paris"], "dataset": "hotpotqa"},
                {"id": "bad", "question": q_bad, "golden_answers": ["Mira Tolven"], "dataset": "2wikimultihopqa"}]
    out = run_difficulty_rounds(examples, rollout_fn, n=2, max_rollouts=4)
    assert out["ok"] == {"correct_of_n": 2, "rollouts": 2, "rollouts_to_correct": 1}
    assert out["bad"] == {"correct_of_n": 0, "rollouts": 4, "rollouts_to_correct": None}
    assert difficulty_bucket(out["ok"]["rollouts_to_correct"], 2, 3) == "easy"
    assert difficulty_bucket(out["bad"]["rollouts_to_correct"], 2, 3) == "hard"


def test_table1_scaling_by_hand():
    assert scale_table(R1_TABLE1[1], None) == {("hotpotqa", "medium"): 200, ("2wikimultihopqa", "medium"): 150}
    assert scale_table(R1_TABLE1[2], None) == {("hotpotqa", "medium"): 2561, ("hotpotqa", "hard"): 2000,
                                               ("2wikimultihopqa", "medium"): 1087, ("2wikimultihopqa", "hard"): 2500}
    # 350 -> 7: 4 + 3 exactly. 8148 -> 100: 31.43 / 24.55 / 13.34 / 30.68 -> floors 31/24/13/30 (98);
    # the two largest remainders (.68, .55) get the missing 2.
    assert scale_table(R1_TABLE1[1], 7) == {("hotpotqa", "medium"): 4, ("2wikimultihopqa", "medium"): 3}
    assert scale_table(R1_TABLE1[2], 100) == {("hotpotqa", "medium"): 31, ("hotpotqa", "hard"): 25,
                                              ("2wikimultihopqa", "medium"): 13, ("2wikimultihopqa", "hard"): 31}
    for total in (0, 1, 2, 3, 17, 999):
        assert sum(scale_table(R1_TABLE1[2], total).values()) == total
    with pytest.raises(ValueError):
        scale_table(R1_TABLE1[1], -1)


def test_table1_mixing_by_hand():
    rows = ([{"id": f"h{i}", "source": "hotpotqa", "difficulty": "medium"} for i in range(5)]
            + [{"id": f"hh{i}", "source": "hotpotqa", "difficulty": "hard"} for i in range(2)]
            + [{"id": f"w{i}", "source": "2WikiMultihopQA", "difficulty": "medium"} for i in range(3)]
            + [{"id": "e0", "source": "hotpotqa", "difficulty": "easy"},
               {"id": "n0", "source": "nq", "difficulty": "hard"}])

    def cell_of(row):
        ds = normalize_dataset(row["source"])
        return (ds, row["difficulty"]) if ds else None

    quotas = {("hotpotqa", "medium"): 2, ("hotpotqa", "hard"): 3, ("2wikimultihopqa", "medium"): 1}
    picked, counts, shortfall = mix_by_quotas(rows, quotas, cell_of, seed=0)
    assert counts == {("hotpotqa", "medium"): 2, ("hotpotqa", "hard"): 2, ("2wikimultihopqa", "medium"): 1}
    assert shortfall == {("hotpotqa", "hard"): 1}
    ids = [r["id"] for r in picked]
    assert ids == sorted(ids, key=[r["id"] for r in rows].index)  # input order
    assert {"hh0", "hh1"} <= set(ids) and not {"e0", "n0"} & set(ids)
    assert sum(i.startswith("h") and not i.startswith("hh") for i in ids) == 2
    assert mix_by_quotas(rows, quotas, cell_of, seed=0)[0] == picked  # deterministic
    # A later stage never takes what an earlier one took.
    again, counts2, _ = mix_by_quotas(rows, quotas, cell_of, seed=1, exclude=ids)
    assert not set(ids) & {r["id"] for r in again} and counts2[("hotpotqa", "medium")] == 2
    assert normalize_dataset("hotpotqa+2wiki_train") is None
    assert normalize_dataset("hotpotqa+2wiki_train", {"hotpotqa+2wiki_train": "hotpotqa"}) == "hotpotqa"


def test_bad_r1_arguments_fail_before_any_actor(tmp_path):
    from configs import load_config

    cfg = load_config(None)
    with pytest.raises(PrepareError, match="must exceed hard_above"):
        prepare_r1_difficulty(cfg, tmp_path / "x.jsonl", tmp_path / "out", n=8, max_rollouts=16)
    with pytest.raises(PrepareError, match="metric"):
        prepare_r1_difficulty(cfg, tmp_path / "x.jsonl", tmp_path / "out", metric="bleu")


# ============================================================================ FlashRAG import, cache (pure)


def test_flashrag_import_round_trip(tmp_path):
    qa = write_jsonl(tmp_path / "nq_test.jsonl", [
        {"id": "test_0", "question": "who got the first nobel prize in physics?",
         "golden_answers": ["Wilhelm Conrad Röntgen"], "metadata": {"answer_type": "person"}},
        {"id": 7, "question": "capital of France?", "golden_answers": "Paris", "split": "test", "dataset": "nq"},
    ])
    report = import_flashrag_qa(qa, tmp_path / "pack" / "test.jsonl.gz", "nq")
    assert report["rows"] == 2
    rows = read_gz(tmp_path / "pack" / "test.jsonl.gz")
    assert rows[0] == {"id": "nq:test_0", "question": "who got the first nobel prize in physics?",
                       "golden_answers": ["Wilhelm Conrad Röntgen"], "source": "nq", "orig_id": "test_0",
                       "metadata": {"answer_type": "person"}}
    assert rows[1]["id"] == "nq:7" and rows[1]["golden_answers"] == ["Paris"] and rows[1]["orig_split"] == "test"
    exs = list(iter_qa(tmp_path / "pack" / "test.jsonl.gz"))
    assert [e.dataset for e in exs] == ["nq", "nq"] and exs[0].meta["metadata"] == {"answer_type": "person"}
    assert read_qa_rows(tmp_path / "pack" / "test.jsonl.gz")[1]["id"] == "nq:7"

    corpus = write_jsonl(tmp_path / "wiki.jsonl", [
        {"id": "0", "contents": '"Aaron"\nAaron is a prophet.'},
        {"id": 1, "contents": "no title line"},
        {"id": "2", "title": "Zebra", "text": "Zebras are striped."},
    ])
    assert import_flashrag_corpus(corpus, tmp_path / "pack" / "corpus.jsonl.gz")["rows"] == 3
    assert read_gz(tmp_path / "pack" / "corpus.jsonl.gz") == [
        {"id": "0", "title": "Aaron", "text": "Aaron is a prophet."}, {"id": "1", "title": "", "text": "no title line"},
        {"id": "2", "title": "Zebra", "text": "Zebras are striped."}]
    back = list(iter_corpus(tmp_path / "pack" / "corpus.jsonl.gz"))
    assert back[0].contents == '"Aaron"\nAaron is a prophet.'
    assert flashrag_corpus_row({"id": "9", "contents": '"T"\nx'}, "f", 1) == {"id": "9", "title": "T", "text": "x"}


def test_flashrag_bad_rows_name_file_and_line(tmp_path, capsys):
    from scripts.prepare_data import main

    bad_qa = write_jsonl(tmp_path / "bad.jsonl", [
        {"id": "a", "question": "q?", "golden_answers": ["x"]}, "",
        {"id": "b", "golden_answers": ["y"]},
    ])
    with pytest.raises(BadRowError) as e:
        import_flashrag_qa(bad_qa, tmp_path / "out.jsonl.gz", "nq")
    assert e.value.line == 3 and f"{bad_qa} line 3" in str(e.value) and "'question'" in str(e.value)
    assert not (tmp_path / "out.jsonl.gz").exists()
    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "question": "q?", "golden_answers": ["x"]}] * 2)
    with pytest.raises(BadRowError, match="line 2: duplicate id 'nq:a'"):
        import_flashrag_qa(dup, tmp_path / "out.jsonl.gz", "nq")
    bad_corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "0", "contents": "x"}, {"id": "1", "contents": 5}])
    with pytest.raises(BadRowError, match=r"c\.jsonl line 2: field 'contents' must be a string"):
        import_flashrag_corpus(bad_corpus, tmp_path / "c.jsonl.gz")
    assert not (tmp_path / "c.jsonl.gz").exists() and not (tmp_path / "c.jsonl.gz.tmp").exists()
    with pytest.raises(PrepareError, match="jsonl.gz"):
        import_flashrag_qa(bad_qa, tmp_path / "out.json", "nq")

    # The CLI: one `error:` line with file:line, exit status 2; a good file converts.
    with pytest.raises(SystemExit) as ex:
        main(["import_flashrag", "--qa", str(bad_qa), "--dataset", "nq", "--out", str(tmp_path / "o.jsonl.gz")])
    assert ex.value.code == 2 and f"error: {bad_qa} line 3" in capsys.readouterr().err
    assert main(["import_flashrag", "--qa", str(dup), "--dataset", "nq", "--limit", "1",
                 "--out", str(tmp_path / "o.jsonl.gz")]) == 0
    assert main(["import_flashrag", "--qa", str(dup), "--out", str(tmp_path / "o.jsonl.gz")]) == 2
    assert "--dataset" in capsys.readouterr().err


def test_result_cache_resumes_and_ignores_stale_entries(tmp_path):
    cache = ResultCache(tmp_path / "c.jsonl", "fp1")
    cache.append({"id": "a", "question": "A?", "gen_acc": 1.0})
    cache.append({"id": "b", "question": "B?", "gen_acc": 0.0})
    with open(tmp_path / "c.jsonl", "a") as f:
        f.write('{"id": "c", "quest')  # torn last line of an interrupted run
    assert set(cache.load()) == {"a", "b"}
    assert set(cache.load({"a": "A?", "b": "B changed?"})) == {"a"} and cache.stale == 1
    assert ResultCache(tmp_path / "c.jsonl", "fp2").load() == {}
    cache.append({"id": "c", "question": "C?", "gen_acc": 0.0})  # starts a fresh line after the torn one
    lines = (tmp_path / "c.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["id"] == "c"
    with pytest.raises(BadRowError, match="line 3"):  # a torn line that is no longer the last
        cache.load()


def test_a_sampled_read_spreads_over_the_datasets_and_keeps_file_order(tmp_path):
    # A pack split is sorted by dataset: its first 6 rows are all nq; a sample of 6 holds 2 of each.
    rows = [{"id": f"{ds}:{i}", "question": f"q{i}?", "golden_answers": ["a"], "source": ds}
            for ds in ("nq", "popqa", "triviaqa") for i in range(10)]
    qa = write_jsonl(tmp_path / "train.jsonl", rows)
    assert {r["source"] for r in read_qa_rows(qa, 6)} == {"nq"}
    sampled = read_qa_rows(qa, 6, sample_seed=0)
    assert [r["source"] for r in sampled] == ["nq", "nq", "popqa", "popqa", "triviaqa", "triviaqa"]
    order = [r["id"] for r in rows]
    assert sorted(order.index(r["id"]) for r in sampled) == [order.index(r["id"]) for r in sampled]
    assert read_qa_rows(qa, 6, sample_seed=0) == sampled and read_qa_rows(qa, 6, sample_seed=1) != sampled
    assert len(read_qa_rows(qa, 100, sample_seed=0)) == 30


def test_sample_without_limit_is_refused_by_the_cli(tmp_path, capsys):
    from scripts.prepare_data import main

    qa = write_jsonl(tmp_path / "qa.jsonl", [{"id": "a", "question": "q?", "golden_answers": ["x"]}])
    assert main(["s3", "--input", str(qa), "--sample", "--out", str(tmp_path / "o.jsonl.gz")]) == 2
    assert "--sample needs --limit" in capsys.readouterr().err


def test_bad_s3_config_fails_before_any_actor(tmp_path):
    from actors.retrieval.index_store import IndexFormatError
    from configs import ConfigError, load_config

    qa = write_jsonl(tmp_path / "qa.jsonl", [{"id": "a", "question": "q?", "golden_answers": ["x"]}])
    cfg = load_config(None, ["train.recipe=s3"])
    # The config rejects bad options on load and assignment; model_copy skips validation, so this
    # reaches prepare_s3's own check (top-k is retrieval.topk, validated by the config itself).
    cfg.train = cfg.train.model_copy(update={"recipe_options": {"max_turns": -1}})
    with pytest.raises(ConfigError, match="train.recipe_options.max_turns"):
        prepare_s3(cfg, qa, tmp_path / "out.jsonl.gz")
    cfg = load_config(None, [f"index.dir={tmp_path / 'no-index'}"])
    with pytest.raises(IndexFormatError, match="not a finished index"):
        prepare_s3(cfg, qa, tmp_path / "out.jsonl.gz")
    with pytest.raises(PrepareError, match="jsonl.gz"):
        prepare_s3(cfg, qa, tmp_path / "out.jsonl")


# ============================================================================ through the actors


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, gemma_dir) -> str:
    from actors.engines.models import make_tiny_model

    return make_tiny_model("gemma3", tmp_path_factory.mktemp("tiny-prepare") / "m", tokenizer_from=gemma_dir, seed=0)


@pytest.fixture(scope="module")
def overrides(small_index, tiny_model) -> list[str]:
    return [f"index.dir={small_index}", "retrieval.query_encoders=1",
            f"frozen.model={tiny_model}", "frozen.backend=hf", "frozen.num_cpus=0.5", "frozen.max_answer_tokens=6",
            "frozen.max_model_len=2048",
            f"learner.model={tiny_model}", "rollout.backend=hf", "rollout.cpus_per_worker=0.5",
            "rollout.max_model_len=2048", "rollout.max_new_tokens_per_turn=6", "rollout.max_total_tokens=1500"]


@pytest.fixture(scope="module")
def actors(ray_local, overrides):
    """(config, pool, frozen generator/judge actor), all from the config."""
    from actors.frozen.worker import start_frozen_llm
    from actors.lifecycle import ActorSet
    from actors.retrieval.pool import start_retrieval_pool
    from configs import load_config

    cfg = load_config(REPO / "configs" / "retrieval_cpu.yaml", overrides)
    started = ActorSet()
    try:
        pool = started.adopt(start_retrieval_pool(cfg.index.dir, cfg.retrieval))
        gen = start_frozen_llm(started, cfg, "generator")
        started.wait_ready([gen], what="frozen generator")
        yield cfg, pool, gen
    finally:
        started.stop()


def _dev_rows(data_dir, n_plain: int, n_yes_no: int) -> list[dict]:
    plain, yes_no = [], []
    with gzip.open(data_dir / "dev.jsonl.gz", "rt") as f:
        for line in f:
            row = json.loads(line)
            is_yn = any(g.strip().lower() in ("yes", "no") for g in row["golden_answers"])
            (yes_no if is_yn else plain).append(row)
            if len(plain) >= n_plain and len(yes_no) >= n_yes_no:
                break
    return plain[:n_plain] + yes_no[:n_yes_no]


@pytest.mark.slow
def test_s3_preparation_through_the_actors_and_rerun_from_cache(ray_local, actors, data_dir, tmp_path, overrides):
    from actors.frozen.scorer import ActorScorer
    from recipes import get_recipe
    from scripts.prepare_data import main

    cfg, pool, gen = actors
    rows = _dev_rows(data_dir, 3, 1)
    src = write_jsonl(tmp_path / "dev4.jsonl", rows)
    out = tmp_path / "s3" / "train.jsonl.gz"
    before = ray_local.get(gen.stats.remote())
    report = prepare_s3(cfg, src, out, pool=pool, generator=gen, concurrency=4)
    after = ray_local.get(gen.stats.remote())

    c = report["counts"]
    assert (c["in"], c["yes_no_dropped"], c["answered_dropped"] + c["out"]) == (4, 1, 3)
    assert report["baseline"] == {"computed": 3, "cached": 0, "stale_cache_entries": 0}
    assert after["generated"] - before["generated"] >= 3  # one answer per question (+ judge calls)
    kept = read_gz(out)
    assert len(kept) == c["out"]
    by_id = {r["id"]: r for r in rows}
    for r in kept:  # rows keep every field and gain rag_gen_acc = 0
        assert r == {**by_id[r["id"]], "rag_gen_acc": 0.0}
    cache = [json.loads(x) for x in (tmp_path / "s3" / "train.cache.jsonl").read_text().splitlines()]
    assert sorted(e["id"] for e in cache) == sorted(r["id"] for r in rows[:3])
    for e in cache:
        assert isinstance(e["rag_answer"], str) and e["gen_acc"] in (0.0, 1.0) and len(e["doc_ids"]) == 3
        assert all(d.startswith("wiki-000") and int(d[5:]) < 600 for d in e["doc_ids"])  # the 600-passage index
    assert json.loads((tmp_path / "s3" / "train.report.json").read_text())["counts"] == c

    # Rerun: every baseline comes from the cache; the generator is not asked anything.
    again = prepare_s3(cfg, src, out, pool=pool, generator=gen, concurrency=4)
    assert ray_local.get(gen.stats.remote()) == after
    assert again["baseline"] == {"computed": 0, "cached": 3, "stale_cache_entries": 0}
    assert again["counts"] == c and read_gz(out) == kept

    # The CLI on the same files (Ray is up in-process): all cached, so it starts no actor at all.
    assert main(["s3", "--input", str(src), "--out", str(out), *overrides]) == 0
    assert json.loads((tmp_path / "s3" / "train.report.json").read_text())["baseline"]["computed"] == 0

    # The cached baseline is what the s3 recipe computes in training from the loop's initial top-k:
    # the same prompt (a hit in the generator's own prompt cache) and the same GenAcc.
    e = cache[0]
    row = by_id[e["id"]]
    hits = ray_local.get(pool.search.remote([row["question"].strip()], 3))[0]
    assert [h["doc_id"] for h in hits] == e["doc_ids"]
    recipe = get_recipe("s3")
    ep = recipe.start(row["question"], row["golden_answers"], hits, chat=False)
    assert recipe.rag_gen_acc(ep, ActorScorer(gen)) == e["gen_acc"]
    stats = ray_local.get(gen.stats.remote())
    assert stats["generated"] == after["generated"] and stats["cache_hits"] > after["cache_hits"]


@pytest.mark.slow
def test_r1_difficulty_through_a_rollout_worker(ray_local, actors, data_dir, tmp_path):
    """2 questions x n=2 per round, the reference policy (tiny random Gemma 3, hf backend) on a
    RolloutWorker started from the config: it never writes an <answer>, so both questions run all
    max_rollouts=4 rollouts and are hard (thresholds scaled down to 2 / 3 to fit n=2)."""
    cfg, pool, _ = actors
    rows = _dev_rows(data_dir, 2, 0)
    src = write_jsonl(tmp_path / "dev2.jsonl", rows)
    report = prepare_r1_difficulty(cfg, src, tmp_path / "r1", n=2, max_rollouts=4, easy_below=2, hard_above=3,
                                   stage_totals={1: 2, 2: 2}, pool=pool)
    c = report["counts"]
    assert c["in"] == 2 and c["rolled_out"] == 2 and c["rollouts_run"] == 8
    assert sum(c["buckets"].values()) == 2
    scored = read_gz(tmp_path / "r1" / "difficulty.jsonl.gz")
    assert [r["id"] for r in scored] == [r["id"] for r in rows]
    for r in scored:  # counts and buckets agree
        assert r["rollouts"] == 4 and 0 <= r["correct_of_n"] <= r["rollouts"]
        assert (r["rollouts_to_correct"] is None) == (r["correct_of_n"] == 0)
        assert r["difficulty"] == difficulty_bucket(r["rollouts_to_correct"], 2, 3)
        assert c["buckets"][r["difficulty"]] >= 1
    for stage in ("1", "2"):
        st = report["stages"][stage]
        picked = read_gz(tmp_path / "r1" / f"stage{stage}.jsonl.gz")
        assert st["selected"] == len(picked) == sum(st["picked"].values())
        assert st["requested"] == 2 == st["selected"] + sum(st["shortfall"].values())
        for r in picked:
            assert f"{normalize_dataset(r['source'])}/{r['difficulty']}" in st["quotas"]
    # Rerun: everything from the cache, no rollouts.
    again = prepare_r1_difficulty(cfg, src, tmp_path / "r1", n=2, max_rollouts=4, easy_below=2, hard_above=3,
                                  stage_totals={1: 2, 2: 2}, pool=pool)
    assert again["counts"]["cached"] == 2 and again["counts"]["rollouts_run"] == 0
    assert read_gz(tmp_path / "r1" / "difficulty.jsonl.gz") == scored
