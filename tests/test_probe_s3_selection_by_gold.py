"""`scripts.probes.s3_selection_by_gold`: selection shares by gold and position, from hand-made saved rollouts."""

from __future__ import annotations

import gzip
import json

from scripts.probes.s3_selection_by_gold import main

# d1 and d3 hold the gold answer "Paris"; d2 and d4 do not
CORPUS = {"d1": "Paris is the capital.", "d2": "Lyon is a city.", "d3": "Paris hosts the Louvre.", "d4": "Nice is warm."}


def _traj(turns: list[tuple[str, list[str] | None]], shown: list[str]) -> dict:
    return {"group_id": "g", "reward": 0.0, "golden_answers": ["Paris"],
            "turns": [{"text": text, "doc_ids": ids} for text, ids in turns],
            "final": {"search": {"shown_doc_ids": shown}}}


def write_run(tmp_path, corpus: dict[str, str], trajectories: list[dict], recipe: str = "s3", step: int = 5):
    """A run directory with a config (top-2, `data.dir` a one-file pack of `corpus`) and one saved step."""
    data = tmp_path / "data"
    data.mkdir(parents=True)
    with gzip.open(data / "corpus.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"id": i, "title": "", "text": t}) + "\n" for i, t in corpus.items())
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "config.yaml").write_text(f"train:\n  recipe: {recipe}\n  recipe_options: {{max_turns: 3, prefill: ''}}\n"
                                     f"data:\n  dir: {data}\nretrieval:\n  topk: 2\n")
    with gzip.open(run / "rollouts" / f"step-{step}.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(t) + "\n" for t in trajectories)
    return run


def _run(tmp_path, recipe: str = "s3"):
    q = '<query>{"query": "x"}</query>'
    step = [
        # initial top-2 [d1, d2]: selects [1] (the gold one); its search returns [d4, d3]; selects [1] (not gold)
        _traj([("<important_info>[1]</important_info>" + q, ["d4", "d3"]),
               ("<important_info>[1]</important_info><search_complete>True</search_complete>", None)],
              shown=["d1", "d2", "d4", "d3"]),
        # initial top-2 [d2, d1]: writes no selection (unwritten); its search returns [d3, d2]; selects [1] (gold)
        _traj([(q, ["d3", "d2"]), ("<important_info>[1]</important_info><search_complete>True</search_complete>", None)],
              shown=["d2", "d1", "d3"]),
    ]
    return write_run(tmp_path, CORPUS, step, recipe)


def test_counts_by_block_position_and_gold(tmp_path, capsys):
    run = _run(tmp_path)
    assert main([str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == [5, 5]
    assert out["initial"] == {"positions": {"1": {"gold_n": 1, "gold_selected": 1, "other_n": 0, "other_selected": 0},
                                            "2": {"gold_n": 0, "gold_selected": 0, "other_n": 1, "other_selected": 0}},
                              "unwritten": 1}
    # position 1 after a search: selected both times, once gold (d3) once not (d4): a position, lift 0
    assert out["search"]["positions"]["1"] == {"gold_n": 1, "gold_selected": 1, "other_n": 1, "other_selected": 1}
    assert out["search"]["positions"]["2"] == {"gold_n": 1, "gold_selected": 0, "other_n": 1, "other_selected": 0}
    assert main([str(run), "--steps", "5-5"]) == 0
    table = capsys.readouterr().out
    assert "| search | 1 | 1 | 1.00 | 1 | 1.00 | +0.00 |" in table and "| initial | 2 | 0 | - | 1 | 0.00 | - |" in table


def test_bad_run_and_range_exit_2(tmp_path, capsys):
    run = _run(tmp_path)
    assert main([str(run), "--steps", "7-9"]) == 2
    assert "no saved step in that range; the run has 5-5" in capsys.readouterr().err
    assert main([str(run), "--steps", "a-b"]) == 2
    assert "write LO-HI or N" in capsys.readouterr().err
    assert main([str(_run(tmp_path / "other", recipe="search_r1"))]) == 2
    assert "this probe reads s3 runs" in capsys.readouterr().err
