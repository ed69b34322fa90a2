"""Training-set preparation: the s3 naive-RAG filter, R1-Searcher difficulty selection, FlashRAG import.

Three jobs (CLI: ``python -m scripts.prepare_data {s3,r1_difficulty,import_flashrag}``):

``s3`` (s3 §3.2 / §4.1)
    For every question, the naive-RAG baseline of Eq. 1, Acc(G(Q, D_RAG), A): the top-k documents
    for the question itself from the RetrievalPool over ``cfg.index.dir``, the frozen generator's
    answer with the s3 Fig. 12 prompt, GenAcc = span_check ∨ judge_check (FrozenLLMWorker actors).
    Yes/no and true/false questions are dropped first (no generator call); questions naive RAG
    already answers (GenAcc 1) are dropped next. The kept rows get a ``rag_gen_acc`` field, so the
    s3 recipe never recomputes the baseline in training. Every computed baseline is appended to a
    cache (JSONL: question id → RAG answer, GenAcc), so a rerun skips the questions already done.

``r1_difficulty`` (R1-Searcher §2.1, Table 1)
    The paper buckets questions by "the number of rollouts required to correctly answer" them:
    easy (fewer than 10), medium (10 to 20), difficult (more than 20). Here a reference policy
    (the configured policy model, ``r1_searcher`` recipe, stage 2) runs rounds of ``n`` rollouts per
    question on RolloutWorker actors; a question stops at the first round with a correct answer
    (cover-EM by default, the paper's rule-based ACC_R) and ``rollouts_to_correct`` is the 1-based
    index of its first correct rollout; after ``max_rollouts`` (> 20) without one it is hard. The
    buckets are then mixed per Table 1, scaled to a requested total per stage.

``import_flashrag``
    FlashRAG QA files (``{id, question, golden_answers, metadata?}``) and corpora (``{id,
    contents}`` with ``contents = "Title"\\ntext``, or ``{id, title, text}``) → the data pack's
    gzip JSONL formats.

Fields added to QA rows are top-level row fields (``rag_gen_acc``; ``difficulty``,
``correct_of_n``, ``rollouts``, ``rollouts_to_correct``): ``pipelines.data.iter_qa`` puts every
extra field into ``QAExample.meta``, and the agent loop hands that dict to ``Recipe.start(meta=)``,
so the s3 recipe finds ``episode.meta["rag_gen_acc"]``.

The pure parts (filter decisions, bucketing, Table-1 scaling and mixing, row conversion, cache)
are plain functions without Ray; the drivers ``prepare_s3`` and ``prepare_r1_difficulty`` check
the config before any actor starts, and accept already-started actor handles (tests, notebooks).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from pipelines.data import (
    BadRowError,
    _get_id,
    _get_str,
    _golden_answers,
    iter_records,
    split_contents,
)

Progress = Callable[[str], None]

_QA_FORM = "expected {id, question, golden_answers: [str, ...]}"
_FLASHRAG_CORPUS_FORM = "expected FlashRAG {id, contents} or {id, title, text}"


class PrepareError(ValueError):
    """A preparation argument or input is unusable; the message names it and the fix."""


def _quiet(_: str) -> None:
    pass


# ============================================================================ rows and files


def row_dataset(row: Mapping[str, Any]) -> str:
    """The dataset of a QA row: ``source`` (data pack), else ``dataset`` (FlashRAG), else "unknown"."""
    return str(row.get("source") or row.get("dataset") or "unknown")


def read_qa_rows(path: str | Path, limit: int | None = None) -> list[dict]:
    """Read QA rows keeping every field (ids as str, golden_answers as a list).

    Checks each row as ``pipelines.data.iter_qa`` does (id, non-empty question, non-empty list of
    string answers) and that ids are unique (caches are keyed by id).

    Raises:
        BadRowError: a malformed row or a duplicate id (file and line).
        FileNotFoundError: no such file. ValueError: unsupported suffix.
    """
    path = Path(path)
    rows: list[dict] = []
    seen: dict[str, int] = {}
    for line, rec in iter_records(path):
        if limit is not None and len(rows) >= limit:
            break
        qid = _get_id(rec, path, line, _QA_FORM)
        _get_str(rec, "question", path, line, _QA_FORM, nonempty=True)
        answers = _golden_answers(rec, path, line)
        if qid in seen:
            raise BadRowError(path, line, f"duplicate id {qid!r} (first on line {seen[qid]}); ids must be unique")
        seen[qid] = line
        rows.append({**rec, "id": qid, "golden_answers": list(answers)})
    return rows


def write_jsonl_gz(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write rows as gzip JSONL atomically (temporary file, then rename); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def write_json(path: str | Path, obj: Any) -> None:
    """Write a JSON report (indented) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _stem(path: Path) -> Path:
    """``dir/name`` of ``dir/name.jsonl.gz`` (or ``.jsonl`` / any single suffix)."""
    name = path.name
    for suffix in (".jsonl.gz", ".jsonl", ".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)])
    return path


def _check_writable(path: Path, what: str) -> None:
    """Fail early (before any actor starts) when ``path``'s folder cannot be created or written."""
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PrepareError(f"{what} {path}: cannot create folder {parent} ({e}); choose another path") from e
    if not os.access(parent, os.W_OK):
        raise PrepareError(f"{what} {path}: folder {parent} is not writable; choose another path")


# ============================================================================ result cache


def settings_fingerprint(settings: Mapping[str, Any]) -> str:
    """A short stable hash of the settings a cached result depends on (model, prompt, top-k, ...)."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:16]


class ResultCache:
    """Append-only JSONL cache of per-question results: ``{"id", "question", "settings", ...}``.

    An entry counts only if its ``settings`` fingerprint and question text match the current run
    (a changed model, prompt or index recomputes). Lines are appended and flushed one at a time
    (thread-safe), so an interrupted run keeps everything finished; a torn last line (crash while
    writing) is ignored, a malformed line elsewhere raises ``BadRowError``.
    """

    def __init__(self, path: str | Path, fingerprint: str):
        self.path = Path(path)
        self.fingerprint = fingerprint
        self._lock = threading.Lock()
        self.stale = 0  # entries ignored by the last load (other settings or question text)

    def load(self, questions: Mapping[str, str] | None = None) -> dict[str, dict]:
        """Valid entries by id (the last one wins). ``questions``: id → question text to match."""
        out: dict[str, dict] = {}
        self.stale = 0
        if not self.path.is_file():
            return out
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for i, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                if not isinstance(entry, dict) or "id" not in entry:
                    raise ValueError("not an object with an id")
            except ValueError as e:
                if i == len(lines):  # torn last line of an interrupted run
                    continue
                raise BadRowError(self.path, i, f"unreadable cache entry ({e}); delete the cache file to recompute") from None
            qid = str(entry["id"])
            fresh = entry.get("settings") == self.fingerprint
            if fresh and questions is not None and qid in questions:
                fresh = entry.get("question") == questions[qid]
            if fresh:
                out[qid] = entry
            else:
                self.stale += 1
        return out

    def append(self, entry: Mapping[str, Any]) -> None:
        """Add one entry (``settings`` is set to this cache's fingerprint)."""
        line = json.dumps({**entry, "settings": self.fingerprint}, ensure_ascii=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            needs_newline = self.path.is_file() and self.path.stat().st_size > 0 and not self._ends_with_newline()
            with open(self.path, "a", encoding="utf-8") as f:
                if needs_newline:  # after a torn last line, start a fresh one
                    f.write("\n")
                f.write(line)
                f.flush()

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"


# ============================================================================ engine specs / actors


def frozen_engine_spec(cfg, model: str) -> dict[str, Any]:
    """``make_engine`` kwargs of a frozen generator / judge from ``cfg.frozen`` (vLLM-only options
    are passed to vLLM only)."""
    fz = cfg.frozen
    spec: dict[str, Any] = {"backend": fz.backend, "model": model, "max_model_len": fz.max_model_len}
    if fz.backend == "vllm":
        spec["gpu_memory_utilization"] = fz.gpu_memory_utilization
        if fz.cpu_kv_cache_gib is not None:
            spec["cpu_kv_cache_gib"] = fz.cpu_kv_cache_gib
    return spec


def policy_engine_spec(cfg, model: str) -> dict[str, Any]:
    """``make_engine`` kwargs of the policy (reference model) from ``cfg.rollout`` and ``cfg.seed``."""
    ro = cfg.rollout
    spec: dict[str, Any] = {"backend": ro.backend, "model": model, "max_model_len": ro.max_model_len, "seed": cfg.seed}
    if ro.backend == "vllm":
        spec["gpu_memory_utilization"] = ro.gpu_memory_utilization
        spec["tensor_parallel_size"] = ro.tensor_parallel_size
        if ro.cpu_kv_cache_gib is not None:
            spec["cpu_kv_cache_gib"] = ro.cpu_kv_cache_gib
    return spec


def _recipe_options(cfg, recipe: str) -> dict[str, Any]:
    """``train.recipe_options`` when the configured recipe is ``recipe``, else {}."""
    return dict(cfg.train.recipe_options) if cfg.train.recipe == recipe else {}


def _recipe_config(cfg, recipe: str, **forced: Any):
    """The recipe's validated config (``train.recipe_options`` + ``forced``); a bad option raises
    ``ConfigError`` naming ``train.recipe_options.<field>``."""
    from pydantic import ValidationError

    from configs import ConfigError
    from recipes import RECIPES

    options = {**_recipe_options(cfg, recipe), **forced}
    try:
        return RECIPES[recipe].config_cls(**options)
    except ValidationError as e:
        problems = [f"train.recipe_options.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ConfigError(problems, f"recipe {recipe!r} options") from None


def _check_topk(cfg, topk: int) -> None:
    from configs import ConfigError

    if topk > cfg.retrieval.max_topk:
        raise ConfigError(f"train.recipe_options.topk: {topk} exceeds retrieval.max_topk ({cfg.retrieval.max_topk}); "
                          "lower the one or raise the other", "prepare_data")


def _index_identity(cfg) -> dict[str, Any]:
    """Which index a cached result came from; raises ``IndexFormatError`` if there is none."""
    from actors.index_store import Manifest

    manifest = Manifest.load(cfg.index.dir)
    return {"dir": str(Path(cfg.index.dir).resolve()), "num_docs": manifest.num_docs, "type": manifest.index_type,
            "encoder": (manifest.encoder or {}).get("model")}


def _ensure_ray(cfg) -> bool:
    """Start or join the configured Ray cluster unless one is up; True when this call started it."""
    import ray

    if ray.is_initialized():
        return False
    from cluster.ray_init import init_ray

    return init_ray(cfg.ray)


def _shutdown(handles: Sequence[Any], progress: Progress, engines: Sequence[Any] = ()) -> None:
    """Free the engines of the actors in ``engines`` (vLLM leaves /dev/shm segments otherwise),
    then kill every actor in ``handles``."""
    import ray

    for h in engines:
        try:
            ray.get(h.shutdown.remote(), timeout=120)
        except Exception as e:  # noqa: BLE001 - report and keep shutting down
            progress(f"warning: engine shutdown failed: {e}")
    for h in handles:
        try:
            ray.kill(h)
        except Exception:  # noqa: BLE001
            pass


# ============================================================================ s3


S3_YES_NO = "yes_no"
S3_ANSWERED = "answered"
S3_KEPT = "kept"


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


def s3_filter_rows(rows: Sequence[Mapping[str, Any]], rag_gen_acc: Mapping[str, float]) -> tuple[list[dict], dict]:
    """Apply :func:`s3_filter_decision` to QA rows.

    Args:
        rows: QA rows (``id``, ``golden_answers``, ...), in order.
        rag_gen_acc: id → naive-RAG GenAcc for every row that is not yes/no.

    Returns:
        (kept rows in input order, each a copy with ``rag_gen_acc`` added; counts ``{"in",
        "yes_no_dropped", "answered_dropped", "out", "by_dataset": {dataset: {...}}}``).
    """
    kept: list[dict] = []
    counts = {"in": 0, "yes_no_dropped": 0, "answered_dropped": 0, "out": 0}
    by_ds: dict[str, Counter] = defaultdict(Counter)
    names = {S3_YES_NO: "yes_no_dropped", S3_ANSWERED: "answered_dropped", S3_KEPT: "out"}
    for row in rows:
        decision = s3_filter_decision(row["golden_answers"], rag_gen_acc.get(str(row["id"])))
        counts["in"] += 1
        counts[names[decision]] += 1
        ds = by_ds[row_dataset(row)]
        ds["in"] += 1
        ds[names[decision]] += 1
        if decision == S3_KEPT:
            kept.append({**row, "rag_gen_acc": float(rag_gen_acc[str(row["id"])])})
    counts["by_dataset"] = {k: dict(v) for k, v in sorted(by_ds.items())}
    return kept, counts


def s3_settings(cfg, recipe_config, chat: bool | None) -> dict[str, Any]:
    """What a cached naive-RAG baseline depends on (its cache fingerprint is a hash of this)."""
    from recipes.base import ANSWER_PROMPT
    from recipes.metrics import JUDGE_PROMPT

    fz = cfg.frozen
    return {
        "generator": fz.model, "judge": fz.judge_model or fz.model, "backend": fz.backend,
        "max_answer_tokens": fz.max_answer_tokens, "chat": chat, "topk": recipe_config.topk,
        "doc_template": recipe_config.doc_template, "use_judge": recipe_config.use_judge,
        "answer_prompt": ANSWER_PROMPT, "judge_prompt": JUDGE_PROMPT, "index": _index_identity(cfg),
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
    concurrency: int = 16,
    chat: bool | None = None,
    pool: Any = None,
    generator: Any = None,
    judge: Any = None,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Build the s3 training set from ``input_path`` (see the module docstring).

    Args:
        cfg: ``configs.Config``: ``index.dir`` and ``retrieval`` (pool), ``frozen`` (generator /
            judge), ``train.recipe_options`` when ``train.recipe`` is "s3" (topk, use_judge,
            doc_template).
        input_path: QA file (pack format or FlashRAG QA).
        out_path: the filtered QA file (``.jsonl.gz``); rows keep their fields, plus ``rag_gen_acc``.
        cache_path: baseline cache (default ``<out>.cache.jsonl``). report_path: default
            ``<out>.report.json``.
        limit: first N questions only. concurrency: questions in flight at once.
        chat: frozen LLM prompt mode (None = when its tokenizer has a chat template).
        pool, generator, judge: running RetrievalPool / FrozenLLMWorker actors to use; None = start
            them from ``cfg`` when needed (never when every baseline is cached) and stop them at the
            end. ``judge`` defaults to the generator (or a second actor if ``frozen.judge_model``
            differs). Actors run on the Ray cluster already initialised in this process, else on
            ``cfg.ray``'s (started here and shut down at the end).

    Returns:
        The report (also written to ``report_path``): ``counts`` (in, yes_no_dropped,
        answered_dropped, out, by_dataset), ``baseline`` (computed, cached, stale cache entries),
        ``rag_gen_acc_mean``, paths, settings, ``seconds``.

    Raises (all before any actor starts): ConfigError (bad recipe option), IndexFormatError (no
    index), BadRowError (malformed input row), PrepareError (bad argument / unwritable output),
    FileNotFoundError (no input).
    """
    from recipes.base import as_docs
    from recipes.s3 import is_yes_no, naive_rag_gen_acc

    t0 = time.perf_counter()
    if concurrency < 1:
        raise PrepareError(f"concurrency must be >= 1, got {concurrency}")
    out_path = Path(out_path)
    if not out_path.name.endswith(".jsonl.gz"):
        raise PrepareError(f"output {out_path}: name it *.jsonl.gz (the data pack's QA format)")
    cache_path = Path(cache_path) if cache_path else _stem(out_path).with_name(_stem(out_path).name + ".cache.jsonl")
    report_path = Path(report_path) if report_path else _stem(out_path).with_name(_stem(out_path).name + ".report.json")
    rcfg = _recipe_config(cfg, "s3")
    _check_topk(cfg, rcfg.topk)
    settings = s3_settings(cfg, rcfg, chat)
    for p, what in ((out_path, "output"), (cache_path, "cache"), (report_path, "report")):
        _check_writable(p, what)
    rows = read_qa_rows(input_path, limit)
    cache = ResultCache(cache_path, settings_fingerprint(settings))
    questions = {r["id"]: r["question"].strip() for r in rows}
    cached = cache.load(questions)
    need = [r for r in rows if not is_yes_no(r["golden_answers"])]
    pending = [r for r in need if r["id"] not in cached]
    progress(f"s3: {len(rows)} questions, {len(rows) - len(need)} yes/no, {len(need) - len(pending)} baselines cached, "
             f"{len(pending)} to compute")

    results: dict[str, float] = {qid: float(cached[qid]["gen_acc"]) for qid in questions if qid in cached}
    started: list[Any] = []
    engines: list[Any] = []
    if pending:
        import ray

        from actors.scorer import ActorScorer

        own_ray = _ensure_ray(cfg)
        try:
            if pool is None:
                from actors.retrieval import start_retrieval_pool

                pool = start_retrieval_pool(cfg.index.dir, cfg.retrieval)
                started.append(pool)
            if generator is None:
                generator, judge_h, handles = start_frozen_llms(cfg, chat)
                judge = judge_h if judge is None else judge
                started += handles
                engines += handles
            scorer = ActorScorer(generator, generator if judge is None else judge)
            _s3_compute(pending, pool, scorer, rcfg, cache, results, concurrency, progress,
                        ray, as_docs, naive_rag_gen_acc)
        finally:
            if started:
                _shutdown(started, progress, engines)
            if own_ray:
                ray.shutdown()

    kept, counts = s3_filter_rows(rows, results)
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
             f"naive RAG {counts['answered_dropped']}) -> {out_path}")
    return report


def start_frozen_llms(cfg, chat: bool | None = None) -> tuple[Any, Any, list[Any]]:
    """Start the generator (and, if ``frozen.judge_model`` differs, a judge) FrozenLLMWorker actors
    from ``cfg.frozen`` and wait until their engines are up. Returns (generator, judge, all handles)."""
    import ray

    from actors.rollout import remote_frozen_llm

    fz = cfg.frozen
    cls = remote_frozen_llm(num_cpus=fz.num_cpus, num_gpus=fz.num_gpus)
    gen = cls.remote(frozen_engine_spec(cfg, fz.model), chat=chat, max_answer_tokens=fz.max_answer_tokens)
    handles = [gen]
    judge = gen
    if fz.judge_model and fz.judge_model != fz.model:
        judge = cls.remote(frozen_engine_spec(cfg, fz.judge_model), chat=chat, max_answer_tokens=fz.max_answer_tokens)
        handles.append(judge)
    try:
        ray.get([h.ready.remote() for h in handles])
    except BaseException:
        _shutdown(handles, _quiet, handles)
        raise
    return gen, judge, handles


def _s3_compute(pending, pool, scorer, rcfg, cache, results, concurrency, progress, ray, as_docs, naive_rag_gen_acc):
    """Baselines of ``pending`` rows: one pool search per chunk, then generator / judge calls in
    ``concurrency`` threads; each result is appended to the cache as soon as it is known."""
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


# ============================================================================ R1-Searcher difficulty


R1_TABLE1: dict[int, dict[str, dict[str, int]]] = {
    1: {"hotpotqa": {"medium": 200}, "2wikimultihopqa": {"medium": 150}},
    2: {"hotpotqa": {"medium": 2561, "hard": 2000}, "2wikimultihopqa": {"medium": 1087, "hard": 2500}},
}
"""R1-Searcher Table 1: training questions per stage × dataset × difficulty ("Difficult" = hard)."""

DIFFICULTIES = ("easy", "medium", "hard")
R1_EASY_BELOW = 10
R1_HARD_ABOVE = 20
DATASET_ALIASES = {"hotpotqa": "hotpotqa", "2wikimultihopqa": "2wikimultihopqa", "2wiki": "2wikimultihopqa"}
"""Dataset names of the data pack / FlashRAG → the names of :data:`R1_TABLE1`."""

METRICS = ("cover_em", "em", "f1")


def answer_correct(answer: str | None, golden_answers: Sequence[str], metric: str = "cover_em",
                   f1_threshold: float = 1.0) -> bool:
    """Whether a rollout's final answer is correct.

    ``cover_em`` (default; R1-Searcher's rule-based ACC_R: a normalized gold answer is contained in
    the normalized answer), ``em``, or ``f1`` (token F1, the stage-2 answer reward, ≥
    ``f1_threshold``). No answer is never correct.
    """
    from recipes.metrics import cover_exact_match, exact_match, f1_score

    if answer is None or not str(answer).strip():
        return False
    golds = list(golden_answers)
    if metric == "cover_em":
        return cover_exact_match(answer, golds) > 0
    if metric == "em":
        return exact_match(answer, golds) > 0
    if metric == "f1":
        return f1_score(answer, golds) >= f1_threshold
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")


def first_correct(flags: Sequence[bool]) -> int | None:
    """1-based index of the first True in rollout order (the rollouts required to answer correctly), else None."""
    return next((i for i, ok in enumerate(flags, 1) if ok), None)


def difficulty_bucket(rollouts_to_correct: int | None, easy_below: int = R1_EASY_BELOW,
                      hard_above: int = R1_HARD_ABOVE) -> str:
    """R1-Searcher §2.1: "easy" (fewer than ``easy_below`` = 10 rollouts to the first correct
    answer), "medium" (``easy_below``..``hard_above`` = 10 to 20), "hard" (more than 20, or never
    correct: the caller must have run more than ``hard_above`` rollouts for that to mean > 20).

    Raises:
        ValueError: thresholds with ``easy_below > hard_above + 1`` or below 1.
    """
    if easy_below < 1 or hard_above < easy_below - 1:
        raise ValueError(f"difficulty thresholds need 1 <= easy_below <= hard_above + 1, got {easy_below}, {hard_above}")
    if rollouts_to_correct is None or rollouts_to_correct > hard_above:
        return "hard"
    return "easy" if rollouts_to_correct < easy_below else "medium"


def normalize_dataset(name: str, aliases: Mapping[str, str] | None = None) -> str | None:
    """The Table-1 dataset a row's dataset name stands for (``aliases`` first, then
    :data:`DATASET_ALIASES`; case-insensitive), or None when it is not in Table 1."""
    key = name.strip().lower()
    for table in (aliases or {}, DATASET_ALIASES):
        low = {k.lower(): v for k, v in table.items()}
        if key in low:
            return low[key]
    return None


def scale_table(stage_table: Mapping[str, Mapping[str, int]], total: int | None) -> dict[tuple[str, str], int]:
    """Per (dataset, difficulty) quotas of one Table-1 stage scaled to ``total`` questions.

    Proportional to the table's counts, rounded by largest remainder (ties: table order) so the
    quotas sum exactly to ``total``; None = the table's own counts.

    Raises:
        ValueError: negative total.
    """
    cells = [((ds, diff), int(c)) for ds, row in stage_table.items() for diff, c in row.items() if c > 0]
    table_total = sum(c for _, c in cells)
    if total is None:
        return dict(cells)
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    exact = [(key, c * total / table_total) for key, c in cells]
    quotas = {key: int(x) for key, x in exact}
    left = total - sum(quotas.values())
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i][1] - int(exact[i][1])), i))
    for i in order[:left]:
        quotas[exact[i][0]] += 1
    return quotas


def mix_by_quotas(
    rows: Sequence[Mapping[str, Any]],
    quotas: Mapping[tuple[str, str], int],
    cell_of: Callable[[Mapping[str, Any]], tuple[str, str] | None],
    seed: int = 0,
    exclude: Iterable[str] = (),
) -> tuple[list[dict], dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """Pick ``quotas[cell]`` rows per cell, at random (``seed``) among the rows of that cell.

    Args:
        cell_of: row → (dataset, difficulty), or None for a row outside every cell.
        exclude: ids not to pick (e.g. taken by an earlier stage).

    Returns:
        (picked rows in input order, picked count per cell, shortfall per cell: quota − available
        where too few rows exist; empty if every quota is met).
    """
    excluded = set(map(str, exclude))
    by_cell: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        cell = cell_of(row)
        if cell is not None and str(row["id"]) not in excluded:
            by_cell[cell].append(i)
    rng = random.Random(seed)
    picked: set[int] = set()
    counts: dict[tuple[str, str], int] = {}
    shortfall: dict[tuple[str, str], int] = {}
    for cell in sorted(quotas):
        candidates = list(by_cell.get(cell, []))
        rng.shuffle(candidates)
        take = candidates[: quotas[cell]]
        picked.update(take)
        counts[cell] = len(take)
        if len(take) < quotas[cell]:
            shortfall[cell] = quotas[cell] - len(take)
    return [dict(rows[i]) for i in sorted(picked)], counts, shortfall


def difficulty_fields(result: Mapping[str, Any], easy_below: int = R1_EASY_BELOW,
                      hard_above: int = R1_HARD_ABOVE) -> dict[str, Any]:
    """Row fields for one question's rollout result ``{correct_of_n, rollouts, rollouts_to_correct}``."""
    rtc = result.get("rollouts_to_correct")
    return {"difficulty": difficulty_bucket(rtc, easy_below, hard_above), "correct_of_n": int(result["correct_of_n"]),
            "rollouts": int(result["rollouts"]), "rollouts_to_correct": rtc}


RolloutFn = Callable[[list[dict], int, int], list[Mapping[str, Any]]]
"""``rollout_fn(examples, k, round_index)`` → trajectory dicts (``qid``, ``sample_index``,
``final["answer"]``) of ``k`` rollouts per example, each round with fresh randomness."""


def run_difficulty_rounds(
    examples: Sequence[Mapping[str, Any]],
    rollout_fn: RolloutFn,
    *,
    n: int,
    max_rollouts: int,
    metric: str = "cover_em",
    f1_threshold: float = 1.0,
    on_done: Callable[[str, dict], None] | None = None,
) -> dict[str, dict]:
    """Rounds of ``n`` rollouts per question until one is correct or ``max_rollouts`` have run.

    Rollout ``round * n + sample_index + 1`` is a question's global 1-based rollout index.

    Returns:
        id → ``{"correct_of_n": correct rollouts, "rollouts": rollouts run, "rollouts_to_correct":
        index of the first correct one or None}``; ``on_done(id, result)`` is called as each
        question finishes (for the cache).

    Raises:
        ValueError: ``n`` or ``max_rollouts`` below 1; a trajectory for an unknown question.
    """
    if n < 1 or max_rollouts < 1:
        raise ValueError(f"n and max_rollouts must be >= 1, got {n}, {max_rollouts}")
    state: dict[str, dict] = {str(ex["id"]): {"ex": ex, "flags": []} for ex in examples}
    out: dict[str, dict] = {}
    rnd = 0
    while state and rnd * n < max_rollouts:
        k = min(n, max_rollouts - rnd * n)
        trajs = rollout_fn([s["ex"] for s in state.values()], k, rnd)
        got: dict[str, list[bool | None]] = {qid: [None] * k for qid in state}
        for t in trajs:
            qid, i = str(t["qid"]), int(t["sample_index"])
            if qid not in got or not 0 <= i < k:
                raise ValueError(f"rollout for unknown question/sample {qid!r}/{i}")
            answer = (t.get("final") or {}).get("answer")
            got[qid][i] = answer_correct(answer, state[qid]["ex"]["golden_answers"], metric, f1_threshold)
        for qid, flags in got.items():
            if any(f is None for f in flags):
                raise ValueError(f"question {qid!r}: expected {k} rollouts in round {rnd}, got {sum(f is not None for f in flags)}")
            state[qid]["flags"].extend(bool(f) for f in flags)
        finished = [qid for qid, s in state.items() if any(s["flags"]) or len(s["flags"]) >= max_rollouts]
        for qid in finished:
            flags = state.pop(qid)["flags"]
            out[qid] = {"correct_of_n": sum(flags), "rollouts": len(flags), "rollouts_to_correct": first_correct(flags)}
            if on_done is not None:
                on_done(qid, out[qid])
        rnd += 1
    return out


def r1_settings(cfg, model: str, recipe_config, n: int, max_rollouts: int, metric: str, f1_threshold: float) -> dict:
    """What a cached rollout count depends on (its cache fingerprint is a hash of this)."""
    ro = cfg.rollout
    return {
        "model": model, "backend": ro.backend, "recipe": "r1_searcher", "recipe_config": recipe_config.model_dump(),
        "temperature": ro.temperature, "top_p": ro.top_p, "seed": cfg.seed, "chat": ro.chat,
        "limits": {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn,
                   "max_observation_tokens": ro.max_observation_tokens, "max_total_tokens": ro.max_total_tokens},
        "n": n, "max_rollouts": max_rollouts, "metric": metric,
        "f1_threshold": f1_threshold if metric == "f1" else None, "index": _index_identity(cfg),
    }


def prepare_r1_difficulty(
    cfg,
    input_path: str | Path,
    out_dir: str | Path,
    *,
    n: int = 8,
    max_rollouts: int | None = None,
    metric: str = "cover_em",
    f1_threshold: float = 1.0,
    easy_below: int = R1_EASY_BELOW,
    hard_above: int = R1_HARD_ABOVE,
    stage_totals: Mapping[int, int | None] | None = None,
    dataset_aliases: Mapping[str, str] | None = None,
    model: str | None = None,
    limit: int | None = None,
    questions_per_call: int = 32,
    pool: Any = None,
    workers: Sequence[Any] | None = None,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """R1-Searcher §2.1 difficulty selection and the Table-1 mix (see the module docstring).

    Args:
        cfg: ``configs.Config``: ``learner.model`` (the reference policy unless ``model``),
            ``rollout`` (backend, workers, sampling, limits, chat), ``index``/``retrieval``,
            ``train.recipe_options`` when ``train.recipe`` is "r1_searcher" (stage is forced to 2),
            ``seed``.
        input_path: QA file. out_dir: gets ``difficulty.jsonl.gz`` (every question with its
            bucket), ``stage1.jsonl.gz`` / ``stage2.jsonl.gz`` (the mixes), ``cache.jsonl``,
            ``report.json``.
        n: rollouts per round (default 8). max_rollouts: cap per question (default: the smallest
            multiple of ``n`` above ``hard_above``: 24 for n = 8); must exceed ``hard_above`` so that
            "never correct" means "more than 20 rollouts".
        metric, f1_threshold: correctness (:func:`answer_correct`).
        easy_below, hard_above: the paper's thresholds (10, 20).
        stage_totals: stage → questions wanted (None = Table 1's own 350 / 8,148); a stage left
            out is not written. Stages are disjoint (stage 1 picks first).
        dataset_aliases: extra dataset-name → Table-1 dataset mappings (e.g.
            {"hotpotqa+2wiki_train": "hotpotqa"}); rows of other datasets are bucketed but not mixed.
        model: reference policy (default ``cfg.learner.model``; the paper used Qwen-2.5-7B-Instruct).
        questions_per_call: questions per RolloutWorker call (each runs its own rounds).
        pool, workers: running RetrievalPool / RolloutWorker actors; None = start them from
            ``cfg`` when a question is not cached (``rollout.num_workers`` workers) and stop them at
            the end. Ray: as in :func:`prepare_s3`.

    Returns:
        The report (also ``out_dir/report.json``).
    """
    t0 = time.perf_counter()
    model = model or cfg.learner.model
    if n < 1:
        raise PrepareError(f"n (rollouts per round) must be >= 1, got {n}")
    if metric not in METRICS:
        raise PrepareError(f"metric must be one of {METRICS}, got {metric!r}")
    if not 0 < f1_threshold <= 1:
        raise PrepareError(f"f1_threshold must be in (0, 1], got {f1_threshold}")
    try:
        difficulty_bucket(None, easy_below, hard_above)
    except ValueError as e:
        raise PrepareError(str(e)) from None
    if max_rollouts is None:
        max_rollouts = n * (hard_above // n + 1)
    if max_rollouts <= hard_above:
        raise PrepareError(f"max_rollouts ({max_rollouts}) must exceed hard_above ({hard_above}): a question never "
                           f"answered must have had more than {hard_above} rollouts to count as hard; raise "
                           f"--max-rollouts or lower --hard-above")
    if questions_per_call < 1:
        raise PrepareError(f"questions_per_call must be >= 1, got {questions_per_call}")
    totals = dict(stage_totals) if stage_totals is not None else {1: None, 2: None}
    for stage, total in totals.items():
        if stage not in R1_TABLE1:
            raise PrepareError(f"stage {stage!r} is not in R1-Searcher Table 1 (stages 1 and 2)")
        if total is not None and total < 0:
            raise PrepareError(f"stage {stage} total must be >= 0, got {total}")
    rcfg = _recipe_config(cfg, "r1_searcher", stage=2)
    _check_topk(cfg, rcfg.topk)
    settings = r1_settings(cfg, model, rcfg, n, max_rollouts, metric, f1_threshold)
    out_dir = Path(out_dir)
    _check_writable(out_dir / "report.json", "output folder")
    rows = read_qa_rows(input_path, limit)
    cache = ResultCache(out_dir / "cache.jsonl", settings_fingerprint(settings))
    cached = cache.load({r["id"]: r["question"].strip() for r in rows})
    results: dict[str, dict] = {qid: {k: cached[qid][k] for k in ("correct_of_n", "rollouts", "rollouts_to_correct")}
                                for qid in (r["id"] for r in rows) if qid in cached}
    pending = [r for r in rows if r["id"] not in results]
    progress(f"r1_difficulty: {len(rows)} questions, {len(results)} cached, {len(pending)} to roll out "
             f"(rounds of {n}, at most {max_rollouts} rollouts each, model {model})")

    started: list[Any] = []
    engines: list[Any] = []
    rollouts_run = 0
    if pending:
        import ray

        own_ray = _ensure_ray(cfg)
        try:
            if pool is None:
                from actors.retrieval import start_retrieval_pool

                pool = start_retrieval_pool(cfg.index.dir, cfg.retrieval)
                started.append(pool)
            if not workers:
                from actors.rollout import remote_rollout_worker

                ro = cfg.rollout
                cls = remote_rollout_worker(num_cpus=ro.cpus_per_worker, num_gpus=ro.gpus_per_worker)
                workers = [cls.remote(policy_engine_spec(cfg, model), pool) for _ in range(ro.num_workers)]
                started += workers
                engines += workers
                ray.get([w.ready.remote() for w in workers])
            rollouts_run = _r1_compute(cfg, pending, list(workers), rcfg, n, max_rollouts, metric, f1_threshold,
                                       questions_per_call, cache, results, progress)
        finally:
            if started:
                _shutdown(started, progress, engines)
            if own_ray:
                ray.shutdown()

    scored = [{**r, **difficulty_fields(results[r["id"]], easy_below, hard_above)} for r in rows]
    write_jsonl_gz(out_dir / "difficulty.jsonl.gz", scored)

    def cell_of(row):
        ds = normalize_dataset(row_dataset(row), dataset_aliases)
        return (ds, row["difficulty"]) if ds else None

    buckets = Counter(r["difficulty"] for r in scored)
    by_ds: dict[str, Counter] = defaultdict(Counter)
    for r in scored:
        by_ds[row_dataset(r)][r["difficulty"]] += 1
    not_in_table = Counter(row_dataset(r) for r in scored if cell_of(r) is None)
    stages: dict[str, Any] = {}
    taken: set[str] = set()
    for stage in sorted(totals):
        quotas = scale_table(R1_TABLE1[stage], totals[stage])
        picked, counts, shortfall = mix_by_quotas(scored, quotas, cell_of, seed=cfg.seed + stage, exclude=taken)
        taken.update(r["id"] for r in picked)
        path = out_dir / f"stage{stage}.jsonl.gz"
        write_jsonl_gz(path, picked)
        stages[str(stage)] = {
            "requested": sum(quotas.values()), "selected": len(picked), "output": str(path),
            "quotas": {f"{d}/{c}": q for (d, c), q in sorted(quotas.items())},
            "picked": {f"{d}/{c}": q for (d, c), q in sorted(counts.items())},
            "shortfall": {f"{d}/{c}": q for (d, c), q in sorted(shortfall.items())},
        }
        if shortfall:
            progress(f"r1_difficulty: stage {stage} short of {sum(shortfall.values())} questions: "
                     f"{stages[str(stage)]['shortfall']}")
    report = {
        "job": "r1_difficulty", "input": str(input_path), "output_dir": str(out_dir),
        "counts": {"in": len(rows), "rolled_out": len(pending), "cached": len(rows) - len(pending),
                   "rollouts_run": rollouts_run, "buckets": {d: buckets.get(d, 0) for d in DIFFICULTIES},
                   "by_dataset": {ds: {d: c.get(d, 0) for d in DIFFICULTIES} for ds, c in sorted(by_ds.items())},
                   "not_in_table1": dict(not_in_table)},
        "thresholds": {"easy_below": easy_below, "hard_above": hard_above},
        "stages": stages, "stale_cache_entries": cache.stale,
        "settings": settings, "settings_fingerprint": cache.fingerprint,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    write_json(out_dir / "report.json", report)
    progress(f"r1_difficulty: buckets {report['counts']['buckets']} -> {out_dir}")
    return report


def _r1_compute(cfg, pending, workers, rcfg, n, max_rollouts, metric, f1_threshold, questions_per_call,
                cache, results, progress) -> int:
    """Roll out ``pending`` in chunks (one chunk's rounds per RolloutWorker call sequence, chunks
    spread over ``workers``, two chunks in flight per worker); returns the rollouts run."""
    import ray

    ro = cfg.rollout
    limits = {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn, "max_observation_tokens": ro.max_observation_tokens,
              "max_total_tokens": ro.max_total_tokens}
    recipe_config = rcfg.model_dump()
    lock = threading.Lock()
    counter = {"rollouts": 0, "done": 0}

    def chunk_job(chunk: list[dict], worker) -> None:
        def rollout_fn(examples, k, rnd):
            ex = [{"id": e["id"], "question": e["question"], "golden_answers": e["golden_answers"],
                   "dataset": row_dataset(e)} for e in examples]
            # A fresh seed per round: the loop derives each episode's seed from (seed, question,
            # sample index), so reusing the seed would replay the previous round.
            sampling = {"temperature": ro.temperature, "top_p": ro.top_p, "seed": cfg.seed + 1_000_003 * (rnd + 1)}
            trajs = ray.get(worker.run.remote(ex, "r1_searcher", recipe_config, k, sampling, limits, ro.chat, False))
            with lock:
                counter["rollouts"] += len(trajs)
            return trajs

        def on_done(qid: str, result: dict) -> None:
            row = next(r for r in chunk if r["id"] == qid)
            cache.append({"id": qid, "question": row["question"].strip(), **result})
            with lock:
                results[qid] = result
                counter["done"] += 1

        run_difficulty_rounds(chunk, rollout_fn, n=n, max_rollouts=max_rollouts, metric=metric,
                              f1_threshold=f1_threshold, on_done=on_done)

    chunks = [pending[i : i + questions_per_call] for i in range(0, len(pending), questions_per_call)]
    with ThreadPoolExecutor(max_workers=2 * len(workers)) as ex:
        futures = [ex.submit(chunk_job, c, workers[i % len(workers)]) for i, c in enumerate(chunks)]
        for fut in as_completed(futures):
            fut.result()
            progress(f"r1_difficulty: {counter['done']}/{len(pending)} questions, {counter['rollouts']} rollouts")
    return counter["rollouts"]


# ============================================================================ FlashRAG import


def flashrag_qa_row(rec: Mapping[str, Any], dataset: str, path: str | Path, line: int,
                    prefix_ids: bool = True) -> dict[str, Any]:
    """One FlashRAG QA record → a data-pack QA row.

    ``{id, question, golden_answers, metadata?, ...}`` becomes ``{id, question, golden_answers,
    source: dataset, orig_id, ...}``: the id gets a ``"<dataset>:"`` prefix (pack ids are unique
    across datasets) unless it has one or ``prefix_ids`` is False; a bare-string golden answer
    becomes a one-item list; FlashRAG's ``dataset`` / ``split`` fields become ``orig_dataset`` /
    ``orig_split`` (and a ``source`` field ``orig_source``); other fields (``metadata`` ...) are kept.

    Raises:
        BadRowError: missing or mistyped id / question / golden_answers (file and line).
    """
    path = Path(path)
    qid = _get_id(rec, path, line, _QA_FORM)
    question = _get_str(rec, "question", path, line, _QA_FORM, nonempty=True)
    answers = list(_golden_answers(rec, path, line))
    new_id = qid if (not prefix_ids or qid.startswith(f"{dataset}:")) else f"{dataset}:{qid}"
    row: dict[str, Any] = {"id": new_id, "question": question, "golden_answers": answers, "source": dataset}
    if new_id != qid:
        row["orig_id"] = qid
    for k, v in rec.items():
        if k in ("id", "question", "golden_answers"):
            continue
        if k in ("dataset", "split", "source"):
            row[f"orig_{k}"] = v
        else:
            row[k] = v
    return row


def flashrag_corpus_row(rec: Mapping[str, Any], path: str | Path, line: int) -> dict[str, str]:
    """One FlashRAG corpus record (``{id, contents}``, contents ``"Title"\\ntext``, or ``{id, title,
    text}``) → a data-pack passage ``{id, title, text}`` (``pipelines.data.split_contents``).

    Raises:
        BadRowError: missing or mistyped fields (file and line).
    """
    path = Path(path)
    pid = _get_id(rec, path, line, _FLASHRAG_CORPUS_FORM)
    if "text" not in rec and "contents" in rec:
        title, text = split_contents(_get_str(rec, "contents", path, line, _FLASHRAG_CORPUS_FORM))
    else:
        title = _get_str(rec, "title", path, line, _FLASHRAG_CORPUS_FORM)
        text = _get_str(rec, "text", path, line, _FLASHRAG_CORPUS_FORM)
    return {"id": pid, "title": title, "text": text}


def _check_out_name(out: Path) -> None:
    if not out.name.endswith(".jsonl.gz"):
        raise PrepareError(f"output {out}: name it *.jsonl.gz (the data pack's gzip JSONL format)")


def import_flashrag_qa(src: str | Path, out: str | Path, dataset: str, *, limit: int | None = None,
                       prefix_ids: bool = True) -> dict[str, Any]:
    """Convert a FlashRAG QA file (.jsonl, .jsonl.gz or .parquet) to a pack QA file named ``dataset``.

    Raises:
        BadRowError: a malformed row or a duplicate id (file and line; nothing is written).
        PrepareError: empty dataset name or an output not named *.jsonl.gz.
    """
    src, out = Path(src), Path(out)
    if not dataset or not dataset.strip() or ":" in dataset:
        raise PrepareError(f"dataset name must be non-empty and contain no ':', got {dataset!r} (e.g. --dataset nq)")
    _check_out_name(out)
    rows: list[dict] = []
    seen: dict[str, int] = {}
    for line, rec in iter_records(src):
        if limit is not None and len(rows) >= limit:
            break
        row = flashrag_qa_row(rec, dataset.strip(), src, line, prefix_ids)
        if row["id"] in seen:
            raise BadRowError(src, line, f"duplicate id {row['id']!r} (first on line {seen[row['id']]})")
        seen[row["id"]] = line
        rows.append(row)
    n = write_jsonl_gz(out, rows)
    return {"job": "import_flashrag", "kind": "qa", "input": str(src), "output": str(out), "dataset": dataset,
            "rows": n}


def import_flashrag_corpus(src: str | Path, out: str | Path, *, limit: int | None = None) -> dict[str, Any]:
    """Convert a FlashRAG corpus (.jsonl, .jsonl.gz or .parquet) to a pack corpus ``{id, title, text}``.

    Streams (constant memory) into a temporary file renamed at the end.

    Raises:
        BadRowError: a malformed row or a duplicate id (file and line; nothing is written).
        PrepareError: an output not named *.jsonl.gz.
    """
    src, out = Path(src), Path(out)
    _check_out_name(out)

    def rows():
        seen: set[str] = set()
        count = 0
        for line, rec in iter_records(src):
            if limit is not None and count >= limit:
                return
            row = flashrag_corpus_row(rec, src, line)
            if row["id"] in seen:
                raise BadRowError(src, line, f"duplicate passage id {row['id']!r}")
            seen.add(row["id"])
            count += 1
            yield row

    try:
        n = write_jsonl_gz(out, rows())
    except BaseException:
        out.with_name(out.name + ".tmp").unlink(missing_ok=True)
        raise
    return {"job": "import_flashrag", "kind": "corpus", "input": str(src), "output": str(out), "rows": n}
