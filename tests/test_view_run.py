"""The run viewer over a small run in the real formats (`tests.fake_run`): what its JSON routes
answer, every bad input as a 4xx naming the parameter, a run missing parts, files still being written,
and a page that builds its DOM without parsing HTML. No Ray, no server process (FastAPI's TestClient)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import signal
import zlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipelines.run_docs import CorpusDocs, mark_gold, parse_context
from pipelines.run_view import MAX_PAGE, RunView
from recipes.base import Doc, format_docs
from serving.run_viewer import STATIC_DIR, make_viewer_app
from tests.fake_run import QUESTIONS, XSS, XSS_TITLE, write_pack, write_run


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("viewer")
    return write_run(root / "runs" / "s3-20261129-000000"), write_pack(root / "pack")


@pytest.fixture(scope="module")
def client(made) -> TestClient:
    run, pack = made
    return TestClient(make_viewer_app(RunView(run, CorpusDocs([pack / "corpus.jsonl.gz"]))))


def test_summary_names_methods_datasets_steps_and_the_dev_curve(client):
    s = client.get("/api/run").json()
    assert [m["method"] for m in s["eval"]["methods"]] == ["policy", "untrained", "naive_rag", "direct"]
    policy = s["eval"]["methods"][0]
    assert policy["episodes"] == 3 and policy["em"] == pytest.approx(1 / 3)  # "Mira Tolven" exact, the others not
    assert policy["own_searches"] == 1.0 and policy["retrieval_recall"] == pytest.approx(1 / 3)
    assert policy["context_recall"] == pytest.approx(1 / 3)  # what the generator read
    assert s["eval"]["methods"][1]["retrieval_recall"] is None  # its records carry no search measures
    assert s["eval"]["methods"][1]["context_recall"] is None
    assert s["eval"]["datasets"] == ["hotpotqa", "nq"] and s["eval"]["episodes"] == 12
    assert [st["step"] for st in s["steps"]] == [1, 2] and s["steps"][1]["rollout/reward_mean"] == pytest.approx(0.45)
    assert [(r["step"], r["F1"], r["visits"]) for r in s["dev_curve"]] == [(0, 0.2, 0), (2, 0.3, 6)]
    assert s["reward_curves"] and s["missing"] == [] and s["documents"]["corpus"].endswith("corpus.jsonl.gz")


def test_episodes_filter_by_method_dataset_and_f1_with_pages(client):
    page = client.get("/api/episodes").json()
    assert page["total"] == 12 and len(page["items"]) == 12 and "turns" not in page["items"][0]
    page = client.get("/api/episodes", params={"method": "policy", "dataset": "nq"}).json()
    assert [(e["method"], e["dataset"], e["answer"]) for e in page["items"]] == [
        ("policy", "nq", "in Harrowgate"), ("policy", "nq", "Kelm City")]
    assert page["items"][0]["f1"] == pytest.approx(2 / 3) and page["items"][0]["em"] == 0.0
    assert [(e["own_searches"], e["retrieval_hit"]) for e in page["items"]] == [(1, False), (1, False)]
    right = client.get("/api/episodes", params={"f1_min": "1"}).json()
    assert right["total"] == 4 and all(e["f1"] == 1.0 for e in right["items"])
    wrong = client.get("/api/episodes", params={"f1_max": "0", "method": "direct"}).json()
    assert wrong["total"] == 3
    second = client.get("/api/episodes", params={"offset": "10", "limit": "5"}).json()
    assert second["total"] == 12 and [e["n"] for e in second["items"]] == [10, 11]


def test_an_episode_has_its_turns_documents_and_gold_marked(client):
    n = client.get("/api/episodes", params={"method": "policy", "dataset": "hotpotqa"}).json()["items"][0]["n"]
    ep = client.get(f"/api/episodes/{n}").json()
    assert ep["question"] == QUESTIONS[0]["question"] and ep["answer"] == "Mira Tolven" and ep["f1"] == 1.0
    search, complete = ep["turns"]
    assert search["action"] == "Search" and search["query"] == "Zorblax Rising author"
    assert [(d["id"], d["title"], d["gold"]) for d in search["docs"]] == [
        ("wiki-1", "Zorblax Rising", "Mira Tolven"), ("wiki-3", XSS_TITLE, None), ("wiki-5", "Kelm", None)]
    assert XSS in search["docs"][1]["text"]  # raw in the JSON: escaping is the page's job
    assert search["docs"][0]["score"] is None  # predictions.jsonl records ids, not scores
    assert complete["action"] == "Complete" and complete["docs"] == [] and "<b>not bold</b>" in complete["text"]
    assert [(d["title"], d["gold"]) for d in ep["context_docs"]] == [("Zorblax Rising", "Mira Tolven"), (XSS_TITLE, None)]
    naive = client.get("/api/episodes", params={"method": "naive_rag", "dataset": "hotpotqa"}).json()["items"][0]
    base = client.get(f"/api/episodes/{naive['n']}").json()
    assert "turns" not in base and base["context_docs"] is None  # a baseline's line keeps its answer only


def test_one_question_side_by_side(client):
    q = client.get("/api/question", params={"id": "nq:2", "dataset": "nq"}).json()
    assert q["question"] == "Where did the Tolven family live?" and q["golden_answers"] == ["Harrowgate"]
    assert list(q["methods"]) == ["policy", "untrained", "naive_rag", "direct"]
    assert q["methods"]["policy"][0]["answer"] == "in Harrowgate" and q["methods"]["untrained"][0]["answer"] is None
    gold_docs = [d["title"] for d in q["methods"]["policy"][0]["turns"][0]["docs"] if d["gold"]]
    assert gold_docs == ["Tolven family", "Harrowgate"]


def test_a_steps_rollouts_are_bounded_and_carry_reward_components(client):
    page = client.get("/api/steps/2/rollouts", params={"limit": "4"}).json()
    assert page["step"] == 2 and page["total"] == 6 and len(page["items"]) == 4
    r = page["items"][0]
    assert r["question"] == QUESTIONS[0]["question"] and r["reward"] == pytest.approx(0.5)
    assert r["reward_components"] == pytest.approx({"gen_acc_s3": 1.0, "gen_acc_rag": 0.5, "gain_beyond_rag": 0.5})
    assert [t["action"] for t in r["turns"]] == ["Search", "Complete"] and r["turns"][0]["docs"][0]["gold"] == "Mira Tolven"
    assert [d["title"] for d in r["selected_docs"]] == ["Zorblax Rising"] and r["answer"] == "Mira Tolven"
    assert "prompt_ids" not in r and "response_ids" not in json.dumps(page)
    rest = client.get("/api/steps/2/rollouts", params={"offset": "4", "limit": "4"}).json()
    assert len(rest["items"]) == 2 and rest["items"][1]["sample_index"] == 1


BAD = [
    ("/api/episodes?method=wizard", 404, "method: 'wizard' was not evaluated in this run; expected one of policy"),
    ("/api/episodes?dataset=squad", 404, "dataset: 'squad' has no evaluated question"),
    ("/api/episodes?f1_min=abc", 422, "f1_min: got 'abc'; expected a number"),
    ("/api/episodes?f1_min=2", 422, "f1_min: got 2; expected a number in 0..1"),
    ("/api/episodes?f1_min=0.8&f1_max=0.2", 422, "f1_min: got 0.8 above f1_max 0.2"),
    ("/api/episodes?f1_max=nan", 422, "f1_max: got nan"),
    ("/api/episodes?limit=0", 422, f"limit: got 0; expected an integer in 1..{MAX_PAGE}"),
    (f"/api/episodes?limit={MAX_PAGE + 1}", 422, "limit: got"),
    ("/api/episodes?offset=-1", 422, "offset: got -1"),
    ("/api/episodes?offset=1.5", 422, "offset: got '1.5'; expected an integer"),
    ("/api/episodes?colour=red", 422, "colour: unknown parameter; expected only method, dataset"),
    ("/api/episodes/999", 404, "episode: 999 does not exist; expected 0..11"),
    ("/api/episodes/x", 422, "episode: got 'x'; expected an integer"),
    ("/api/question", 422, "id: missing"),
    ("/api/question?id=nope", 404, "question: no evaluated question with id 'nope'"),
    ("/api/steps/99/rollouts", 404, "step: 99 has no rollouts (step-99.jsonl.gz); steps with rollouts: 1, 2"),
    ("/api/steps/one/rollouts", 422, "step: got 'one'; expected an integer"),
    ("/api/steps/1/rollouts?limit=x", 422, "limit: got 'x'"),
    ("/api/run?x=1", 422, "x: unknown parameter"),
]


@pytest.mark.parametrize("url, status, words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_with_the_reason(client, url, status, words):
    r = client.get(url)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"] and r.json()["error"]["code"] == status


def test_a_run_without_eval_rollouts_or_metrics_serves_what_it_has(tmp_path):
    run = write_run(tmp_path / "run", evaluation=False, rollouts=False, curves=False)
    client = TestClient(make_viewer_app(RunView(run, CorpusDocs((), "document passages unavailable: no pack"))))
    s = client.get("/api/run").json()
    assert s["eval"]["methods"] == [] and s["steps"] == [] and s["dev_curve"] == [] and not s["reward_curves"]
    said = " | ".join(s["missing"])
    for words in ("no evaluation: eval/predictions.jsonl", "no training rollouts", "no metrics",
                  "no reward_curves.png", "document passages unavailable"):
        assert words in said, said
    assert client.get("/api/episodes").json()["total"] == 0
    r = client.get("/api/episodes?method=policy")
    assert r.status_code == 404 and "none (the run has no evaluation)" in r.json()["detail"]
    r = client.get("/api/steps/1/rollouts")
    assert r.status_code == 404 and "the run has no rollouts" in r.json()["detail"]
    r = client.get("/reward_curves.png")
    assert r.status_code == 404 and "drawn when training ends" in r.json()["detail"]
    assert client.get("/").status_code == 200


def test_files_being_written_and_an_evaluation_that_ends_later(tmp_path, made):
    run = write_run(tmp_path / "run", evaluation=False, curves=False)
    view = RunView(run)
    assert view.summary()["eval"]["episodes"] == 0
    (run / "eval").mkdir()
    assert any(m.startswith("evaluation not finished: eval/ has no predictions.jsonl") for m in view.summary()["missing"])
    whole = (made[0] / "eval" / "predictions.jsonl").read_text().splitlines()
    (run / "eval" / "predictions.jsonl").write_text("\n".join(whole[:3]) + '\n{"method": "poli')  # mid-write
    s = view.summary()
    assert s["eval"]["episodes"] == 3 and any("1 line(s) of predictions.jsonl" in m for m in s["missing"])
    (run / "metrics.jsonl").write_text('{"step": 0, "dev/answer_f1": 0.5}\n{"step": 1, "rollo')
    assert [r["F1"] for r in view.summary()["dev_curve"]] == [0.5]
    def episodes(page):  # (question group, sample) of each item, in file order
        return [(t["group_id"], t["sample_index"]) for t in page["items"]]

    whole_step = view.rollouts(1)
    assert whole_step["total"] == 2 * len(QUESTIONS)  # write_run: two samples of each question
    order = episodes(whole_step)
    cut = run / "rollouts" / "step-3.jsonl.gz"
    data = (run / "rollouts" / "step-1.jsonl.gz").read_bytes()
    cut.write_bytes(data[: len(data) // 2])  # a gzip stream still being written
    part = view.rollouts(3)  # the whole lines before the cut, in order; never an error
    assert part["total"] < len(order) and episodes(part) == order[: part["total"]]
    # A writer that flushed 4 whole lines and has not closed the stream: exactly those 4.
    lines = gzip.decompress(data).decode().splitlines(keepends=True)
    gz = zlib.compressobj(wbits=31)  # the gzip format, no trailer until closed
    flushed = gz.compress("".join(lines[:4]).encode()) + gz.flush(zlib.Z_SYNC_FLUSH)
    (run / "rollouts" / "step-4.jsonl.gz").write_bytes(flushed)
    flushed_page = view.rollouts(4)
    assert flushed_page["total"] == 4 and episodes(flushed_page) == order[:4]
    assert view.rollouts(1)["items"][0]["selected_docs"][0]["found"] is False  # no corpus: ids only


def test_an_evaluations_own_out_directory_is_a_run_too(tmp_path, made):
    out = tmp_path / "eval-dev"
    out.mkdir()
    shutil.copy(made[0] / "eval" / "predictions.jsonl", out / "predictions.jsonl")
    s = RunView(out).summary()
    assert s["eval"]["episodes"] == 12 and s["eval"]["path"] == str(out)


def test_context_documents_parse_back_and_gold_is_a_token_span():
    docs = [Doc("a", "Art", "A party\nwith two lines."), Doc("b", "B", "the year 19901"), Doc("c", "C", "in 1990.")]
    parsed = parse_context(format_docs(docs))
    assert [(d["title"], d["text"]) for d in parsed] == [("Art", "A party\nwith two lines."), ("B", "the year 19901"),
                                                        ("C", "in 1990.")]
    assert [d["gold"] for d in mark_gold(parsed, ["1990", "art"])] == ["art", None, "1990"]
    custom = parse_context(format_docs(docs[:1], "[{i}] {title}: {text}"), ["[{i}] {title}: {text}"])
    assert custom[0]["title"] == "Art" and parse_context(None) is None


def test_reward_curves_and_the_page_are_served(client):
    r = client.get("/reward_curves.png")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png" and r.content[:4] == b"\x89PNG"
    page = client.get("/")
    assert page.status_code == 200 and "searchrl run viewer" in page.text
    for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text):
        assert client.get(src).status_code == 200, src
    assert client.get("/static/common/dom.js").status_code == 200


def test_the_pages_never_parse_data_as_html():
    """The pages build their DOM with text nodes (common/dom.js); none of the HTML-parsing sinks appears."""
    scripts = sorted(STATIC_DIR.rglob("*.js"))
    assert {p.parent.name for p in scripts} == {"common", "run_viewer", "playground"}
    for path in scripts:
        text = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, f"{path.name} uses {sink}"


@pytest.fixture
def own_signals():
    """parse_config installs its SIGTERM / SIGINT handlers; give pytest's back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_the_entry_point_refuses_a_missing_run_and_a_taken_port(tmp_path, made, capsys, monkeypatch, own_signals):
    import scripts.view_run as view_run

    monkeypatch.setenv("SEARCHRL_DATA", str(made[1]))
    assert view_run.main([str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    taken = view_run.bind("127.0.0.1", 0)
    try:
        assert view_run.main([str(made[0]), "--port", str(taken.getsockname()[1])]) == 2
        assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    finally:
        taken.close()
    assert view_run._default_config(str(made[0])) == str(made[0] / "config.yaml")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text("train: {no_such_key: 1}\n")
    assert view_run._default_config(str(tmp_path / "old")) is None
    assert "does not load" in capsys.readouterr().err


def test_passages_come_from_the_pack_else_the_index_else_the_page_says_why(tmp_path, made, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from configs import load_config
    from pipelines.run_docs import corpus_for

    monkeypatch.setenv("SEARCHRL_DATA", str(made[1]))
    cfg = load_config("configs/main_cpu.yaml", [f"index.dir={tmp_path / 'idx'}"])
    assert corpus_for(cfg).docs(["wiki-4"])[0]["title"] == "Harrowgate"
    monkeypatch.delenv("SEARCHRL_DATA")
    missing = corpus_for(cfg)
    assert missing.docs(["wiki-4"])[0]["found"] is False and "SEARCHRL_DATA is not set" in missing.problem
    shard = tmp_path / "idx" / "shard-00000"
    shard.mkdir(parents=True)
    pq.write_table(pa.table({"row": [0], "id": ["wiki-4"], "title": ["Harrowgate"], "text": ["A town."]}),
                   shard / "docs.parquet")
    from_index = corpus_for(cfg)
    assert from_index.problem is None and from_index.docs(["wiki-4"])[0]["text"] == "A town."
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    broken = CorpusDocs([bad])
    assert broken.docs(["x"])[0]["found"] is False and "document passages unavailable" in broken.problem
