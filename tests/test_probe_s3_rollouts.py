"""`scripts.probes.s3_rollouts`: an s3 run's per-step searcher measures, from hand-made saved rollouts."""

from __future__ import annotations

import gzip
import json

import pytest

from recipes import get_recipe
from scripts.probes.s3_rollouts import main, step_summary


def _traj(group: str, reward: float, turns: list[tuple[str, str | None]], *, docs: int, ctx: bool,
          searches: int, found: bool, rag: float = 0.0, initial: bool | None = None) -> dict:
    return {"group_id": group, "reward": reward, "reward_components": {"gen_acc_s3": reward + rag, "gen_acc_rag": rag},
            "turns": [{"text": text, "query": query} for text, query in turns],
            "final": {"selected_doc_ids": [f"d{i}" for i in range(docs)],
                      "search": {"context_hit": ctx, "own_searches": searches, "found_by_search": found,
                                 "initial_hit": ctx if initial is None else initial}}}


def _run(tmp_path, recipe: str = "s3"):
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "config.yaml").write_text(f"train:\n  recipe: {recipe}\n  recipe_options: {{max_turns: 3, prefill: ''}}\n")
    q = '<query>{"query": "%s"}</query>'
    step = [
        # group a: first turn leaves the top-3 whole, searches twice with two queries, selects [2] then nothing
        _traj("a", 0.5, [(q % "x y", "x y"), ("<important_info>[2]</important_info>" + q % "z", "z"),
                         ("<search_complete>True</search_complete>", None)], docs=4, ctx=True, searches=2, found=True,
                         initial=False),
        _traj("a", 0.0, [("<important_info>[1]</important_info><search_complete>True</search_complete>", None)],
              docs=1, ctx=False, searches=0, found=False),
        # group b: both samples score 0 (tied); one selection after a search, which found a gold answer beside
        # the one the top-k held (found, not found_new)
        _traj("b", 0.0, [("<important_info>[]</important_info>" + q % "x", "x"),
                         ("<important_info>[2]</important_info><search_complete>True</search_complete>", None)],
              docs=1, ctx=True, searches=1, found=True),
        _traj("b", 0.0, [("<important_info>[1, 3]</important_info><search_complete>True</search_complete>", None)],
              docs=2, ctx=False, searches=0, found=False),
        # group c: naive RAG was right (a --keep-answered question); one sample keeps it, one loses it
        _traj("c", 0.0, [("<important_info>[1, 3]</important_info><search_complete>True</search_complete>", None)],
              docs=2, ctx=True, searches=0, found=False, rag=1.0),
        _traj("c", -1.0, [("<important_info>[]</important_info><search_complete>True</search_complete>", None)],
              docs=0, ctx=False, searches=0, found=False, rag=1.0),
    ]
    with gzip.open(run / "rollouts" / "step-3.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(t) + "\n" for t in step)
    return run


def test_step_measures_from_saved_rollouts(tmp_path, capsys):
    run = _run(tmp_path)
    assert main([str(run), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["step"] == 3 and row["episodes"] == 6 and row["groups"] == 3
    assert row["reward"] == -0.5 / 6 and row["docs"] == 10 / 6 and row["ctx_recall"] == 0.5
    assert row["searches"] == 0.5 and row["found"] == 2 / 6 and row["distinct_q>1"] == 1
    assert row["found_new"] == 1 / 6 and row["gained"] == 1 / 6  # group a's first sample: its context holds the gold the top-k lacked
    assert row["whole_first"] == 1  # only group a's first sample wrote no <important_info> in turn 1
    assert row["search_sel"] == {"[2]": 2, "none": 1}  # the selections written after a search
    assert row["first_sel"] == {"[1, 3]": 2, "[]": 2, "none": 1}  # commonest first; [1] (once) is cut
    assert row["tied"] == 1  # group b: 0.0 and 0.0
    assert (row["lost"], row["rag_right"]) == (1, 2)  # group c: naive RAG right twice, the empty context lost it
    # the run's GRPO advantages ((r − mean) / std, n − 1) by first-turn selection, tied group b left out: groups a
    # ([0.5, 0]) and c ([0, −1]) differ in spread and weigh alike (±0.707 each; the three largest are kept)
    signs = {"none": 1, "[1]": -1, "[1, 3]": 1, "[]": -1}
    assert len(row["first_adv"]) == 3
    assert all(v == pytest.approx(signs[k] * 0.5**0.5, abs=1e-5) for k, v in row["first_adv"].items())
    with gzip.open(run / "rollouts" / "step-3.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    raw = step_summary(get_recipe("s3", {"max_turns": 3, "prefill": ""}), rows)["first_adv"]  # no algorithm
    assert raw == {"[1, 3]": 0.5, "[]": -0.5, "none": 0.25}  # reward − group mean: a's [1] (−0.25) is cut
    assert main([str(run), "--steps", "3"]) == 0
    table = capsys.readouterr().out
    assert ("| 3 | -0.083 | 1.7 | 0.50 | 0.50 | 1 of 6 | 0.33 | 0.17 | 0.17 | 1 of 6 | `[2]` 2, `none` 1 | 1 of 3 "
            "| `[]` 2, `[1, 3]` 2, `none` 1 | ") in table and "+0.71" in table and "| 1 of 2 | 1 (F1 0: 1) |" in table
    # judge_only: group c's kept answer scored 1 with no answer text saved (no span match, F1 0)


def test_judge_only_accuracy_is_told_apart_from_a_span_match():
    def episode(answer: str, acc: float) -> dict:
        return {"group_id": "g", "reward": acc, "reward_components": {"gen_acc_s3": acc, "gen_acc_rag": 0.0},
                "turns": [], "golden_answers": ["Kyoto Protocol", "Kioto protocol"], "final": {"answer": answer}}

    rows = [episode("the Kyoto Protocol", 1.0),  # span check: no judge needed
            episode("Kyoto", 1.0),  # the judge's yes on a partial answer (F1 2/3)
            episode("Mulder", 1.0),  # the judge's yes on an answer sharing no word with the golds
            episode("Mulder", 0.0)]  # the judge said no
    s = step_summary(get_recipe("s3", {"max_turns": 3, "prefill": ""}), rows)
    assert (s["judge_only"], s["judge_only_f1_0"]) == (2, 1)


def test_bad_runs_and_steps_are_named(tmp_path, capsys):
    run = _run(tmp_path)
    assert main([str(run), "--steps", "3,9"]) == 2
    assert "no rollouts for step(s) [9]" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing")]) == 2
    assert "config.yaml: no such file" in capsys.readouterr().err
    other = _run(tmp_path / "r1", recipe="search_r1")
    assert main([str(other)]) == 2
    assert "this probe reads s3 runs" in capsys.readouterr().err
