"""Run tracking: `metrics.jsonl` and wandb with the same keys, and the reward-curve PNG at the end.

wandb runs offline unless the config says otherwise (`train.wandb.mode`); its files live in the
run directory (`wandb/offline-run-*`) and `wandb sync <dir>` uploads them later.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from configs.schema import Config

REWARD_CURVE = "reward_curves.png"


class Tracker:
    """Appends one JSON line per step to `<run_dir>/metrics.jsonl` and logs the same dict to wandb.

    Args:
        run_dir: the run directory.
        cfg: the run's config (`train.wandb`; the whole config is the wandb run's config).
        wandb_id: the wandb run id to continue (resume), or None for a new run.
        resumed_at: the checkpoint's step when resuming: the existing rows up to it are kept and the later
            ones (logged after that checkpoint by the stopped run, and redone now) dropped; None for a new run,
            which starts the file afresh.
    """

    def __init__(self, run_dir: Path, cfg: Config, wandb_id: str | None = None, resumed_at: int | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        if resumed_at is None:
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            keep_rows_through(self.path, resumed_at)
        self.wandb_run = None
        self.wandb_id = wandb_id
        wb = cfg.train.wandb
        if wb.mode != "disabled":
            import wandb

            self.wandb_run = wandb.init(
                project=wb.project, entity=wb.entity, mode=wb.mode, dir=str(self.run_dir), name=self.run_dir.name,
                id=wandb_id, resume="allow" if wandb_id else None, tags=list(wb.tags) or None,
                config=cfg.model_dump(mode="json"),
            )
            self.wandb_id = self.wandb_run.id
            # The learning curve's x: dev scores against the training questions seen, not the step.
            self.wandb_run.define_metric("train/question_visits")
            self.wandb_run.define_metric("dev/*", step_metric="train/question_visits")

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Write one step's metrics (also to wandb, at `step`); step 0 is the dev evaluation before any update."""
        row = {"step": step, **{k: v for k, v in metrics.items() if k != "step"}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log(row, step=step)

    def finish(self) -> Path | None:
        """Close wandb and draw the reward curves; returns the PNG path (None without metrics)."""
        png = plot_reward_curves(self.path, self.run_dir / REWARD_CURVE) if self.path.exists() else None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None
        return png


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl (later rows win when a resumed run repeats a step)."""
    rows: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[int(row["step"])] = row
    return [rows[k] for k in sorted(rows)]


def keep_rows_through(path: Path, step: int) -> None:
    """Rewrite a metrics.jsonl keeping its rows up to `step` (a line that does not parse, one torn by a
    kill, goes too)."""
    kept = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            if int(json.loads(line)["step"]) <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    tmp = Path(path).with_suffix(".jsonl.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    tmp.replace(path)  # atomic: a kill here leaves the old file or the new one


def without_redone_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in file order, less those a resumed run redid: when a row's step (> 0) is not past the previous
    row's, the run resumed from a checkpoint before it, and the earlier rows from that step on are dropped.
    Step 0's rows all stay (the untrained and the warm-start dev evaluations). For runs written before
    `Tracker` dropped them at resume."""
    out: list[dict[str, Any]] = []
    for row in rows:
        step = int(row["step"])
        if step > 0 and out and step <= int(out[-1]["step"]):
            out = [r for r in out if int(r["step"]) < step]
        out.append(row)
    return out


def plot_reward_curves(metrics_path: Path, out_png: Path) -> Path | None:
    """Reward mean (± std band), each reward component, and the dev reward against the step; with dev
    answer metrics (`dev/answer_f1`), a third panel of dev F1 and cover-EM (greedy, step 0 = before
    any update). Returns `out_png`, or None when metrics.jsonl has no rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipelines.train_metrics import training_rows

    rows = read_metrics(metrics_path)
    if not rows:
        return None
    train_rows = training_rows(rows)  # a step-0 dev row is no training step
    has_dev = any("dev/answer_f1" in r for r in rows)
    fig, axes = plt.subplots(1, 3 if has_dev else 2, figsize=(18 if has_dev else 12, 4.5))
    _plot_reward(axes[0], train_rows, rows)
    axes[0].set_title(Path(metrics_path).parent.name)
    _plot_components(axes[1], train_rows)
    if has_dev:
        _plot_dev_answers(axes[2], rows)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return Path(out_png)


def _plot_reward(ax: Any, train_rows: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Training reward mean ± std per step, and the dev reward (greedy) where a row has one."""
    steps = [r["step"] for r in train_rows]
    mean = [r.get("rollout/reward_mean", math.nan) for r in train_rows]
    std = [r.get("rollout/reward_std", 0.0) for r in train_rows]
    ax.plot(steps, mean, label="reward (train rollouts)", color="C0")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.15, color="C0")
    dev = [(r["step"], r["dev/reward_mean"]) for r in rows if "dev/reward_mean" in r]
    if dev:
        ax.plot(*zip(*dev), "o--", label="reward (dev, greedy)", color="C3")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend()


def _plot_components(ax: Any, train_rows: list[dict[str, Any]]) -> None:
    """Each `rollout/reward/<component>` mean against the step."""
    steps = [r["step"] for r in train_rows]
    for i, key in enumerate(sorted({k for r in train_rows for k in r if k.startswith("rollout/reward/")})):
        ax.plot(steps, [r.get(key, math.nan) for r in train_rows], label=key.removeprefix("rollout/reward/"), color=f"C{i}")
    ax.set_xlabel("step")
    ax.set_ylabel("reward component (mean)")
    if ax.lines:
        ax.legend(fontsize=8)


def _plot_dev_answers(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Dev F1 and cover-EM (greedy, in [0, 1]) against the question visits (training questions seen;
    the step in runs from before that metric), from the rows with `dev/answer_f1`."""
    from pipelines.train_metrics import dev_curve

    curve = dev_curve(rows)
    by_visits = bool(curve) and not any(math.isnan(c["visits"]) for c in curve)
    xs = [c["visits"] if by_visits else c["step"] for c in curve]
    for name, color in (("F1", "C2"), ("cover-EM", "C4")):
        ax.plot(xs, [c[name] for c in curve], "o-", label=f"dev {name}", color=color)
    questions = int(curve[-1]["questions"]) if curve else 0
    ax.set_xlabel("question visits (training questions seen)" if by_visits else "step")
    ax.set_ylabel(f"dev answer score (greedy, {questions} questions)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
