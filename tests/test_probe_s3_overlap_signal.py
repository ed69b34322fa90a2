"""`scripts.probes.s3_overlap_signal`: question overlap against holding the gold, from hand-made saved rollouts."""

from __future__ import annotations

import json

import pytest

from recipes.expert import key_words
from scripts.probes.s3_overlap_signal import auc, main, overlap
from tests.test_probe_s3_selection_by_gold import write_run

# question content words: city, capital, france. d1 and d3 hold the gold answer "Paris"
CORPUS = {"d1": "Paris is the capital of France.", "d2": "Lyon is a city.", "d3": "Paris hosts the Louvre.",
          "d4": "Nice is warm."}
QUESTION = "Which city is the capital of France?"


def _run(tmp_path, recipe: str = "s3"):
    q = '<query>{"query": "x"}</query>'
    traj = {"group_id": "g", "question": QUESTION, "golden_answers": ["Paris"],
            "turns": [{"text": q, "doc_ids": ["d3", "d4"]},
                      {"text": "<search_complete>True</search_complete>", "doc_ids": None}],
            "final": {"search": {"shown_doc_ids": ["d1", "d2", "d3", "d4"]}}}
    return write_run(tmp_path, CORPUS, [traj], recipe, step=3)


def test_overlap_and_auc():
    words = set(key_words(QUESTION))
    assert overlap(words, "", CORPUS["d1"]) == pytest.approx(2 / 3)
    assert overlap(words, "Lyon", CORPUS["d2"]) == pytest.approx(1 / 3)
    assert overlap(set(key_words("What is it?")), "", "anything") == 0.0  # no content word
    assert auc([(0.9, True), (0.1, False), (0.5, False)]) == 1.0
    assert auc([(0.1, True), (0.9, False)]) == 0.0
    assert auc([(0.5, True), (0.5, False)]) == 0.5  # a tie counts half
    assert auc([(0.5, True)]) is None


def test_blocks_from_a_run(tmp_path, capsys):
    run = _run(tmp_path)
    assert main([str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # initial top-2: d1 (gold, 2/3) above d2 (1/3): separated. Search block: d3 (gold, 0) ties d4 (0)
    assert out["initial"]["docs"] == 2 and out["initial"]["gold"] == 1 and out["initial"]["auc"] == 1.0
    assert out["search"]["auc"] == 0.5
    cut = {c["t"]: c for c in out["initial"]["thresholds"]}
    assert cut[0.2] == {"t": 0.2, "selected": 2, "precision": 0.5, "recall": 1.0}
    assert cut[0.6] == {"t": 0.6, "selected": 1, "precision": 1.0, "recall": 1.0}
    assert cut[0.8]["selected"] == 0 and cut[0.8]["precision"] is None
    assert main([str(run)]) == 0
    assert "| initial | 2 | 1 | 1.00 | 2, 0.50, 1.00 |" in capsys.readouterr().out
    assert main([str(run), "--steps", "9"]) == 2
    assert "no saved step in that range" in capsys.readouterr().err
    assert main([str(_run(tmp_path / "other", recipe="search_r1"))]) == 2
    assert "this probe reads s3 runs" in capsys.readouterr().err
