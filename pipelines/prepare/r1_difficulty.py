"""The ``r1_difficulty`` job: R1-Searcher §2.1 difficulty buckets and the Table-1 training mix.

The paper buckets questions by "the number of rollouts required to correctly answer" them: easy
(fewer than 10), medium (10 to 20), difficult (more than 20). Here a reference policy
(``prepare.r1_selection_model``, else the policy model; the paper's is Qwen-2.5-7B-Instruct) with
the paper's "System Prompt for Data Selection" (``r1_searcher`` recipe, ``prompt="data_selection"``,
stage 2) runs rounds of ``n`` rollouts per
question on RolloutWorker actors; a question stops at the first round with a correct answer
(cover-EM by default, the paper's rule-based ACC_R) and ``rollouts_to_correct`` is the 1-based
index of its first correct rollout; after ``max_rollouts`` (> 20) without one it is hard. The
buckets are then mixed per Table 1 (:data:`R1_TABLE1`), scaled to a requested total per stage.
Rows gain top-level ``difficulty``, ``correct_of_n``, ``rollouts`` and ``rollouts_to_correct``
fields (``pipelines.data.iter_qa`` puts them into ``QAExample.meta``).

Public names: ``R1_TABLE1``, ``DIFFICULTIES``, ``R1_EASY_BELOW``, ``R1_HARD_ABOVE``,
``DATASET_ALIASES``, ``METRICS``, ``RolloutFn``; pure functions (no Ray) ``answer_correct``,
``first_correct``, ``difficulty_bucket``, ``normalize_dataset``, ``scale_table``,
``mix_by_quotas``, ``difficulty_fields``, ``run_difficulty_rounds``, ``r1_settings``; the driver
``prepare_r1_difficulty``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    write_json,
    write_jsonl_gz,
)

log = logging.getLogger(__name__)

RECIPE = "r1_searcher"
# Engines load models (possibly downloading them): allow more than ActorSet's default.
_ENGINE_READY_TIMEOUT_S = 1800.0

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

METRICS = ("cover_em", "span_check", "em", "f1")


def answer_correct(answer: str | None, golden_answers: Sequence[str], metric: str = "cover_em",
                   f1_threshold: float = 1.0) -> bool:
    """Whether a rollout's final answer is correct.

    ``cover_em`` (default; R1-Searcher's rule-based ACC_R: a normalized gold answer is a character
    substring of the normalized answer, so "2" counts in "2022"), ``span_check`` (the same as whole
    tokens), ``em``, or ``f1`` (token F1, the stage-2 answer reward, ≥
    ``f1_threshold``). No answer is never correct.
    """
    from recipes.metrics import cover_exact_match, exact_match, f1_score

    if answer is None or not str(answer).strip():
        return False
    golds = list(golden_answers)
    if metric in ("cover_em", "span_check"):
        return cover_exact_match(answer, golds, token_level=metric == "span_check") > 0
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
        raise ValueError("difficulty thresholds need 1 <= easy_below <= hard_above + 1, "
                         f"got {easy_below}, {hard_above}")
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
                got_k = sum(f is not None for f in flags)
                raise ValueError(f"question {qid!r}: expected {k} rollouts in round {rnd}, got {got_k}")
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
        "model": model, "backend": ro.backend, "recipe": RECIPE, "recipe_config": recipe_config.model_dump(),
        "temperature": ro.temperature, "top_p": ro.top_p, "seed": cfg.seed, "chat": selection_chat(cfg),
        "limits": _limits(cfg), "n": n, "max_rollouts": max_rollouts, "metric": metric,
        "f1_threshold": f1_threshold if metric == "f1" else None, "index": index_identity(cfg),
    }


def selection_model(cfg, model: str | None = None) -> str:
    """The policy that rolls out: `model`, else `prepare.r1_selection_model`, else `learner.model`."""
    return model or cfg.prepare.r1_selection_model or cfg.learner.model


def selection_chat(cfg) -> bool | None:
    """Chat template for the selection rollouts: `prepare.r1_selection_chat`, else `rollout.chat`."""
    chat = cfg.prepare.r1_selection_chat
    return cfg.rollout.chat if chat is None else chat


def selection_recipe_config(cfg):
    """The ``r1_searcher`` config of the selection rollouts: §2.1's prompt, stage 2 (answers scored)."""
    return recipe_config(cfg, RECIPE, stage=2, prompt="data_selection")


def _limits(cfg) -> dict[str, int]:
    """The agent loop's token limits (``RolloutLimits`` fields) from ``cfg.rollout``."""
    ro = cfg.rollout
    return {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn, "max_observation_tokens": ro.max_observation_tokens,
            "max_total_tokens": ro.max_total_tokens}




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
    sample_seed: int | None = None,
    questions_per_call: int = 32,
    pool: Any = None,
    workers: Sequence[Any] | None = None,
    progress: Progress = log.info,
) -> dict[str, Any]:
    """R1-Searcher §2.1 difficulty selection and the Table-1 mix (see the module docstring).

    Args:
        cfg: ``configs.Config``: ``prepare.r1_selection_model`` / ``learner.model`` (the reference
            policy unless ``model``), ``prepare.r1_selection_chat``,
            ``rollout`` (backend, workers, sampling, limits, chat), ``index``/``retrieval``
            (``retrieval.topk``), ``train.recipe_options`` when ``train.recipe`` is "r1_searcher"
            (stage is forced to 2), ``seed``.
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
        model: reference policy (default ``prepare.r1_selection_model``, else ``learner.model``; the paper
            used Qwen-2.5-7B-Instruct).
        limit, sample_seed: the first ``limit`` questions, or with ``sample_seed`` a seeded sample of
            ``limit`` spread over the datasets (``read_qa_rows``).
        questions_per_call: questions per RolloutWorker call (each runs its own rounds).
        pool, workers: running RetrievalPool / RolloutWorker actors; None = start them from
            ``cfg`` when a question is not cached (``rollout.num_workers`` workers) and stop them at
            the end. Ray: as in ``pipelines.prepare.s3_filter.prepare_s3``.
        progress: progress lines (default: this module's logger).

    Returns:
        The report (also ``out_dir/report.json``).

    Raises (all before any actor starts): PrepareError (bad argument / unwritable output),
    ConfigError (bad recipe option), IndexFormatError (no index), BadRowError (malformed input
    row), FileNotFoundError (no input).
    """
    t0 = time.perf_counter()
    model = selection_model(cfg, model)
    max_rollouts = _check_args(n, max_rollouts, metric, f1_threshold, easy_below, hard_above, questions_per_call)
    totals = dict(stage_totals) if stage_totals is not None else {1: None, 2: None}
    for stage, total in totals.items():
        if stage not in R1_TABLE1:
            raise PrepareError(f"stage {stage!r} is not in R1-Searcher Table 1 (stages 1 and 2)")
        if total is not None and total < 0:
            raise PrepareError(f"stage {stage} total must be >= 0, got {total}")
    rcfg = selection_recipe_config(cfg)
    settings = r1_settings(cfg, model, rcfg, n, max_rollouts, metric, f1_threshold)
    out_dir = Path(out_dir)
    check_writable(out_dir / "report.json", "output folder")
    rows = read_qa_rows(input_path, limit, sample_seed=sample_seed)
    cache = ResultCache(out_dir / "cache.jsonl", settings_fingerprint(settings))
    cached = cache.load({r["id"]: r["question"].strip() for r in rows})
    results: dict[str, dict] = {qid: {k: cached[qid][k] for k in ("correct_of_n", "rollouts", "rollouts_to_correct")}
                                for qid in (r["id"] for r in rows) if qid in cached}
    pending = [r for r in rows if r["id"] not in results]
    progress(f"r1_difficulty: {len(rows)} questions, {len(results)} cached, {len(pending)} to roll out "
             f"(rounds of {n}, at most {max_rollouts} rollouts each, model {model})")

    rollouts_run = 0
    if pending:
        from actors.rollout.worker import start_rollout_workers

        with actor_session(cfg) as actors:
            pool = retrieval_pool(actors, cfg, pool)
            if not workers:
                workers = start_rollout_workers(actors, cfg, pool, model=model)
                actors.wait_ready(workers, timeout_s=_ENGINE_READY_TIMEOUT_S, what=f"rollout workers ({model})")
            rollouts_run = _r1_compute(cfg, pending, list(workers), rcfg, n, max_rollouts, metric, f1_threshold,
                                       questions_per_call, cache, results, progress)

    scored = [{**r, **difficulty_fields(results[r["id"]], easy_below, hard_above)} for r in rows]
    write_jsonl_gz(out_dir / "difficulty.jsonl.gz", scored)
    stages = _write_stages(scored, totals, dataset_aliases, cfg.seed, out_dir, progress)
    buckets = Counter(r["difficulty"] for r in scored)
    by_ds: dict[str, Counter] = defaultdict(Counter)
    for r in scored:
        by_ds[row_dataset(r)][r["difficulty"]] += 1
    not_in_table = Counter(row_dataset(r) for r in scored if normalize_dataset(row_dataset(r), dataset_aliases) is None)
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


def _check_args(n, max_rollouts, metric, f1_threshold, easy_below, hard_above, questions_per_call) -> int:
    """Validate :func:`prepare_r1_difficulty`'s numeric arguments; returns ``max_rollouts`` (its
    default filled in). Raises ``PrepareError`` naming the argument and the fix."""
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
    return max_rollouts


def _write_stages(scored, totals, dataset_aliases, seed, out_dir: Path, progress) -> dict[str, Any]:
    """Mix and write ``stage<k>.jsonl.gz`` for each stage of ``totals`` (Table 1 scaled to its
    total; stages disjoint, lower stage picks first); returns the report's ``stages`` section."""

    def cell_of(row):
        ds = normalize_dataset(row_dataset(row), dataset_aliases)
        return (ds, row["difficulty"]) if ds else None

    stages: dict[str, Any] = {}
    taken: set[str] = set()
    for stage in sorted(totals):
        quotas = scale_table(R1_TABLE1[stage], totals[stage])
        picked, counts, shortfall = mix_by_quotas(scored, quotas, cell_of, seed=seed + stage, exclude=taken)
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
    return stages


def _r1_compute(cfg, pending, workers, rcfg, n, max_rollouts, metric, f1_threshold, questions_per_call,
                cache, results, progress) -> int:
    """Roll out ``pending`` in chunks (one chunk's rounds per RolloutWorker call sequence, chunks
    spread over ``workers``, two chunks in flight per worker); returns the rollouts run."""
    import ray

    ro = cfg.rollout
    limits = _limits(cfg)
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
            trajs = ray.get(worker.run.remote(ex, RECIPE, recipe_config=recipe_config, n=k, sampling=sampling,
                                              limits=limits, chat=selection_chat(cfg), compute_reward=False))
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
