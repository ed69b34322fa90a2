"""scripts.compare_runs: the learning runs' settings table and curves, from what runs wrote."""

import json

import pytest

from scripts import compare_runs


def _run(tmp_path, name, dev_f1, visits_per_step=16, with_eval=False):
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text(f"name: {name}\nseed: 0\n")
    rows = []
    for i, f1 in enumerate(dev_f1):
        step = i * 2
        if step:
            rows += [{"step": step - 1, "time/step_s": 30.0, "train/question_visits": (step - 1) * visits_per_step,
                      "rollout/reward_mean": -0.1},
                     {"step": step, "time/step_s": 30.0, "train/question_visits": step * visits_per_step,
                      "rollout/reward_mean": 0.1}]
        dev = {"step": step, "dev/answer_f1": f1, "dev/answer_cover_em": f1 / 2, "dev/episodes": 64,
               "time/eval_s": 60.0, "train/question_visits": step * visits_per_step}
        if step:  # a step's dev evaluation is in that step's row, as run_loop logs it
            rows[-1].update(dev)
        else:
            rows.append(dev)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if with_eval:
        (run / "eval").mkdir()
        results = [{"method": m, "dataset": d, "f1": f} for m, f in (("policy", 0.2), ("untrained", 0.1))
                   for d, f in (("all", f), ("nq", 0.9))]
        (run / "eval" / "results.json").write_text(json.dumps(results))
    return run


def test_summary_reads_visits_minutes_and_the_dev_curve(tmp_path):
    s = compare_runs.summarize(_run(tmp_path, "learn-a", [0.1, 0.3, 0.2], with_eval=True))
    assert s["name"] == "learn-a" and s["steps"] == 4 and s["visits"] == 64
    assert s["minutes"] == pytest.approx((4 * 30 + 3 * 60) / 60)
    assert s["F1"] == pytest.approx((0.1, 0.2, 0.3))
    assert s["test"] == {"trained": 0.2, "untrained": 0.1}   # dataset "all" only; no naive RAG row
    assert s["rewards"] == [(16.0, -0.1), (32.0, 0.1), (48.0, -0.1), (64.0, 0.1)]


def test_table_and_plot_hold_every_run(tmp_path, capsys):
    a, b = _run(tmp_path, "learn-a", [0.1, 0.3]), _run(tmp_path, "learn-b", [0.2, 0.2], with_eval=True)
    png = tmp_path / "curves.png"
    assert compare_runs.main([str(a), str(b), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| learn-a | learn-a | 2 | 32 |" in out and "0.100 → 0.300 (0.300)" in out
    assert "| 0.200 / 0.100 / – |" in out and "| – / – / – |" in out
    assert png.stat().st_size > 1000
    assert compare_runs.main([str(a), str(b), "--names", "A, B"]) == 0
    assert "| A | learn-a | 2 | 32 |" in capsys.readouterr().out
    assert compare_runs.main([str(a), str(b), "--names", "A"]) == 2
    assert "--names gives 1 labels for 2 runs" in capsys.readouterr().err


def test_a_directory_without_metrics_is_a_clear_error(tmp_path, capsys):
    assert compare_runs.main([str(tmp_path)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


def test_steps_a_resume_redid_count_once(tmp_path):
    """A run stopped after step 4 with its checkpoint at step 2, resumed: steps 3-4 are in the file twice
    (runs from before the tracker dropped them at resume); the later rows win, step 0's two rows stay."""
    run = _run(tmp_path, "resumed", [0.1, 0.3, 0.2])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    redone = [dict(r, **{"rollout/reward_mean": 0.5}) for r in rows if r["step"] in (3, 4)]
    warm = {"step": 0, "dev/answer_f1": 0.15, "dev/answer_cover_em": 0.1, "dev/episodes": 64, "time/eval_s": 60.0}
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:1] + [warm] + rows[1:] + redone) + "\n")
    s = compare_runs.summarize(run)
    assert s["steps"] == 4 and [c["step"] for c in s["curve"]] == [0, 0, 2, 4]
    assert s["rewards"][2:] == [(48.0, 0.5), (64.0, 0.5)]
    assert s["minutes"] == pytest.approx((4 * 30 + 4 * 60) / 60)
