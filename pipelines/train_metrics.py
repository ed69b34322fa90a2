"""Step metrics of a training run, from trajectories (dicts of `Trajectory.to_json`) and the
learners' results; one flat dict per step with the same keys in metrics.jsonl and wandb."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from recipes.metrics import cover_exact_match, exact_match, f1_score, normalize_answer, query_overlaps_question
from recipes.search_metrics import search_summary

FINISH_REASONS = ("answer", "complete", "max_turns", "max_total_tokens", "invalid")


def _mean(xs: Sequence[float]) -> float:
    return float(statistics.fmean(xs)) if xs else 0.0


def answer_metrics(trajs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """How good and how varied the episodes' final answers (`final["answer"]`) are; an answer that
    normalizes to nothing (`recipes.metrics.normalize_answer`) counts as none and scores 0.

    Returns (every value 0.0 for no episodes or no answers):
        answer_em, answer_f1, answer_cover_em: means over all episodes of exact match, token F1 and
            cover-EM (substring, FlashRAG's) against the golden answers;
        answer_rate: share of episodes with an answer;
        answer_forced_rate: share of episodes whose answer the rollout forced (a truthy
            `answer_forced` on the trajectory or on its `final`; absent = not forced);
        distinct_answer_rate: distinct normalized answers / episodes with an answer (1 = all
            differ; near 0 = the policy collapsed onto one constant answer);
        answer_words: mean whitespace words of the answer as written, over episodes with an answer.
    """
    finals = [t.get("final") or {} for t in trajs]
    answers = [str(f.get("answer") or "") for f in finals]
    golds = [list(t["golden_answers"]) for t in trajs]
    answered = [a for a in answers if normalize_answer(a)]

    def score(metric: Any) -> float:  # no answer scores 0, whatever the metric makes of ""
        return _mean([metric(a, g) if normalize_answer(a) else 0.0 for a, g in zip(answers, golds)])

    n = max(1, len(trajs))
    return {
        "answer_em": score(exact_match),
        "answer_f1": score(f1_score),
        "answer_cover_em": score(cover_exact_match),
        "answer_rate": len(answered) / n,
        "answer_forced_rate": sum(bool(t.get("answer_forced") or f.get("answer_forced"))
                                  for t, f in zip(trajs, finals)) / n,
        "distinct_answer_rate": len({normalize_answer(a) for a in answered}) / max(1, len(answered)),
        "answer_words": _mean([float(len(a.split())) for a in answered]),
    }


def rollout_metrics(trajs: Sequence[Mapping[str, Any]], prefix: str = "rollout") -> dict[str, float]:
    """Reward mean/std and every reward component's mean, response length (tokens), turns and
    searches per episode, the fraction of episodes that searched, the fraction of searches whose query
    shares a content word with the question (`recipes.metrics.query_overlaps_question`), valid-action rate, finish-reason fractions, retrieval latency (s), scoring
    time per episode (s; it overlaps other episodes' generation, so it is not a phase of the step),
    the documents an episode's final context keeps (s3's selection; 0 for recipes that answer),
    the final answers' EM, F1, cover-EM, answer/forced/distinct rates and length in words
    (`answer_metrics`), and the search itself from each trajectory's `final["search"]`
    (`recipes.search_metrics.search_summary`: own searches, retrieval recall, initial recall, the share of
    episodes whose own search found a gold-holding document, gold-paragraph recall, context recall where a
    frozen generator reads a context), under `<prefix>/...` keys."""
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
        "selected_docs_per_episode": sum(len((t.get("final") or {}).get("selected_doc_ids") or ()) for t in trajs) / n,
        "relevant_search_rate": _mean([float(query_overlaps_question(r["query"], t["question"]))
                                       for t in trajs for r in t["turns"] if r.get("query") is not None]),
        "valid_action_rate": sum(r["action"] != "Invalid" for r in turns) / max(1, len(turns)),
        "retrieval_latency_s": _mean([r["search_s"] for r in searches]),
        "generate_s_per_turn": _mean([r["generate_s"] for r in turns]),
        "score_s_per_episode": _mean([t["timings"]["score_s"] for t in trajs]),
        "episodes": float(len(trajs)),
        **answer_metrics(trajs),
    }
    records = [(t.get("final") or {}).get("search") for t in trajs]
    if any(records):
        out.update(search_summary([r for r in records if r]))
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
              ("rollout/retrieval_recall", "retrieval recall"), ("rollout/found_by_search_rate", "found by search"),
              ("rollout/valid_action_rate", "valid-action rate"), ("rollout/relevant_search_rate", "relevant queries"),
              ("rollout/finish/answer", "answered"), ("rollout/answer_forced_rate", "answer forced"),
              ("rollout/answer_f1", "answer F1"), ("rollout/distinct_answer_rate", "distinct answers"))


def training_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of metrics.jsonl that are training steps (they carry `rollout/...` keys); the step-0
    row of the dev evaluation before any update has only `dev/...` and `time/eval_s`."""
    return [r for r in rows if any(k.startswith("rollout/") for k in r)]


def learning_trend(rows: Sequence[Mapping[str, Any]], keys: Sequence[tuple[str, str]] = TREND_KEYS
                   ) -> list[dict[str, Any]]:
    """Did the run learn? For each metric key: its mean over the first third of the steps, over the
    last third, and the change (last − first). Thirds are `max(1, steps // 3)` steps; fewer than 2
    steps gives an empty list. Only training rows count (`training_rows`: a step-0 dev row is not a step).

    Returns:
        [{"key", "name", "first", "last", "change", "steps"}] for the keys present in the rows.
    """
    rows = training_rows(rows)
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


DEV_CURVE_KEYS = (("dev/answer_f1", "F1"), ("dev/answer_cover_em", "cover-EM"), ("dev/answer_em", "EM"),
                  ("dev/answer_rate", "answered"), ("dev/own_searches", "own searches"),
                  ("dev/retrieval_recall", "retrieval recall"), ("dev/context_recall", "context recall"))
SEARCH_CURVE_KEYS = ("dev/own_searches", "dev/retrieval_recall", "dev/context_recall")
"""Dev-curve keys of the search itself: NaN in rows of runs from before them, not 0: those runs did not measure it."""


def dev_curve(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """The dev evaluations of a run's metrics.jsonl rows, in step order: [{"step", "F1", "cover-EM",
    "EM", "answered", "own searches", "retrieval recall", "context recall", "questions", "visits"}] for the rows
    with `dev/answer_f1` (step 0 = before any update; visits = training questions seen, `train/question_visits`;
    own searches per question, retrieval recall and context recall (s3, naive RAG); each NaN in runs from before
    it or without it); another key missing from a row reads 0."""
    return [{"step": float(r["step"]),
             **{name: float(r.get(key, math.nan if key in SEARCH_CURVE_KEYS else 0.0)) for key, name in DEV_CURVE_KEYS},
             "questions": float(r.get("dev/episodes", 0.0)), "visits": float(r.get("train/question_visits", math.nan))}
            for r in rows if "dev/answer_f1" in r]


def format_dev_curve(curve: Sequence[Mapping[str, float]]) -> str:
    """`dev_curve` as a markdown table (step, question visits where the run logged them, F1, cover-EM,
    EM, answered, and own searches, retrieval and context recall per question where the run logged them); "" without
    dev rows."""
    if not curve:
        return ""
    names = [name for _, name in DEV_CURVE_KEYS if not all(math.isnan(c.get(name, math.nan)) for c in curve)]
    visits = not any(math.isnan(c.get("visits", math.nan)) for c in curve)
    head = "| step | visits | " if visits else "| step | "
    lines = [head + " | ".join(names) + " |", "| ---: |" + " ---: |" * (len(names) + visits)]
    lines += [f"| {c['step']:.0f} | " + (f"{c['visits']:.0f} | " if visits else "")
              + " | ".join(f"{c[n]:.3f}" for n in names) + " |" for c in curve]
    return "\n".join(lines)


def dev_summary(step: int, metrics: Mapping[str, float]) -> str:
    """One console line of a dev evaluation after `step` completed steps (0 = before any update):
    F1, cover-EM, EM, share answered, own searches, retrieval and context recall (when measured), questions and seconds
    (`time/eval_s`)."""
    m = {k: float(metrics.get(k, 0.0)) for k in ("dev/answer_f1", "dev/answer_cover_em", "dev/answer_em",
                                                   "dev/answer_rate", "dev/episodes", "time/eval_s",
                                                   "dev/own_searches", "dev/retrieval_recall")}
    search = (f"own searches {m['dev/own_searches']:.2f} retrieval recall {m['dev/retrieval_recall']:.3f} "
              if "dev/retrieval_recall" in metrics else "")
    if "dev/context_recall" in metrics:
        search += f"context recall {float(metrics['dev/context_recall']):.3f} "
    return (f"dev step {step}: F1 {m['dev/answer_f1']:.3f} cover-EM {m['dev/answer_cover_em']:.3f} "
            f"EM {m['dev/answer_em']:.3f} answered {m['dev/answer_rate']:.2f} {search}"
            f"({m['dev/episodes']:.0f} questions, {m['time/eval_s']:.0f} s)")


def step_summary(metrics: dict[str, float], searches: bool = True) -> str:
    """One line of a step's headline numbers and seconds per phase (rollout incl. scoring, log-probs and
    advantages, update, weight sync). A recipe that searches (`searches`): reward, searches and valid
    actions per episode. One that only selects from its prompt's documents (s3 with max_turns 0:
    `recipe_searches` False): reward, valid selections, documents kept per episode and the generator's
    answer F1."""
    t = {k: metrics.get(f"time/{k}_s", 0.0) for k in ("rollout", "prepare", "update", "sync")}
    m = {k: metrics.get(f"rollout/{k}", 0.0) for k in ("reward_mean", "searches_per_episode", "valid_action_rate",
                                                        "selected_docs_per_episode", "answer_f1")}
    head = (f"reward {m['reward_mean']:.3f} searches {m['searches_per_episode']:.2f} valid {m['valid_action_rate']:.2f}"
            if searches else f"reward {m['reward_mean']:.3f} valid {m['valid_action_rate']:.2f} "
            f"docs {m['selected_docs_per_episode']:.2f} answer F1 {m['answer_f1']:.3f}")
    skipped = f" skipped {metrics['actor/skipped_groups']:.0f}" if "actor/skipped_groups" in metrics else ""
    return (f"{head} | rollout {t['rollout']:.0f}s prep {t['prepare']:.0f}s update {t['update']:.0f}s{skipped} "
            f"sync {t['sync']:.0f}s" + async_summary(metrics))


def recipe_searches(cfg: Any) -> bool:
    """Whether the training recipe's episodes can search after the prompt (any stage's `max_turns` > 0)."""
    from recipes import get_recipe

    return any(getattr(get_recipe(cfg.train.recipe, **cfg.recipe_config(o)).config, "max_turns", 1) > 0
               for o in cfg.train.option_sets())


def async_summary(metrics: dict[str, float]) -> str:
    """The asynchronous modes' part of `step_summary` ("" in off mode): the staleness, the groups
    generated again, the partial episodes and each side's idle seconds."""
    if "async/staleness_max" not in metrics:
        return ""
    m = {k: metrics.get(f"async/{k}", 0.0) for k in ("staleness_max", "requeued", "partial_episodes",
                                                       "learner_idle_s", "rollout_idle_s")}
    return (f" | stale {m['staleness_max']:.0f} requeued {m['requeued']:.0f} partial {m['partial_episodes']:.0f} "
            f"idle learner {m['learner_idle_s']:.0f}s rollout {m['rollout_idle_s']:.0f}s")


FAULT_KEYS = ("rollout_worker_deaths", "rollout_worker_restarts", "rollout_parts_rerun", "rollout_stale_parts",
              "shard_retries", "search_retries", "scoring_retries", "learner_restarts", "steps_redone")


def fault_metrics(counts: Mapping[str, int]) -> dict[str, float]:
    """Failures and recoveries under `faults/...` keys, every key of FAULT_KEYS present (0 when
    nothing failed, so the curves are continuous): rollout worker deaths a call saw, the parts re-run, parts
    re-run because a restarted worker sampled with old weights, learner rebuilds and the steps they
    redid (counted by the driver), shard calls the pool retried through a shard restart, search and frozen-LLM
    scoring retries, and rollout worker processes Ray started again, whatever the cause, including deaths between
    calls that no call saw (counted by the workers)."""
    return {f"faults/{k}": float(counts.get(k, 0)) for k in FAULT_KEYS}
