"""The learning check's table: each scoring's metrics per question, before -> after with paired 95% intervals,
and the verdict (`decide`). Pure computation over trajectory dicts (no Ray, no engine); the run that produces
the trajectories is `pipelines.learning_check`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.eval_stats import DEFAULT_RESAMPLES, DEFAULT_SEED, paired_difference

SETS = ("greedy", "sampled", "dev")
"""The scorings, in table order: the training questions greedy and sampled, then the dev questions (greedy)."""

CRITERIA = ("sampled", "greedy", "both")
"""What `decide` reads: the total reward of the sampled scoring, of the greedy one, or of both."""

REWARD = "reward"
"""The metric key of the total reward; components are `reward/<name>`."""


class LearningCheckError(ValueError):
    """A learning check that cannot run as asked (bad counts, a stage that is not there, too few questions)."""


# -- scores and the table ----------------------------------------------------------------------------------------

def episode_scores(traj: Mapping[str, Any]) -> dict[str, float]:
    """One trajectory's metrics: `reward` (the total; None counts 0), `reward/<name>` for each reward component it
    carries, `EM` and `F1` of its final answer against the gold answers (no answer, or one that normalizes to
    nothing, scores 0), and `searches` (its own searches: turns with a query)."""
    from recipes.metrics import exact_match, f1_score, normalize_answer

    out = {REWARD: float(traj.get("reward") or 0.0)}
    out.update({f"{REWARD}/{k}": float(v) for k, v in (traj.get("reward_components") or {}).items()})
    answer = str((traj.get("final") or {}).get("answer") or "")
    golds = list(traj.get("golden_answers") or [])
    ok = bool(normalize_answer(answer))
    out["EM"] = float(exact_match(answer, golds)) if ok else 0.0
    out["F1"] = float(f1_score(answer, golds)) if ok else 0.0
    out["searches"] = float(sum(t.get("query") is not None for t in traj.get("turns") or ()))
    return out


def per_question(trajs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Each question's (`group_id`'s) metrics (`episode_scores`), averaged over its samples; a reward component
    some of a question's samples lack counts 0 for them. Questions in first-seen order.

    Raises:
        LearningCheckError: no trajectories.
    """
    if not trajs:
        raise LearningCheckError("no trajectories to score")
    groups: dict[str, list[dict[str, float]]] = {}
    for t in trajs:
        groups.setdefault(str(t["group_id"]), []).append(episode_scores(t))
    out = {}
    for gid, scores in groups.items():
        keys = {k for s in scores for k in s}
        out[gid] = {k: sum(s.get(k, 0.0) for s in scores) / len(scores) for k in keys}
    return out


def learnable_groups(trajs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The questions (group ids, first-seen order) whose samples' total rewards differ
    (`pipelines.prepare.learnable.is_learnable`, there applied to answer F1): a group of equal rewards has zero
    GRPO advantage and trains nothing (DAPO's dynamic sampling; s3's learnable questions)."""
    from pipelines.prepare.learnable import is_learnable

    groups: dict[str, list[float]] = {}
    for t in trajs:
        groups.setdefault(str(t["group_id"]), []).append(float(t.get("reward") or 0.0))
    return [gid for gid, rewards in groups.items() if is_learnable(rewards)]


def metric_order(keys: set[str]) -> list[str]:
    """Table order: the total reward, its components (sorted), EM, F1, searches, then anything else (sorted)."""
    fixed = [REWARD, *sorted(k for k in keys if k.startswith(f"{REWARD}/")), "EM", "F1", "searches"]
    return [k for k in fixed if k in keys] + sorted(keys - set(fixed))


def compare(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]], set_name: str, *,
            resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Rows of one scoring: for each metric, the mean over questions before and after, and the paired difference
    (after − before) with its 95% bootstrap interval over questions (the metrics' units: reward points, EM and F1
    in [0, 1], searches per episode). A metric missing on one side counts 0 there.

    Returns:
        [{"set", "metric", "before", "after", "diff", "lo", "hi", "questions"}] in `metric_order`.
    Raises:
        LearningCheckError: no trajectories on a side, or the two sides hold different questions.
    """
    b, a = per_question(before), per_question(after)
    if set(b) != set(a):
        missing = sorted(set(b) ^ set(a))[:3]
        raise LearningCheckError(f"{set_name}: before and after scored different questions (e.g. {missing})")
    keys = list(b)
    rows = []
    for metric in metric_order({k for q in (*b.values(), *a.values()) for k in q}):
        xb = [b[q].get(metric, 0.0) for q in keys]
        xa = [a[q].get(metric, 0.0) for q in keys]
        diff, lo, hi = paired_difference(xa, xb, resamples=resamples, seed=seed)
        rows.append({"set": set_name, "metric": metric, "before": sum(xb) / len(xb), "after": sum(xa) / len(xa),
                     "diff": diff, "lo": lo, "hi": hi, "questions": len(keys)})
    return rows


def build_table(before: Mapping[str, Sequence[Mapping[str, Any]]], after: Mapping[str, Sequence[Mapping[str, Any]]],
                *, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """`compare` of every scoring in `SETS` order that both `before` and `after` hold (trajectory lists by set name).

    Raises:
        LearningCheckError: the two sides hold different scorings, or a scoring as in `compare`.
    """
    if set(before) != set(after):
        raise LearningCheckError(f"scorings differ: before {sorted(before)}, after {sorted(after)}")
    names = [s for s in SETS if s in before] + sorted(set(before) - set(SETS))
    return [row for name in names for row in compare(before[name], after[name], name, resamples=resamples, seed=seed)]


@dataclass
class Decision:
    """The check's verdict: `passed` only when the total reward rose with the interval above 0; `reason` says why."""

    passed: bool
    reason: str


def decide(table: Sequence[Mapping[str, Any]], criterion: str = "sampled") -> Decision:
    """Pass only when the total reward (`reward`) rose on the `criterion`'s scorings ("sampled", "greedy" or
    "both") with the lower end of its paired 95% interval above 0 (a rise of exactly 0, or an interval
    reaching 0, fails).

    Raises:
        LearningCheckError: an unknown criterion, or the table lacks the total reward of a scoring it names.
    """
    if criterion not in CRITERIA:
        raise LearningCheckError(f"--criterion {criterion!r}: use one of {', '.join(CRITERIA)}")
    sets = ("greedy", "sampled") if criterion == "both" else (criterion,)
    verdicts = []
    for name in sets:
        row = next((r for r in table if r["set"] == name and r["metric"] == REWARD), None)
        if row is None:
            raise LearningCheckError(f"the table has no total reward of the {name} scoring")
        rose = row["diff"] > 0 and row["lo"] > 0
        verdicts.append((rose, f"{name} reward {row['before']:.3f} -> {row['after']:.3f}, "
                               f"{row['diff']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}]"))
    passed = all(ok for ok, _ in verdicts)
    word = "rose, its interval above 0" if passed else "did not rise with its interval above 0"
    return Decision(passed, f"the recipe's total reward {word}: " + "; ".join(text for _, text in verdicts))


SET_TITLES = {"greedy": "training questions, greedy", "sampled": "training questions, sampled", "dev": "dev, greedy"}


def metric_title(metric: str) -> str:
    """A table row's metric name: `reward` -> "reward (total)", `reward/em` -> "reward: em"; others as they are."""
    if metric == REWARD:
        return "reward (total)"
    return f"reward: {metric.split('/', 1)[1]}" if metric.startswith(f"{REWARD}/") else metric


def format_table(table: Sequence[Mapping[str, Any]], titles: Mapping[str, str] | None = None) -> str:
    """The table as markdown: scoring, metric, before, after, after − before with its paired 95% interval, questions.
    `titles`: a scoring's name in the table (default `SET_TITLES`)."""
    titles = {**SET_TITLES, **(titles or {})}
    lines = ["| questions | metric | before | after | after − before [95% CI] | n |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in table:
        lines.append(f"| {titles.get(r['set'], r['set'])} | {metric_title(r['metric'])} | {r['before']:.3f} | "
                     f"{r['after']:.3f} | {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] | {r['questions']} |")
    return "\n".join(lines)
