"""Learning runs side by side (docs/learning.md's settings table): for each run directory, its question visits,
minutes, dev F1 / cover-EM at the start, end and best, and the test F1 of the trained and untrained
searcher when its evaluation ran; with --png, every run's dev F1 and training reward against the
question visits in one figure.

    .venv/bin/python -m scripts.compare_runs runs/<run> runs/<run> ... [--png curves.png] [--names a,b,...]

Reads only what the runs wrote (metrics.jsonl, config.yaml, eval/results.json); starts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from pipelines.tracking import without_redone_steps
from pipelines.train_metrics import dev_curve

EVAL_METHODS = (("policy", "trained"), ("untrained", "untrained"), ("naive_rag", "naive RAG"))


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl rows (dicts, one a step or dev evaluation), less the steps a resume redid.

    Raises:
        FileNotFoundError: `run_dir` has no metrics.jsonl (not a training run directory).
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: pass training run directories (runs/<run>)")
    return without_redone_steps([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def run_name(run_dir: Path) -> str:
    """The `name:` of the run's config.yaml (its setting), else the directory name."""
    cfg = Path(run_dir) / "config.yaml"
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            if line.startswith("name:"):
                return line.split(":", 1)[1].strip()
    return Path(run_dir).name


def test_f1(run_dir: Path) -> dict[str, float]:
    """Test F1 over all datasets by method label (trained / untrained / naive RAG) from eval/results.json;
    {} when the run has no evaluation yet."""
    path = Path(run_dir) / "eval" / "results.json"
    if not path.exists():
        return {}
    rows = {r["method"]: r for r in json.loads(path.read_text()) if r.get("dataset") == "all"}
    return {label: float(rows[m]["f1"]) for m, label in EVAL_METHODS if m in rows}


def summarize(run_dir: Path) -> dict[str, Any]:
    """One run's row: name, steps, visits (training questions seen), minutes (training steps plus dev
    evaluations, from `time/step_s` and `time/eval_s`), dev F1 / cover-EM at start, end and best (greedy),
    the dev curve, the training reward by visits ([(visits, rollout/reward_mean)]) and the test F1s."""
    rows = read_rows(run_dir)
    curve = dev_curve(rows)
    steps = [r for r in rows if "time/step_s" in r]
    seconds = sum(float(r["time/step_s"]) for r in steps) + sum(float(r.get("time/eval_s", 0.0)) for r in rows)
    visits = max((float(r.get("train/question_visits", 0.0)) for r in rows), default=0.0)
    rewards = [(float(r.get("train/question_visits", r["step"])), float(r["rollout/reward_mean"]))
               for r in steps if "rollout/reward_mean" in r]
    out: dict[str, Any] = {"run": str(run_dir), "name": run_name(run_dir), "steps": len(steps), "visits": visits,
                           "minutes": seconds / 60, "curve": curve, "rewards": rewards, "test": test_f1(run_dir)}
    for key in ("F1", "cover-EM"):
        out[key] = ((curve[0][key], curve[-1][key], max(c[key] for c in curve)) if curve
                    else (math.nan, math.nan, math.nan))
    return out


def format_table(summaries: list[dict[str, Any]]) -> str:
    """The summaries as one markdown table."""
    head = ("| setting | run | steps | visits | minutes | dev F1 start → end (best) | dev cover-EM start → end "
            "| test F1 trained / untrained / naive RAG |")
    lines = [head, "| --- | --- | ---: | ---: | ---: | --- | --- | --- |"]
    for s in summaries:
        f1, cem, test = s["F1"], s["cover-EM"], s["test"]
        tests = " / ".join(f"{test[label]:.3f}" if label in test else "–" for _, label in EVAL_METHODS)
        lines.append(f"| {s['name']} | {Path(s['run']).name} | {s['steps']} | {s['visits']:.0f} | {s['minutes']:.1f} "
                     f"| {f1[0]:.3f} → {f1[1]:.3f} ({f1[2]:.3f}) | {cem[0]:.3f} → {cem[1]:.3f} | {tests} |")
    return "\n".join(lines)


def plot(summaries: list[dict[str, Any]], out_png: Path) -> Path:
    """Each run's dev F1 (left) and training reward, the mean of a step's episodes (right), against the
    question visits (its steps where visits were not logged), in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, rx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, s in enumerate(summaries):
        xs = [c["visits"] if not math.isnan(c["visits"]) else c["step"] for c in s["curve"]]
        style = dict(color=f"C{i}", label=s["name"], linestyle=("-", "--", ":", "-.")[i % 4])  # overlapping runs stay visible
        ax.plot(xs, [c["F1"] for c in s["curve"]], marker="osv^D"[i % 5], markersize=8 - 1.5 * (i % 3), **style)
        rx.plot([v for v, _ in s["rewards"]], [r for _, r in s["rewards"]], lw=1, **style)
    for a, label in ((ax, "dev answer F1 (greedy)"), (rx, "training reward (step mean)")):
        a.set_xlabel("question visits (training questions seen)")
        a.set_ylabel(label)
        a.legend(fontsize=8)
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return Path(out_png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="training run directories (runs/<run>)")
    parser.add_argument("--png", type=Path, default=None, help="write the dev F1 curves here")
    parser.add_argument("--names", default=None,
                        help="comma-separated labels, one a run, for the table and the legend (default: config names)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(args.runs):
        print(f"compare_runs: --names gives {len(names)} labels for {len(args.runs)} runs; give one a run",
              file=sys.stderr)
        return 2
    try:
        summaries = [summarize(r) for r in args.runs]
    except FileNotFoundError as e:
        print(f"compare_runs: {e}", file=sys.stderr)
        return 2
    for s, name in zip(summaries, names or []):
        s["name"] = name
    print(format_table(summaries))
    if args.png:
        print(f"curves: {plot(summaries, args.png)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
