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
        resumed: keep the existing metrics.jsonl lines (a resumed run appends after them).
    """

    def __init__(self, run_dir: Path, cfg: Config, wandb_id: str | None = None, resumed: bool = False):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        if not resumed and self.path.exists():
            self.path.unlink()
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

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Write one step's metrics (also to wandb, at `step`)."""
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


def plot_reward_curves(metrics_path: Path, out_png: Path) -> Path | None:
    """Reward mean (± std band), each reward component, and the dev reward against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    mean = [r.get("rollout/reward_mean", math.nan) for r in rows]
    std = [r.get("rollout/reward_std", 0.0) for r in rows]
    ax.plot(steps, mean, label="reward (train rollouts)", color="C0")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.15, color="C0")
    dev = [(r["step"], r["dev/reward_mean"]) for r in rows if "dev/reward_mean" in r]
    if dev:
        ax.plot(*zip(*dev), "o--", label="reward (dev, greedy)", color="C3")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend()
    ax.set_title(Path(metrics_path).parent.name)
    for i, key in enumerate(sorted({k for r in rows for k in r if k.startswith("rollout/reward/")})):
        ax2.plot(steps, [r.get(key, math.nan) for r in rows], label=key.removeprefix("rollout/reward/"), color=f"C{i}")
    ax2.set_xlabel("step")
    ax2.set_ylabel("reward component (mean)")
    if ax2.lines:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return Path(out_png)
