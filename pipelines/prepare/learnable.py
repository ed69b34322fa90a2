"""Learnable questions: the training questions the policy sometimes answers right, not always (the untrained
policy, or the warm-started one when the run has a warm start: the selection runs before the first step).

GRPO learns only from a question whose samples score differently: a group of equal rewards has zero
advantage everywhere. R1-Searcher §2.1 picks its training questions by the rollouts a policy needs to
answer them (`pipelines/prepare/r1_difficulty.py` runs that at the paper's scale: up to 20+ rollouts
per question with Qwen-2.5-7B-Instruct). This is the same idea sized for one run of the main job: the
policy being trained, with its own prompt, recipe options and retriever, samples `samples` episodes of
each of `questions` training questions once, and the run keeps the questions whose samples' answer F1
differ (some sample is at least partly right and some is not: `is_learnable`).

The result is cached as JSON beside the index (`<index.dir>.learnable/<fingerprint>.json`) and
rebuilt when what it depends on changes (`selection_settings`: the policy model, the recipe and its
options, the sampling and token limits, the candidate questions, the index and the warm start). The run's seed is
not part of it: seeds of one config train on the same questions.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.prepare.common import index_identity, settings_fingerprint, write_json

log = logging.getLogger(__name__)

SAMPLE_SEED = 0
"""Seed of the spread sample of candidate questions (fixed: seeds of one config share the selection)."""


def answer_scores(trajs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per question (GRPO group id): the samples' answer F1 and cover-EM, in sample order.

    Args:
        trajs: trajectory dicts (`Trajectory.to_json`) with `group_id`, `sample_index`, `final.answer`
            and `golden_answers`; no answer scores 0.
    Returns:
        group id → {"f1": [float, ...], "cover_em": [float, ...]} (one value per sample, in [0, 1]).
    """
    from recipes.metrics import cover_exact_match, f1_score

    out: dict[str, dict[str, list[float]]] = {}
    for t in sorted(trajs, key=lambda t: (t["group_id"], t["sample_index"])):
        answer = (t.get("final") or {}).get("answer")
        golds = list(t["golden_answers"])
        scores = out.setdefault(t["group_id"], {"f1": [], "cover_em": []})
        scores["f1"].append(f1_score(answer, golds) if answer is not None else 0.0)
        scores["cover_em"].append(cover_exact_match(answer, golds) if answer is not None else 0.0)
    return out


def is_learnable(f1s: Sequence[float]) -> bool:
    """Whether the samples' answer F1 differ (values rounded to 1e-6): then some sample is partly right
    and some is not, and GRPO's group-relative advantage is non-zero. Fewer than 2 samples: False."""
    return len({round(float(x), 6) for x in f1s}) > 1


def selection_settings(cfg: Any, recipe_options: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                       samples: int) -> dict[str, Any]:
    """What a cached selection depends on (its file name is a hash of this): the policy model, the
    recipe and its options, sampling and token limits, the frozen generator and judge (for s3 the
    generator's answer F1 decides which questions are kept), the candidate question ids, the index and,
    when the run has one, the warm start (`train.warm_start`: the selection samples the warm-started policy).

    Raises:
        IndexFormatError: no finished index at `cfg.index.dir`.
    """
    ro = cfg.rollout
    settings = {
        "model": cfg.learner.model, "backend": ro.backend, "chat": ro.chat, "recipe": cfg.train.recipe,
        "recipe_options": dict(recipe_options), "topk": cfg.retrieval.topk, "temperature": ro.temperature,
        "top_p": ro.top_p, "samples": samples, "limits": [ro.max_new_tokens_per_turn, ro.max_observation_tokens,
                                                           ro.max_total_tokens],
        "questions": [f"{q.get('dataset', '')}/{q['id']}" for q in candidates], "index": index_identity(cfg),
        "frozen": {k: getattr(cfg.frozen, k) for k in ("model", "judge_model", "backend", "max_model_len",
                                                       "max_answer_tokens")},
    }
    warm = getattr(cfg.train, "warm_start", None)
    if warm is not None:  # the selection runs after the warm start: the warm-started policy's samples decide it
        settings["warm_start"] = warm.model_dump(mode="json")
    return settings


def cache_path(index_dir: str | Path, fingerprint: str) -> Path:
    """`<index_dir>.learnable/<fingerprint>.json`: beside the index, outside its checksummed folder."""
    index_dir = Path(index_dir)
    return index_dir.parent / f"{index_dir.name}.learnable" / f"{fingerprint}.json"


def select_learnable(
    cfg: Any,
    pool: Sequence[Mapping[str, Any]],
    recipe_options: Mapping[str, Any],
    rollout: Callable[[Sequence[Mapping[str, Any]], int], list[dict]],
    report_to: str | Path | None = None,
) -> tuple[list[dict], dict[str, Any]]:
    """The questions of `pool` to train on, and the selection's report.

    Samples `cfg.train.select_questions` candidates spread over the datasets (seeded), rolls each out
    `cfg.train.select_samples` times with `rollout(examples, n)` (the untrained policy at the training
    temperature) unless a cached selection with the same settings exists, and keeps the learnable
    ones (`is_learnable`), in candidate order.

    Args:
        cfg: the run's config.
        pool: the training questions (dicts with id, question, golden_answers, dataset).
        recipe_options: the recipe options the policy trains with.
        rollout: `rollout(examples, n)` → trajectory dicts, `n` samples of each example.
        report_to: a JSON file to write the report and the kept ids to (the run's
            `learnable_questions.json`, read by `scripts.main`'s summary); None = none.
    Returns:
        (kept questions, report {"candidates", "kept", "share_kept", "share_cover_em_hit", "mean_f1",
        "seconds", "cached", "path"}).
    Raises:
        ValueError: the selection kept no question (nothing GRPO could learn from; the message says
            what to change).
    """
    from pipelines.data import spread_sample

    n_candidates, samples = cfg.train.select_questions, cfg.train.select_samples
    candidates = spread_sample(list(pool), n_candidates, SAMPLE_SEED)
    settings = selection_settings(cfg, recipe_options, candidates, samples)
    path = cache_path(cfg.index.dir, settings_fingerprint(settings))
    cached = path.is_file()
    t = time.perf_counter()
    if cached:
        scores = json.loads(path.read_text())["scores"]
    else:
        trajs = rollout(candidates, samples)
        scores = answer_scores(trajs)
    seconds = time.perf_counter() - t
    group = {f"{q.get('dataset', '')}/{q['id']}" if q.get("dataset") else str(q["id"]): q for q in candidates}
    kept = [group[g] for g in group if g in scores and is_learnable(scores[g]["f1"])]
    report = {
        "candidates": len(candidates), "samples": samples, "kept": len(kept),
        "share_kept": len(kept) / max(1, len(candidates)),
        "share_cover_em_hit": sum(any(s["cover_em"]) for s in scores.values()) / max(1, len(scores)),
        "mean_f1": sum(sum(s["f1"]) for s in scores.values()) / max(1, sum(len(s["f1"]) for s in scores.values())),
        "seconds": seconds, "cached": cached, "path": str(path),
    }
    if not cached:
        write_json(path, {"settings": settings, "scores": scores, "report": report})
    if report_to is not None:
        Path(report_to).write_text(json.dumps({**report, "ids": [q["id"] for q in kept]}, indent=1))
    if not kept:
        raise ValueError(f"train.select_questions: none of {len(candidates)} training questions had samples whose "
                         f"answer F1 differ; raise train.select_questions or train.select_samples, or set "
                         f"train.select_questions=0 to train on all questions")
    log.info("learnable questions: kept %d of %d (%.0f%%; %s, %.0f s)", len(kept), len(candidates),
             100 * report["share_kept"], "cached" if cached else f"{samples} samples each", seconds)
    return kept, report
