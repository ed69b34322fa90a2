"""Step metrics of a training run, from trajectories (dicts of `Trajectory.to_json`) and the
learners' results; one flat dict per step with the same keys in metrics.jsonl and wandb."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from recipes.metrics import exact_match, query_overlaps_question

FINISH_REASONS = ("answer", "complete", "max_turns", "max_total_tokens", "invalid")


def _mean(xs: Sequence[float]) -> float:
    return float(statistics.fmean(xs)) if xs else 0.0


def rollout_metrics(trajs: Sequence[Mapping[str, Any]], prefix: str = "rollout") -> dict[str, float]:
    """Reward mean/std and every reward component's mean, response length (tokens), turns and
    searches per episode, the fraction of episodes that searched, the fraction of searches whose query
    shares a content word with the question (`recipes.metrics.query_overlaps_question`), valid-action rate, finish-reason fractions, retrieval latency (s), scoring
    time per episode (s; it overlaps other episodes' generation, so it is not a phase of the step),
    and the exact match of the final answers, under `<prefix>/...` keys."""
    n = max(1, len(trajs))
    rewards = [float(t.get("reward") or 0.0) for t in trajs]
    turns = [r for t in trajs for r in t["turns"]]
    searches = [r for r in turns if r.get("query") is not None]
    components: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in (t.get("reward_components") or {}).items():
            components.setdefault(k, []).append(float(v))
    out = {
        "reward_mean": _mean(rewards),
        "reward_std": float(statistics.pstdev(rewards)) if len(rewards) > 1 else 0.0,
        "response_tokens": sum(len(t["response_ids"]) for t in trajs) / n,
        "policy_tokens": sum(sum(t["loss_mask"]) for t in trajs) / n,
        "turns_per_episode": len(turns) / n,
        "searches_per_episode": len(searches) / n,
        "searched_episode_rate": sum(any(r.get("query") is not None for r in t["turns"]) for t in trajs) / n,
        "relevant_search_rate": _mean([float(query_overlaps_question(r["query"], t["question"]))
                                       for t in trajs for r in t["turns"] if r.get("query") is not None]),
        "valid_action_rate": sum(r["action"] != "Invalid" for r in turns) / max(1, len(turns)),
        "retrieval_latency_s": _mean([r["search_s"] for r in searches]),
        "generate_s_per_turn": _mean([r["generate_s"] for r in turns]),
        "score_s_per_episode": _mean([t["timings"]["score_s"] for t in trajs]),
        "answer_em": _mean([exact_match(t["final"].get("answer") or "", t["golden_answers"]) for t in trajs]),
        "episodes": float(len(trajs)),
    }
    out.update({f"reward/{k}": _mean(v) for k, v in components.items()})
    reasons = Counter(t["finish_reason"] for t in trajs)
    out.update({f"finish/{r}": reasons.get(r, 0) / n for r in sorted(set(FINISH_REASONS) | set(reasons))})
    return {f"{prefix}/{k}": float(v) for k, v in out.items()}


def learner_metrics(policy: Mapping[str, float], critic: Mapping[str, float] | None = None) -> dict[str, float]:
    """Learner results under `actor/...` and `critic/...` keys."""
    out = {f"actor/{k}": float(v) for k, v in policy.items()}
    out.update({f"critic/{k}": float(v) for k, v in (critic or {}).items()})
    return out


TREND_KEYS = (("rollout/reward_mean", "reward"), ("rollout/searches_per_episode", "searches/episode"),
              ("rollout/valid_action_rate", "valid-action rate"), ("rollout/relevant_search_rate", "relevant queries"),
              ("rollout/finish/answer", "answered"))


def learning_trend(rows: Sequence[Mapping[str, Any]], keys: Sequence[tuple[str, str]] = TREND_KEYS
                   ) -> list[dict[str, Any]]:
    """Did the run learn? For each metric key: its mean over the first third of the steps, over the
    last third, and the change (last − first). Thirds are `max(1, steps // 3)` steps; fewer than 2
    steps gives an empty list.

    Returns:
        [{"key", "name", "first", "last", "change", "steps"}] for the keys present in the rows.
    """
    if len(rows) < 2:
        return []
    k = max(1, len(rows) // 3)
    out = []
    for key, name in keys:
        first = [float(r[key]) for r in rows[:k] if key in r]
        last = [float(r[key]) for r in rows[-k:] if key in r]
        if first and last:
            out.append({"key": key, "name": name, "first": _mean(first), "last": _mean(last),
                        "change": _mean(last) - _mean(first), "steps": k})
    return out


def format_trend(trend: Sequence[Mapping[str, Any]]) -> str:
    """`learning_trend` as a markdown table (metric, first third, last third, change)."""
    if not trend:
        return ""
    k = trend[0]["steps"]
    lines = [f"| metric | first {k} steps | last {k} steps | change |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {t['name']} | {t['first']:.3f} | {t['last']:.3f} | {t['change']:+.3f} |" for t in trend]
    return "\n".join(lines)


def step_summary(metrics: dict[str, float]) -> str:
    """One line of a step's headline numbers: reward, searches and valid actions per episode, and
    seconds per phase (rollout incl. scoring, log-probs and advantages, update, weight sync)."""
    t = {k: metrics.get(f"time/{k}_s", 0.0) for k in ("rollout", "prepare", "update", "sync")}
    return (f"reward {metrics.get('rollout/reward_mean', 0.0):.3f} searches {metrics.get('rollout/searches_per_episode', 0.0):.2f} "
            f"valid {metrics.get('rollout/valid_action_rate', 0.0):.2f} | rollout {t['rollout']:.0f}s "
            f"prep {t['prepare']:.0f}s update {t['update']:.0f}s sync {t['sync']:.0f}s")


FAULT_KEYS = ("rollout_worker_deaths", "rollout_parts_rerun", "rollout_stale_parts", "shard_retries",
              "search_retries", "scoring_retries", "learner_restarts", "steps_redone")


def fault_metrics(counts: Mapping[str, int]) -> dict[str, float]:
    """Failures and recoveries under `faults/...` keys, every key of FAULT_KEYS present (0 when
    nothing failed, so the curves are continuous): rollout worker deaths, the parts re-run, parts
    re-run because a restarted worker sampled with old weights, learner rebuilds and the steps they
    redid (counted by the driver), shard calls the pool retried through a shard restart, search and frozen-LLM scoring retries (counted by the workers)."""
    return {f"faults/{k}": float(counts.get(k, 0)) for k in FAULT_KEYS}
