"""The ``s3`` job: the naive-RAG GenAcc baseline and the s3 training-set filter (s3 §3.2 / §4.1).

For every question, the naive-RAG baseline of Eq. 1, Acc(G(Q, D_RAG), A): the top-k documents for
the question itself (``retrieval.topk``) from the RetrievalPool over ``cfg.index.dir``, the frozen
generator's answer with the s3 Fig. 12 prompt, GenAcc = span_check ∨ judge_check (FrozenLLMWorker
actors). Yes/no and true/false questions are dropped first (no generator call); questions naive
RAG already answers (GenAcc 1) are dropped next. The kept rows get a top-level ``rag_gen_acc``
field: ``pipelines.data.iter_qa`` puts it into ``QAExample.meta`` and the agent loop hands that to
``Recipe.start(meta=)``, so the s3 recipe never recomputes the baseline in training. Every
computed baseline is appended to a cache (JSONL: question id → RAG answer, GenAcc), so a rerun
skips the questions already done.

Public names: ``S3_YES_NO``, ``S3_ANSWERED``, ``S3_KEPT``, ``s3_filter_decision``,
``s3_filter_rows`` (pure, no Ray), ``s3_settings``, ``prepare_s3`` (the driver).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from pipelines.prepare.common import (
    PrepareError,
    Progress,
    ResultCache,
    actor_session,
    check_writable,
    index_identity,
    read_qa_rows,
    recipe_config,
    retrieval_pool,
    row_dataset,
    settings_fingerprint,
    stem,
    write_json,
    write_jsonl_gz,
)

log = logging.getLogger(__name__)

S3_YES_NO = "yes_no"
S3_ANSWERED = "answered"
S3_KEPT = "kept"

# Engines load models (possibly downloading them): allow more than ActorSet's default.
_ENGINE_READY_TIMEOUT_S = 1800.0


def s3_filter_decision(golden_answers: Sequence[str], rag_gen_acc: float | None) -> str:
    """The s3 §4.1 training-set decision for one question.

    Returns ``"yes_no"`` (a yes/no or true/false question: span_check accepts "not true" for
    "true", so s3 drops them; needs no baseline), ``"answered"`` (naive RAG already answers it:
    GenAcc 1, no room for Gain Beyond RAG) or ``"kept"`` (GenAcc 0).

    Raises:
        ValueError: a non-yes/no question without its baseline (``rag_gen_acc`` None).
    """
    from recipes.s3 import is_yes_no

    if is_yes_no(golden_answers):
        return S3_YES_NO
    if rag_gen_acc is None:
        raise ValueError("rag_gen_acc is needed for a question that is not yes/no")
    return S3_ANSWERED if rag_gen_acc >= 1.0 else S3_KEPT


def s3_filter_rows(
    rows: Sequence[Mapping[str, Any]],
    rag_gen_acc: Mapping[str, float],
    keep_answered: float = 0.0,
    seed: int = 0,
) -> tuple[list[dict], dict]:
    """Apply :func:`s3_filter_decision` to QA rows (s3 §4.1).

    Args:
        rows: QA rows (``id``, ``golden_answers``, ...), in order.
        rag_gen_acc: id → naive-RAG GenAcc for every row that is not yes/no.
        keep_answered: share in [0, 1] of the questions naive RAG already answers to keep anyway
            (a seeded sample of ``round(share * answered)``; 0 = the paper's filter). Under Eq. 1
            with GenAcc such a question earns 0 when the searcher's context still answers it and
            −1 when it loses the answer, so leaving RAG's context costs (s3 itself keeps none).
        seed: the sample's seed.

    Returns:
        (kept rows in input order, each a copy with ``rag_gen_acc`` added; counts ``{"in",
        "yes_no_dropped", "answered_dropped", "answered_kept", "out", "by_dataset": {dataset:
        {...}}}``; ``out`` counts every kept row, answered ones included).

    Raises:
        ValueError: ``keep_answered`` outside [0, 1]; a non-yes/no row without its baseline.
    """
    if not 0.0 <= keep_answered <= 1.0:
        raise ValueError(f"keep_answered must be a share in [0, 1], got {keep_answered}")
    decisions = [s3_filter_decision(r["golden_answers"], rag_gen_acc.get(str(r["id"]))) for r in rows]
    answered = [i for i, d in enumerate(decisions) if d == S3_ANSWERED]
    rescued = set(random.Random(seed).sample(answered, round(keep_answered * len(answered))))
    kept: list[dict] = []
    counts = {"in": 0, "yes_no_dropped": 0, "answered_dropped": 0, "answered_kept": 0, "out": 0}
    by_ds: dict[str, Counter] = defaultdict(Counter)
    names = {S3_YES_NO: "yes_no_dropped", S3_ANSWERED: "answered_dropped", S3_KEPT: "out"}
    for i, (row, decision) in enumerate(zip(rows, decisions)):
        ds = by_ds[row_dataset(row)]
        what = ["answered_kept", "out"] if i in rescued else [names[decision]]
        for name in ["in", *what]:
            counts[name] += 1
            ds[name] += 1
        if decision == S3_KEPT or i in rescued:
            kept.append({**row, "rag_gen_acc": float(rag_gen_acc[str(row["id"])])})
    counts["by_dataset"] = {k: dict(v) for k, v in sorted(by_ds.items())}
    return kept, counts


def s3_settings(cfg, recipe_config, chat: bool | None) -> dict[str, Any]:
    """What a cached naive-RAG baseline depends on (its cache fingerprint is a hash of this).

    Raises:
        IndexFormatError: no finished index at ``cfg.index.dir``.
    """
    from recipes.base import ANSWER_PROMPT
    from recipes.metrics import JUDGE_PROMPT

    fz = cfg.frozen
    return {
        "generator": fz.model, "judge": fz.judge_model or fz.model, "backend": fz.backend,
        "max_answer_tokens": fz.max_answer_tokens, "chat": chat, "topk": recipe_config.topk,
        "doc_template": recipe_config.doc_template, "use_judge": recipe_config.use_judge,
        "answer_prompt": ANSWER_PROMPT, "judge_prompt": JUDGE_PROMPT, "index": index_identity(cfg),
        # 2: the judge is frozen.judge_model whatever reward_metric (1's F1 configs asked the generator)
        "judge_rule": 2,
    }


class _CapturingScorer:
    """A Scorer wrapper that remembers the generator's answer (for the cache)."""

    def __init__(self, inner):
        self.inner = inner
        self.answer: str | None = None

    def generate_answer(self, question: str, context: str, template: str | None = None) -> str:
        from recipes.base import ANSWER_PROMPT

        self.answer = self.inner.generate_answer(question, context, template or ANSWER_PROMPT)
        return self.answer

    def judge(self, response: str, golden_answers: Sequence[str]) -> bool:
        return self.inner.judge(response, golden_answers)


def prepare_s3(
    cfg,
    input_path: str | Path,
    out_path: str | Path,
    *,
    cache_path: str | Path | None = None,
    report_path: str | Path | None = None,
    limit: int | None = None,
    sample_seed: int | None = None,
    keep_answered: float = 0.0,
    seed: int = 0,
    concurrency: int = 16,
    chat: bool | None = None,
    pool: Any = None,
    generator: Any = None,
    judge: Any = None,
    progress: Progress = log.info,
) -> dict[str, Any]:
    """Build the s3 training set from ``input_path`` (s3 §4.1; see the module docstring).

    Args:
        cfg: ``configs.Config``: ``index.dir`` and ``retrieval`` (pool; ``retrieval.topk`` is the
            baseline's k), ``frozen`` (generator / judge), ``train.recipe_options`` when
            ``train.recipe`` is "s3" (use_judge, doc_template).
        input_path: QA file (pack format or FlashRAG QA).
        out_path: the filtered QA file (``.jsonl.gz``); rows keep their fields, plus ``rag_gen_acc``.
        cache_path: baseline cache (default ``<out>.cache.jsonl``). report_path: default
            ``<out>.report.json``.
        limit: first N questions only; with ``sample_seed``, a seeded sample of N spread over the
            datasets (``read_qa_rows``). concurrency: questions in flight at once.
        keep_answered, seed: keep this share of the questions naive RAG answers, a sample seeded
            by ``seed`` (``s3_filter_rows``; 0 = the paper's filter).
        chat: frozen LLM prompt mode (None = when its tokenizer has a chat template).
        pool, generator, judge: running RetrievalPool / FrozenLLMWorker actors to use; None = start
            them from ``cfg`` when needed (never when every baseline is cached) and stop them at the
            end. ``judge`` defaults to the generator (or a second actor if ``frozen.judge_model``
            differs and the recipe config uses the judge). Actors run on the Ray cluster already
            initialised in this process, else on ``cfg.ray``'s (started here and shut down at the end).
        progress: progress lines (default: this module's logger).

    Returns:
        The report (also written to ``report_path``): ``counts`` (in, yes_no_dropped,
        answered_dropped, out, by_dataset), ``baseline`` (computed, cached, stale cache entries),
        ``rag_gen_acc_mean``, paths, settings, ``seconds``.

    Raises (all before any actor starts): ConfigError (bad recipe option), IndexFormatError (no
    index), BadRowError (malformed input row), PrepareError (bad argument / unwritable output),
    FileNotFoundError (no input).
    """
    from recipes.s3 import is_yes_no

    t0 = time.perf_counter()
    if concurrency < 1:
        raise PrepareError(f"concurrency must be >= 1, got {concurrency}")
    if not 0.0 <= keep_answered <= 1.0:
        raise PrepareError(f"keep_answered (--keep-answered) must be a share in [0, 1], got {keep_answered}")
    out_path = Path(out_path)
    if not out_path.name.endswith(".jsonl.gz"):
        raise PrepareError(f"output {out_path}: name it *.jsonl.gz (the data pack's QA format)")
    base = stem(out_path)
    cache_path = Path(cache_path) if cache_path else base.with_name(base.name + ".cache.jsonl")
    report_path = Path(report_path) if report_path else base.with_name(base.name + ".report.json")
    rcfg = recipe_config(cfg, "s3")
    settings = s3_settings(cfg, rcfg, chat)
    for p, what in ((out_path, "output"), (cache_path, "cache"), (report_path, "report")):
        check_writable(p, what)
    rows = read_qa_rows(input_path, limit, sample_seed=sample_seed)
    cache = ResultCache(cache_path, settings_fingerprint(settings))
    questions = {r["id"]: r["question"].strip() for r in rows}
    cached = cache.load(questions)
    need = [r for r in rows if not is_yes_no(r["golden_answers"])]
    pending = [r for r in need if r["id"] not in cached]
    progress(f"s3: {len(rows)} questions, {len(rows) - len(need)} yes/no, {len(need) - len(pending)} baselines cached, "
             f"{len(pending)} to compute")

    results: dict[str, float] = {qid: float(cached[qid]["gen_acc"]) for qid in questions if qid in cached}
    if pending:
        from actors.frozen.scorer import ActorScorer

        with actor_session(cfg) as actors:
            pool = retrieval_pool(actors, cfg, pool)
            if generator is None:
                generator, started_judge = _start_frozen_llms(actors, cfg, rcfg, chat)
                judge = started_judge if judge is None else judge
            scorer = ActorScorer(generator, generator if judge is None else judge)
            _s3_compute(pending, pool, scorer, rcfg, cache, results, concurrency, progress)

    kept, counts = s3_filter_rows(rows, results, keep_answered, seed)
    write_jsonl_gz(out_path, kept)
    accs = [results[r["id"]] for r in need]
    report = {
        "job": "s3",
        "input": str(input_path), "output": str(out_path), "cache": str(cache_path),
        "counts": counts,
        "baseline": {"computed": len(pending), "cached": len(need) - len(pending), "stale_cache_entries": cache.stale},
        "rag_gen_acc_mean": sum(accs) / len(accs) if accs else None,
        "settings": settings, "settings_fingerprint": cache.fingerprint,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    write_json(report_path, report)
    progress(f"s3: kept {counts['out']} of {counts['in']} (yes/no {counts['yes_no_dropped']}, already answered by "
             f"naive RAG {counts['answered_dropped']} dropped, {counts['answered_kept']} kept) -> {out_path}")
    return report


def needs_judge_actor(frozen, recipe_config) -> bool:
    """True when the filter's GenAcc needs a judge actor of its own: the recipe uses the judge
    (``use_judge``) and ``frozen.judge_model`` differs from ``frozen.model``.

    The filter's baseline is GenAcc (s3 §4.1, Eq. 3) whatever ``reward_metric`` the training uses, so
    this does not ask the recipe's ``frozen_roles()`` (no judge under an F1 reward): before, an F1 config
    had the generator answer the judge prompt while the cache recorded ``frozen.judge_model``."""
    return bool(recipe_config.use_judge and frozen.judge_model and frozen.judge_model != frozen.model)


def _start_frozen_llms(actors, cfg, rcfg, chat: bool | None) -> tuple[Any, Any]:
    """Start the generator and, when the s3 recipe uses a judge (``use_judge``) and
    ``frozen.judge_model`` differs from ``frozen.model``, a judge; wait until their engines are up.
    Returns (generator, judge), the judge being the generator unless a second actor started."""
    from actors.frozen.worker import start_frozen_llm

    gen = start_frozen_llm(actors, cfg, "generator", chat=chat)
    judge = start_frozen_llm(actors, cfg, "judge", chat=chat) if needs_judge_actor(cfg.frozen, rcfg) else gen
    actors.wait_ready({id(gen): gen, id(judge): judge}.values(), timeout_s=_ENGINE_READY_TIMEOUT_S,
                      what="frozen generator / judge")
    return gen, judge


def _s3_compute(pending, pool, scorer, rcfg, cache, results, concurrency, progress) -> None:
    """Baselines of ``pending`` rows: one pool search per chunk, then generator / judge calls in
    ``concurrency`` threads; each result is appended to the cache as soon as it is known."""
    import ray

    from recipes.base import as_docs
    from recipes.s3 import naive_rag_gen_acc

    chunk = max(64, 4 * concurrency)
    done = 0

    def one(row, hits):
        capture = _CapturingScorer(scorer)
        docs = as_docs(hits)
        acc = naive_rag_gen_acc(row["question"].strip(), docs, row["golden_answers"], capture, rcfg.use_judge,
                                rcfg.doc_template)
        return row, acc, capture.answer, [d.doc_id for d in docs]

    with ThreadPoolExecutor(max_workers=concurrency) as pool_threads:
        for start in range(0, len(pending), chunk):
            part = pending[start : start + chunk]
            # The agent loop searches the question as given (its prompt strips it): do the same.
            hits = ray.get(pool.search.remote([r["question"] for r in part], rcfg.topk))
            futures = [pool_threads.submit(one, r, h) for r, h in zip(part, hits)]
            for fut in as_completed(futures):
                row, acc, answer, doc_ids = fut.result()
                results[row["id"]] = float(acc)
                cache.append({"id": row["id"], "question": row["question"].strip(), "rag_answer": answer,
                              "gen_acc": float(acc), "doc_ids": doc_ids})
                done += 1
            progress(f"s3: {done}/{len(pending)} baselines computed")
