"""Held-out dev evaluation during training: answer F1 / cover-EM and the collapse
signals in `rollout_metrics`, the schedule (`dev_eval_steps`: step 0, every `eval_every`, the last),
the run loop with a scripted trainer, the trend and reward curves with a step-0 dev row, and the
summary lines. No Ray, no model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import math

import pytest

from pipelines.run_loop import dev_eval_steps
from pipelines.train_metrics import (
    dev_curve,
    dev_summary,
    format_dev_curve,
    learning_trend,
    rollout_metrics,
    training_rows,
)


def traj(answer: str | None, golds: list[str], forced: bool | None = None, on_final: bool = True) -> dict:
    """A `Trajectory.to_json` dict of a one-turn episode that answers `answer` (None: no answer);
    `forced` sets `answer_forced` on `final` (`on_final`) or on the trajectory itself."""
    final = {"answer": answer, "selected_doc_ids": [], "evidence": None}
    t = {"group_id": "g", "qid": "q", "sample_index": 0, "question": "Who wrote Dune?", "golden_answers": golds,
         "recipe": "search_r1", "prompt_ids": [1, 2], "response_ids": [3, 4, 5], "loss_mask": [1, 1, 1],
         "logprobs": [0.0] * 3, "final": final, "finish_reason": "answer" if answer else "invalid",
         "weight_version": 0, "timings": {"score_s": 0.0}, "reward": 0.0, "reward_components": {},
         "turns": [{"text": "...", "action": "Answer" if answer else "Invalid", "query": None, "doc_ids": [],
                    "generated_tokens": 3, "observation_tokens": 0, "finish_reason": "stop",
                    "generate_s": 0.1, "search_s": 0.0}]}
    if forced is not None:
        (final if on_final else t)["answer_forced"] = forced
    return t


def test_answer_metrics_f1_cover_em_and_collapse_signals():
    trajs = [
        traj("Frank Herbert", ["Frank Herbert"]),                # EM 1, F1 1, cover 1
        traj("the author Frank Herbert", ["Frank Herbert"], forced=True),  # EM 0, F1 2*2/(3+2)=0.8, cover 1
        traj("Isaac Asimov", ["Frank Herbert"], forced=True, on_final=False),  # all 0
        traj(None, ["Frank Herbert"]),                           # no answer: 0 everywhere
    ]
    m = rollout_metrics(trajs, prefix="dev")
    assert m["dev/answer_em"] == pytest.approx(1 / 4)
    assert m["dev/answer_f1"] == pytest.approx((1 + 0.8) / 4)
    assert m["dev/answer_cover_em"] == pytest.approx(2 / 4)
    assert m["dev/answer_rate"] == pytest.approx(3 / 4)
    assert m["dev/answer_forced_rate"] == pytest.approx(2 / 4)  # read from final and from the trajectory
    assert m["dev/distinct_answer_rate"] == pytest.approx(3 / 3)
    assert m["dev/answer_words"] == pytest.approx((2 + 4 + 2) / 3)  # over the episodes that answered


def test_one_constant_answer_shows_as_a_low_distinct_rate():
    trajs = [traj("Paris.", ["Rome"]), traj("paris", ["Lyon"]), traj("The Paris", ["Paris"]), traj("", ["x"]),
             traj("the", ["the"])]  # "" and "the" normalize to nothing: no answer, score 0 (golds too)
    m = rollout_metrics(trajs)
    assert m["rollout/distinct_answer_rate"] == pytest.approx(1 / 3)
    assert m["rollout/answer_rate"] == pytest.approx(3 / 5) and m["rollout/answer_em"] == pytest.approx(1 / 5)
    assert m["rollout/answer_forced_rate"] == 0.0  # no answer_forced key anywhere: not forced


def test_answer_metrics_of_no_episodes_are_zero():
    m = rollout_metrics([])
    for key in ("answer_em", "answer_f1", "answer_cover_em", "answer_rate", "answer_forced_rate",
                "distinct_answer_rate", "answer_words"):
        assert m[f"rollout/{key}"] == 0.0, key


@pytest.mark.parametrize("total, every, start, expected", [
    (10, 4, 0, [0, 4, 8, 10]),   # step 0, every 4, and the last
    (8, 4, 0, [0, 4, 8]),        # the last step is a multiple: once
    (10, 0, 0, [10]),            # eval_every 0: only at the end, no step 0
    (10, 4, 4, [8, 10]),         # resumed after step 4: step 0 and 4 were evaluated already
    (10, 4, 5, [8, 10]),
    (10, 20, 0, [0, 10]),
    (1, 1, 0, [0, 1]),
    (5, 2, 5, []),               # nothing left to run
])
def test_dev_eval_schedule(total, every, start, expected):
    assert dev_eval_steps(total, every, start) == expected


def test_dev_eval_schedule_rejects_negative_arguments():
    with pytest.raises(ValueError, match=">= 0"):
        dev_eval_steps(10, -1, 0)


class DevTrainer:
    """The parts of `pipelines.train.Trainer` that `run_loop` uses, with dev evaluations recorded."""

    def __init__(self, run_dir: Path, total: int, eval_every: int, eval_questions: int = 32):
        self.cfg = SimpleNamespace(train=SimpleNamespace(recipe="r1_searcher", total_steps=total, stages=[],
                                                         eval_every=eval_every, save_every=0))
        self.run_dir, self.progress, self.eval_questions = run_dir, False, eval_questions
        self.on_phase = lambda phase: None
        self.evaluated, self.logged = [], []
        self.tracker = SimpleNamespace(log=lambda m, step: self.logged.append((step, dict(m))))

    def step(self, step: int) -> dict[str, float]:
        return {"step": float(step + 1), "rollout/reward_mean": 0.1 * step}

    def evaluate_dev(self, step: int, warm_started: bool = False) -> dict[str, float]:
        if not self.eval_questions:
            return {}
        self.evaluated.append("warm start" if warm_started else step)
        return {"dev/answer_f1": 0.5 if warm_started else 0.01 * step, "time/eval_s": 1.0}

    def warm_start(self) -> dict[str, float]:
        if self.kept:  # as pipelines.warm_start: the warm-started policy is kept
            (self.run_dir / "checkpoints" / "warm-start" / "policy" / "hf").mkdir(parents=True, exist_ok=True)
        return {"warm_start/kept": float(self.kept)}

    def save(self, step: int) -> None:
        pass


def test_run_loop_evaluates_before_the_first_update_and_on_schedule(tmp_path):
    from pipelines.run_loop import run_loop

    trainer = DevTrainer(tmp_path, total=5, eval_every=2)
    run_loop(trainer, 0)
    assert trainer.evaluated == [0, 2, 4, 5]
    assert [s for s, _ in trainer.logged] == [0, 1, 2, 3, 4, 5]
    assert trainer.logged[0][1] == {"dev/answer_f1": 0.0, "time/eval_s": 1.0}  # a dev-only row at step 0
    assert "dev/answer_f1" in trainer.logged[2][1] and "dev/answer_f1" not in trainer.logged[1][1]


def test_a_warm_start_gets_its_own_dev_point_after_the_untrained_one(tmp_path):
    """The dev curve by visits: untrained (step 0), the warm start only (its row at step 0), then RL; a
    warm start that kept nothing trained nothing, so no second point."""
    from pipelines.run_loop import run_loop

    trainer = DevTrainer(tmp_path, total=2, eval_every=2)
    trainer.cfg.train.warm_start, trainer.kept = SimpleNamespace(questions=8), 5
    run_loop(trainer, 0)
    assert trainer.evaluated == [0, "warm start", 2]
    assert [s for s, _ in trainer.logged] == [0, 0, 1, 2]
    assert trainer.logged[1][1] == {"warm_start/kept": 5.0, "dev/answer_f1": 0.5, "time/eval_s": 1.0}
    assert (tmp_path / "checkpoints" / "best").resolve().name == "warm-start"  # its dev F1 recorded and weighed
    nothing = DevTrainer(tmp_path, total=2, eval_every=2)
    nothing.cfg.train.warm_start, nothing.kept = SimpleNamespace(questions=8), 0
    run_loop(nothing, 0)
    assert nothing.evaluated == [0, 2] and nothing.logged[1] == (0, {"warm_start/kept": 0.0})


def test_eval_untrained_false_skips_the_untrained_point_and_keeps_the_warm_start_one(tmp_path):
    from pipelines.run_loop import run_loop

    trainer = DevTrainer(tmp_path, total=4, eval_every=2)
    trainer.cfg.train.eval_untrained = False
    trainer.cfg.train.warm_start, trainer.kept = SimpleNamespace(questions=8), 5
    run_loop(trainer, 0)
    assert trainer.evaluated == ["warm start", 2, 4]
    assert [s for s, _ in trainer.logged] == [0, 1, 2, 3, 4]  # step 0's one row: the warm start's
    assert "dev/answer_f1" in trainer.logged[0][1] and "warm_start/kept" in trainer.logged[0][1]


def test_run_loop_resumed_or_without_dev_questions_logs_no_step_0(tmp_path):
    from pipelines.run_loop import run_loop

    resumed = DevTrainer(tmp_path, total=5, eval_every=2)
    run_loop(resumed, 2)
    assert resumed.evaluated == [4, 5] and [s for s, _ in resumed.logged] == [3, 4, 5]
    none = DevTrainer(tmp_path, total=2, eval_every=1, eval_questions=0)
    run_loop(none, 0)
    assert [s for s, _ in none.logged] == [1, 2]  # evaluate_dev returned {}: no step-0 row


def dev_rows() -> list[dict]:
    """metrics.jsonl rows of a 6-step run with dev evaluations at steps 0, 3 and 6."""
    rows = [{"step": 0, "dev/answer_f1": 0.05, "dev/answer_cover_em": 0.06, "dev/answer_em": 0.03,
             "dev/answer_rate": 0.5, "dev/episodes": 32.0, "dev/reward_mean": 0.1, "time/eval_s": 40.0}]
    for s, r in enumerate([0.0, 0.1, 0.2, 0.4, 0.5, 0.6], start=1):
        row = {"step": s, "rollout/reward_mean": r, "rollout/reward_std": 0.1, "rollout/reward/format": r}
        if s % 3 == 0:
            row.update({"dev/answer_f1": 0.1 * s, "dev/answer_cover_em": 0.12 * s, "dev/answer_em": 0.05 * s,
                        "dev/answer_rate": 0.8, "dev/episodes": 32.0, "dev/reward_mean": 0.1 * s})
        rows.append(row)
    return rows


def test_a_step_0_dev_row_is_no_training_step():
    rows = dev_rows()
    assert [r["step"] for r in training_rows(rows)] == [1, 2, 3, 4, 5, 6]
    trend = {t["name"]: t for t in learning_trend(rows)}
    assert trend["reward"]["steps"] == 2  # 6 training steps, not 7 rows
    assert trend["reward"]["first"] == pytest.approx(0.05) and trend["reward"]["last"] == pytest.approx(0.55)
    assert learning_trend(rows[:2]) == []  # step 0 and one step: fewer than 2 training steps


def test_dev_curve_table_and_console_line():
    curve = dev_curve(dev_rows())
    assert [c["step"] for c in curve] == [0, 3, 6] and curve[1]["F1"] == pytest.approx(0.3)
    table = format_dev_curve(curve)
    assert table.splitlines()[0] == "| step | F1 | cover-EM | EM | answered |"
    assert "| 0 | 0.050 | 0.060 | 0.030 | 0.500 |" in table and format_dev_curve([]) == ""
    line = dev_summary(4, {"dev/answer_f1": 0.1234, "dev/answer_cover_em": 0.156, "dev/answer_em": 0.094,
                           "dev/answer_rate": 0.8125, "dev/episodes": 32.0, "time/eval_s": 41.2})
    assert line == "dev step 4: F1 0.123 cover-EM 0.156 EM 0.094 answered 0.81 (32 questions, 41 s)"


def test_reward_curves_png_with_dev_rows(tmp_path):
    import json

    from pipelines.tracking import plot_reward_curves

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in dev_rows()))
    png = plot_reward_curves(path, tmp_path / "curves.png")
    assert png == tmp_path / "curves.png" and png.stat().st_size > 10_000
    path.write_text(json.dumps(dev_rows()[0]) + "\n")  # stopped during step 1: only the step-0 row
    assert plot_reward_curves(path, tmp_path / "only0.png").stat().st_size > 0


def test_dev_curve_by_question_visits():
    """The learning curve's x is the training questions seen (`train/question_visits`), in the
    table and the PNG's dev panel."""
    rows = [{**r, "train/question_visits": 8.0 * r["step"]} for r in dev_rows()]
    curve = dev_curve(rows)
    assert [c["visits"] for c in curve] == [0.0, 24.0, 48.0]
    table = format_dev_curve(curve)
    assert table.splitlines()[0] == "| step | visits | F1 | cover-EM | EM | answered |"
    assert "| 3 | 24 | 0.300 |" in table
    assert all(math.isnan(c["visits"]) for c in dev_curve(dev_rows()))  # a run from before the metric


def test_dev_panel_is_drawn_against_visits(tmp_path):
    import json

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from pipelines.tracking import plot_reward_curves

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({**r, "train/question_visits": 8.0 * r["step"]}) + "\n" for r in dev_rows()))
    seen = {}
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        seen["xlabel"], seen["x"] = fig.axes[2].get_xlabel(), list(fig.axes[2].lines[0].get_xdata())
        return real(fig, *a, **k)

    plt.Figure.savefig = keep
    try:
        plot_reward_curves(path, tmp_path / "curves.png")
    finally:
        plt.Figure.savefig = real
    assert seen["xlabel"].startswith("question visits") and seen["x"] == [0.0, 24.0, 48.0]
