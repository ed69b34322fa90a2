"""A small finished run directory in the real formats, written with the project's own writers (for the run
viewer's tests): `eval/predictions.jsonl` (`prediction_line`), `rollouts/step-<n>.jsonl.gz` (`Trajectory.to_json`,
`save_rollouts`), `metrics.jsonl` and `reward_curves.png` (`Tracker`, `rollout_metrics`), `config.yaml`
(`save_config`), and a data pack holding only its corpus. One passage holds HTML, to check it shows as text."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from actors.rollout.trajectory import Trajectory, TurnRecord
from configs import load_config, save_config
from pipelines.checkpoints import save_rollouts
from pipelines.eval_inputs import BASELINES
from pipelines.eval_rows import prediction_line
from recipes.base import Doc, format_docs

XSS = "<script>window.__xss=1</script>"
XSS_TITLE = '<img src=x onerror="window.__xss=2">Scripted page'

CORPUS = [
    {"id": "wiki-1", "title": "Zorblax Rising", "text": "Zorblax Rising is a 1994 novel by Mira Tolven, set in Kelm."},
    {"id": "wiki-2", "title": "Tolven family", "text": "The Tolven family lived in Harrowgate for three generations."},
    {"id": "wiki-3", "title": XSS_TITLE, "text": f"A passage with {XSS} in it, about the Tolven family."},
    {"id": "wiki-4", "title": "Harrowgate", "text": "Harrowgate is a market town, the capital of Kelm."},
    {"id": "wiki-5", "title": "Kelm", "text": "Kelm is a small fictional country."},
]
BY_ID = {d["id"]: Doc(d["id"], d["title"], d["text"]) for d in CORPUS}

QUESTIONS = [
    {"id": "hotpotqa:1", "dataset": "hotpotqa", "question": "Who wrote the novel Zorblax Rising?",
     "golden_answers": ["Mira Tolven"], "search": ("Zorblax Rising author", ["wiki-1", "wiki-3", "wiki-5"]),
     "policy": "Mira Tolven", "untrained": "Kelm", "naive_rag": "Mira Tolven", "direct": "Stephen King"},
    {"id": "nq:2", "dataset": "nq", "question": "Where did the Tolven family live?",
     "golden_answers": ["Harrowgate"], "search": ("Tolven family home", ["wiki-2", "wiki-3", "wiki-4"]),
     "policy": "in Harrowgate", "untrained": None, "naive_rag": "Kelm", "direct": "London"},
    {"id": "nq:3", "dataset": "nq", "question": "What is the capital of Kelm?",
     "golden_answers": ["Harrowgate"], "search": ("capital of Kelm", ["wiki-4", "wiki-5", "wiki-1"]),
     "policy": "Kelm City", "untrained": "Harrowgate", "naive_rag": "Harrowgate", "direct": "Kelm"},
]
METHODS = ("policy", "untrained", "naive_rag", "direct")


def write_pack(root: Path) -> Path:
    """A data pack directory with only `corpus.jsonl.gz` (what the viewer reads of it)."""
    root.mkdir(parents=True, exist_ok=True)
    with gzip.open(root / "corpus.jsonl.gz", "wt") as f:
        for row in CORPUS:
            f.write(json.dumps(row) + "\n")
    return root


def _record(q: dict, method: str) -> dict:
    """One question as `EvalWorker.run_final` returns it for `method` (s3: a search, then a selection)."""
    query, ids = q["search"]
    rec = {"id": q["id"], "dataset": q["dataset"], "question": q["question"], "golden_answers": q["golden_answers"],
           "answer": q[method], "evidence": None, "answer_forced": False, "finish_reason": "complete"}
    if method == "policy":
        rec["turns"] = [
            {"text": f'[1]</important_info><search_complete>False</search_complete>\n<query>{{"query": "{query}"}}'
                     f"</query>", "action": "Search", "query": query, "doc_ids": ids, "finish_reason": "stop"},
            {"text": "[1, 2]</important_info><search_complete>True</search_complete> <b>not bold</b>",
             "action": "Complete", "query": None, "doc_ids": [], "finish_reason": "stop"}]
        rec["context"], rec["searches"] = format_docs([BY_ID[i] for i in ids[:2]]), 2
        # the search itself (recipes.search_metrics): the first question's search showed its gold, the others not
        rec["search"] = {"own_searches": 1, "shown_doc_ids": ids, "retrieval_hit": q is QUESTIONS[0],
                         "initial_hit": False, "found_by_search": q is QUESTIONS[0], "gold_paragraph_recall": None,
                         "context_hit": q is QUESTIONS[0]}  # its selection [1, 2] kept what it found
    elif method == "untrained":
        rec["turns"] = [{"text": "1, 4]</important_info>", "action": "Complete", "query": None, "doc_ids": [],
                         "finish_reason": "stop"}]
        rec["context"], rec["searches"] = format_docs([BY_ID[ids[0]]]), 1
    elif method == "naive_rag":  # its generator answers inside the episode: no context kept (as a real run)
        rec["turns"], rec["context"], rec["searches"] = [], None, 1
    else:
        rec["turns"], rec["context"], rec["searches"] = [], None, 0
    return rec


def _trajectory(q: dict, sample: int, step: int) -> Trajectory:
    query, ids = q["search"]
    t = Trajectory(group_id=f"{q['dataset']}/{q['id']}", qid=q["id"], sample_index=sample, question=q["question"],
                   golden_answers=q["golden_answers"], recipe="s3", prompt_ids=[2, 10, 11, 12], weight_version=step - 1)
    t.append([20, 21, 22], policy=True, logprobs=[-0.5, -0.2, -0.1])
    t.append([30, 31], policy=False)
    t.append([23, 24], policy=True, logprobs=[-0.3, -0.4])
    t.turns = [TurnRecord(f"<query>{query}</query>", "Search", query, list(ids), 3, 2, "stop", 0.5, 0.01),
               TurnRecord("[1]</important_info>", "Complete", None, [], 2, 0, "stop", 0.3, 0.0)]
    answer = q["policy"] if sample == 0 else q["untrained"]
    t.final = {"answer": answer, "selected_doc_ids": ids[:1 + sample], "evidence": None, "answer_forced": False}
    t.finish_reason, t.timings = "complete", {"total_s": 0.9, "generate_s": 0.8, "search_s": 0.01,
                                            "score_s": 0.05}
    gain = 0.25 * step - 0.1 * sample
    t.reward, t.reward_components = gain, {"gen_acc_s3": 0.5 + gain, "gen_acc_rag": 0.5, "gain_beyond_rag": gain}
    return t


def write_run(root: Path, *, steps: int = 2, evaluation: bool = True, rollouts: bool = True,
              curves: bool = True) -> Path:
    """`root` as a finished main-job run (config.yaml always; the rest as asked). Returns `root`."""
    from pipelines.tracking import Tracker
    from pipelines.train_metrics import rollout_metrics

    root.mkdir(parents=True, exist_ok=True)
    cfg = load_config("configs/s3_main_cpu.yaml", ["train.wandb.mode=disabled"])
    save_config(cfg, root / "config.yaml")
    if evaluation:
        (root / "eval").mkdir()
        with open(root / "eval" / "predictions.jsonl", "w") as f:
            for method in METHODS:
                recipe = method if method in BASELINES else "s3"
                for q in QUESTIONS:
                    line = prediction_line(method, recipe, _record(q, method), gen_acc=bool(q[method]), judge=None,
                                           acc_l=None, searcher=method not in BASELINES)
                    f.write(json.dumps(line) + "\n")
    if curves:
        tracker = Tracker(root, cfg)
        tracker.log({"dev/answer_f1": 0.2, "dev/answer_em": 0.1, "dev/answer_cover_em": 0.3, "dev/answer_rate": 0.9,
                     "dev/episodes": 3.0, "dev/reward_mean": 0.05, "train/question_visits": 0.0}, 0)
    for step in range(1, steps + 1):
        trajs = [_trajectory(q, s, step).to_json() for q in QUESTIONS for s in (0, 1)]
        if rollouts:
            save_rollouts(root / "rollouts" / f"step-{step}.jsonl.gz", trajs)
        if curves:
            dev = ({"dev/answer_f1": 0.3, "dev/answer_em": 0.2, "dev/answer_cover_em": 0.4, "dev/answer_rate": 1.0,
                    "dev/episodes": 3.0, "dev/reward_mean": 0.1} if step == steps else {})
            tracker.log({**rollout_metrics(trajs),
                         "train/question_visits": float(3 * step), **dev}, step)
    if curves:
        tracker.finish()
    return root
