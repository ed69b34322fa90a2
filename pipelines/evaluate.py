"""Evaluate a trained searcher and the baselines on a QA file: EM, F1, cover-EM, span_check, GenAcc.

Methods (`methods=`, in this order in the tables):

- `direct`: the frozen generator (`frozen.model`) answers the question alone (`direct` recipe);
- `naive_rag`: the frozen generator answers from the top-k documents of the question itself
  (`naive_rag` recipe, k = `eval.topk`, else `retrieval.topk`; s3 §4.1: 3, R-Search §4.3: 5);
- `policy`: the trained searcher, recipe `train.recipe` (options `train.recipe_options`), weights
  from `checkpoint` (the untrained `learner.model` without one);
- `no_search`: the `policy` checkpoint with its own searches switched off (recipe option `searches: false`: a
  search it writes is not run and the recipe's forced answer, if it has one, follows, as at the turn limit;
  everything else as `policy`): it answers from the initial top-k alone. Paired with `policy`, it says what the
  policy's own searches added;
- `untrained`: the same recipe on `learner.model` (the "before training" row);
- `warm_start`: the same recipe on the run's warm-started policy (`train.warm_start`; the "warm start only"
  row: `<run>/checkpoints/warm-start/policy/hf` of the `checkpoint` run);
- `expert`: the training recipe's rule-based expert (`Recipe.expert_turn`, the warm start's demonstrations) writes
  every turn in the policy's place (`AgentLoop(expert=True)`; the policy model's tokenizer counts its tokens, its
  engine never generates): the most a policy that imitates it exactly reaches. It reads the gold answers (when to
  search, which documents to select, and for some `expert_searches` which query), so it is a ceiling, not a
  baseline. An episode it cannot demonstrate ends without an answer (scored 0); for s3 the frozen generator
  answers from its selection, so its row is the expert's Gain Beyond RAG with this generator;
- `rstool`: R-Search-as-a-Tool (Fig. 2): the frozen generator answers from the `policy` episodes'
  evidence (recipes with an `evidence_prompt`; needs `policy` in the methods).

With `eval.acc_l`, every method's answers also get R1-Searcher's ACC_L (§3.1 LLM-as-Judge, the
paper's Judge Prompt, the evaluation's judge model for GPT-4o-mini; `pipelines.eval_judges`).

In s3's protocol the generator answers in every baseline, so `direct` and `naive_rag` run on a
RolloutWorker whose engine is the generator model. A recipe whose episodes end in an answer
(search_r1, r1_searcher, r_search, eval_rar) is scored on that answer; for s3 the frozen generator
answers from the context the searcher selected (s3 §4: the final context of `recipes.s3.S3.
context_docs`, Appendix A.5, in the Fig. 12 answer prompt). One episode per question, decoded with
`eval.temperature` (0 = greedy; R-Search A.3: 0.1) and seeded; every search returns `eval.topk`
passages and the searcher gets `eval.max_turns` (each None = the training value). GenAcc =
span_check ∨ judge_check, the judge (`eval.judge_model`, else `frozen.judge_model`, else
`frozen.model`) asked only when the span check fails (s3 §4.1, Appendix A.4).

MIRAGE (`eval.mirage_questions` > 0; s3 §5, Table 2): that many of the pack's medical multiple-choice
questions (`data.mirage`) are asked beside the QA file, the options listed under the question
(`mirage_examples`), under datasets `mirage/<set>`. Their GenAcc is the judge alone: s3 A.4 uses
judge_check exclusively there, since span_check accepts wrong options. Their rows follow the QA
rows, with their own `mirage/all` row; the `all` row pools the QA sets only.

Order of work (`evaluate`): check the arguments, the checkpoint, the QA file and the index (errors
before any actor starts) → start or join Ray → RetrievalPool → frozen generator / judge → for each
engine (methods sharing one engine share one worker): a worker runs the methods' episodes, then its
engine is shut down → generator answers for s3 contexts → judge calls → rows → `results.json`,
`results.md`, `predictions.jsonl` in `out_dir`. Everything this call started is shut down in
`finally`. The math (`compute_rows`) is a pure function over per-question records.

Uncertainty (`eval_rows.add_intervals`, `pipelines.eval_stats`): every pooled row (`all`, `mirage/all`)
gets 95% percentile bootstrap intervals of EM, F1 and cover-EM over its questions (2000 resamples, a
fixed seed), and `policy`'s pooled row the paired differences policy − untrained and policy −
naive_rag (matched by question id, over the questions both answered) with theirs; `results.md` shows
them below the table, `results.json` as the rows' `ci` and `paired` keys.

`untrained` and `policy` share one plan but for the weights: the same recipe and options
(`Config.eval_recipe_config`: a staged run's last stage), limits, chat setting and sampling
(`eval_sampling`), the engine spec differing in `model` only (`tests/test_eval_stats.py` checks it).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.engines.spec import EngineSpec, engine_spec
from pipelines.eval_inputs import (  # noqa: F401  (re-exported: callers import them from here)
    BASELINES,
    DEFAULT_METHODS,
    METHODS,
    EvaluationError,
    _check_model_field,
    load_questions,
    mirage_examples,
    parse_methods,
    resolve_checkpoint,
    resolve_warm_start,
)
from pipelines.eval_judges import acc_l_verdicts, rstool_records
from pipelines.eval_rows import (
    ALL,
    QARecord,
    add_intervals,
    compute_rows,
    format_intervals_markdown,
    format_markdown,
    is_mirage,
    prediction_line,
    qa_record,
)
from pipelines.judge_agreement import agreement_note, judge_agreement
from recipes import recipe_class
from recipes.base import ANSWER_PROMPT
from recipes.metrics import span_check

log = logging.getLogger(__name__)

# Questions in the evaluation engine at once. The engine batches whatever is in flight, but a question sent behind
# hundreds of others waits behind all their turns (a turn's next generation rejoins the engine's queue at its end),
# so with every question sent at once all come back together near the end and the bar sits at 0 until then. On a
# CPU the KV cache (rollout.cpu_kv_cache_gib, 0.5-1 GiB) holds about 30-60 episodes of the 270M policy, the batch
# the engine runs at once anyway, so 64 keeps it full with the first answers back within a minute or two. A GPU
# engine batches up to vLLM's max_num_seqs (256 by default, more on large GPUs): 1024 keeps it full.
_IN_FLIGHT_CPU = 64
_IN_FLIGHT_GPU = 1024


@dataclass(frozen=True)
class _Plan:
    """One method: which engine runs which recipe with which settings."""

    method: str
    recipe: str
    recipe_config: dict
    spec: EngineSpec
    resources: dict
    limits: dict
    chat: bool | None
    expert: bool = False  # the recipe's expert writes the turns (`expert`)


def plan_methods(cfg: Any, methods: Sequence[str], checkpoint: str | None) -> list[_Plan]:
    """The engine, recipe and limits of every method (no actors). See the module docstring.

    Raises:
        EvaluationError: a bad checkpoint, `learner.model` / `frozen.model` naming a missing
            directory, (recipe names and options are checked when the config loads).
    """
    policy_model = resolve_checkpoint(checkpoint) if checkpoint is not None else cfg.learner.model
    _check_model_field("learner.model", cfg.learner.model)
    _check_model_field("frozen.model", cfg.frozen.model)
    if cfg.frozen.judge_model:
        _check_model_field("frozen.judge_model", cfg.frozen.judge_model)
    if cfg.eval.judge_model:
        _check_model_field("eval.judge_model", cfg.eval.judge_model)
    recipe_options = cfg.eval_recipe_config()  # eval.topk / eval.max_turns over the training options
    fr, ro = cfg.frozen, cfg.rollout
    gen_spec = engine_spec(cfg, "generator")
    gen_res = {"num_cpus": fr.num_cpus, "num_gpus": fr.num_gpus}
    gen_limits = {"max_new_tokens_per_turn": fr.max_answer_tokens, "max_observation_tokens": ro.max_observation_tokens,
                  "max_total_tokens": fr.max_model_len}
    pol_res = {"num_cpus": ro.cpus_per_worker, "num_gpus": ro.gpus_per_worker}
    pol_limits = cfg.searcher_limits()  # serving uses the same (serving.app.build_app)

    if "rstool" in methods:
        if recipe_class(cfg.train.recipe).evidence_prompt is None:
            raise EvaluationError(f"--methods rstool: recipe {cfg.train.recipe!r} writes no evidence to hand over "
                                  "(R-Search-as-a-Tool needs train.recipe=r_search); drop rstool")
        if "policy" not in methods:
            raise EvaluationError("--methods rstool: its answers come from the policy's evidence; add policy")
    plans = []
    for m in (m for m in methods if m != "rstool"):  # rstool runs no episodes of its own
        if m in BASELINES:  # the frozen generator answers, whatever recipe trains (naive_rag is trainable too)
            # Chat as the frozen generator decides it (None = when its tokenizer has a template).
            plans.append(_Plan(m, m, {"topk": cfg.eval_topk}, gen_spec, gen_res, gen_limits, None))
        else:
            if m == "warm_start" and checkpoint is None:
                raise EvaluationError("--methods warm_start: pass --checkpoint a run directory trained with "
                                      "train.warm_start (its warm-started policy is the row)")
            model = ({"policy": policy_model, "no_search": policy_model, "expert": policy_model,
                      "untrained": cfg.learner.model}.get(m)
                     or resolve_warm_start(checkpoint))
            # no_search: the policy with its searches off; a recipe that has no turn to search in (max_turns 0) is
            # left as it is, so the run is shared with policy's (`_same_run`)
            searches_off = m == "no_search" and recipe_class(cfg.train.recipe).config_cls(**recipe_options).max_turns > 0
            options = {**recipe_options, "searches": False} if searches_off else recipe_options
            plans.append(_Plan(m, cfg.train.recipe, options, engine_spec(cfg, "policy", model), pol_res,
                               pol_limits, ro.chat, expert=m == "expert"))
    return plans


def _same_run(a: _Plan, b: _Plan) -> bool:
    def key(p: _Plan) -> tuple:
        return p.recipe, p.recipe_config, p.spec, p.limits, p.chat, p.expert

    return key(a) == key(b)


# ----------------------------------------------------------------------------- orchestration


def method_timing(seconds: dict[str, float], questions: int) -> dict[str, dict[str, float]]:
    """Per method: wall seconds of its episodes, generator answers and judging, and seconds per question
    (engine start-up, shared by the methods of one engine, is left out; a method whose episodes were
    reused from another costs only its judging)."""
    n = max(questions, 1)
    return {m: {"seconds": round(s, 2), "questions": questions, "s_per_question": round(s / n, 3)}
            for m, s in seconds.items()}


def timing_line(timing: dict[str, dict[str, float]]) -> str:
    """One line: "seconds per question: direct 0.21, naive_rag 0.84, policy 3.10"."""
    return "seconds per question: " + ", ".join(f"{m} {t['s_per_question']:.2f}" for m, t in timing.items())


def _judge_flags(ray: Any, judge: Any, records: list[dict]) -> tuple[list[bool], list[bool | None]]:
    """GenAcc per record (span_check, else the judge's verdict; MIRAGE records: the verdict alone, s3 A.4)
    and the judge's verdict itself on every non-empty answer (None for an empty one), asked
    concurrently: the verdicts where the span check decides measure the judge (`judge_agreement`)."""
    spans = [bool(r["answer"]) and not is_mirage(r["dataset"]) and span_check(r["answer"], r["golden_answers"])
             for r in records]
    ask = [i for i, r in enumerate(records) if r["answer"] and r["answer"].strip()]
    verdicts: list[bool | None] = [None] * len(records)
    for i, v in zip(ask, ray.get([judge.judge.remote(records[i]["answer"], records[i]["golden_answers"]) for i in ask])):
        verdicts[i] = bool(v)
    return [s or bool(v) for s, v in zip(spans, verdicts)], verdicts


def eval_sampling(cfg: Any) -> dict[str, Any]:
    """Sampling of every evaluated method (`actors.engines.base.Sampling` fields): `eval.temperature`
    (0 = greedy), `eval.top_p`, seeded with `cfg.seed`."""
    return {"temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p, "seed": cfg.seed}


def eval_frozen_config(cfg: Any) -> Any:
    """`cfg` whose frozen LLMs run on the evaluation's engine (`eval.frozen_backend`, e.g. vLLM where
    training ran the generator on hf beside the learners); `cfg` itself when that is unset or the same."""
    backend = cfg.eval.frozen_backend
    if not backend or backend == cfg.frozen.backend:
        return cfg
    return cfg.model_copy(update={"frozen": cfg.frozen.model_copy(update={"backend": backend})})


def eval_judge_config(cfg: Any) -> Any:
    """`cfg` whose judge is the evaluation's (`Config.eval_judge_model`), for `start_frozen_llm(.., "judge")`."""
    return cfg.model_copy(update={"frozen": cfg.frozen.model_copy(update={"judge_model": cfg.eval_judge_model})})


def in_flight(plan: _Plan) -> int:
    """Questions `_run_questions` keeps in `plan`'s engine at once (count): `_IN_FLIGHT_GPU` for an engine on
    GPUs (`plan.resources["num_gpus"]` > 0), else `_IN_FLIGHT_CPU`."""
    return _IN_FLIGHT_GPU if plan.resources.get("num_gpus") else _IN_FLIGHT_CPU


def _run_questions(ray: Any, worker: Any, plan: _Plan, examples: list[dict], sampling: dict, progress: bool,
                   max_in_flight: int | None = None) -> list[dict]:
    """Final records of `examples` under `plan` on `worker` (`EvalWorker.run_final`, one question per call), in the
    order of `examples`, with a progress bar (questions, ETA) that moves as each question comes back.

    At most `max_in_flight` questions (None = `in_flight(plan)`) are in the worker at once; as one comes back the
    next is sent, so the engine's batch stays full and the first answers come back early instead of all at the end.
    """
    from tqdm import tqdm

    def send(i: int) -> Any:
        return worker.run_final.remote(examples[i : i + 1], plan.recipe, recipe_config=plan.recipe_config,
                                       sampling=sampling, limits=plan.limits, chat=plan.chat, expert=plan.expert)

    width = max(1, max_in_flight or in_flight(plan))
    pending = {send(i): i for i in range(min(width, len(examples)))}
    following = iter(range(len(pending), len(examples)))
    done: list[list[dict] | None] = [None] * len(examples)
    with tqdm(total=len(examples), unit="q", desc=f"evaluate {plan.method}", disable=not progress,
              dynamic_ncols=True) as bar:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(ready[0])
            done[i] = ray.get(ready[0])
            bar.update(len(done[i]))
            nxt = next(following, None)
            if nxt is not None:
                pending[send(nxt)] = nxt
    return [r for recs in done for r in recs]


def evaluate(
    cfg: Any,
    qa_file: str | Path,
    out_dir: str | Path,
    checkpoint: str | Path | None = None,
    limit: int | None = None,
    methods: str | Iterable[str] = DEFAULT_METHODS,
    *,
    sample: bool = False,
    pool: Any = None,
    generator: Any = None,
    judge: Any = None,
    log: Callable[[str], None] = log.info,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Evaluate `methods` on `limit` questions of `qa_file`; write the results to `out_dir`.

    Args:
        cfg: `configs.Config`; uses `train.recipe(_options)`, `learner.model`, `rollout.*` (policy
            engine and limits), `frozen.*` (generator, judge, their engines), `eval.*` (top-k,
            temperature, max_turns, judge model, frozen backend), `index.dir`,
            `retrieval.*`, `ray.*`, `data.dir` (for a pack file name) and `seed`.
        qa_file: QA file path, or a data pack file name ("test.jsonl.gz").
        out_dir: created if missing; gets `config.yaml` (the resolved config), `results.json` (the rows,
            pooled rows with `ci` / `paired`: `add_intervals`), `results.md` (the table, the judge's
            agreement line, then the intervals), `judge_agreement.json` (`judge_agreement`), `timing.json`
            (seconds per question of each method: `method_timing`) and
            `predictions.jsonl` (one line per method × question, with the judge's verdict and, for a
            searcher episode whose record carries them, its turns: `prediction_line`).
        checkpoint: the learner's checkpoint directory (with `policy/hf/`) or an HF model
            directory; None = the untrained `learner.model` is the policy.
        limit: questions (count) from the start of the file; None = all.
        sample: with `limit`, a seeded (`cfg.seed`) sample spread over the file's datasets instead
            of the first `limit` questions (`load_questions`).
        methods: names from `METHODS`, as "a,b" or a list.
        pool, generator, judge: running RetrievalPool / FrozenLLMWorker actor handles to reuse
            (e.g. from the training pipeline; never shut down here). None = start one (the judge
            defaults to the generator when the evaluation's judge model is the generator's).
        log: progress lines.
        progress: a progress bar (questions, ETA) per method.
    Returns:
        The rows of `compute_rows` with `add_intervals`' keys (also in `results.json`).
    Raises:
        EvaluationError: bad methods, checkpoint, limit, model path or empty QA file; DataPackError /
            BadRowError: QA file — all raised before any actor starts; IndexFormatError: an unreadable
            index at `index.dir` (a missing one is built first, `pipelines.build_index.ensure_index`).
    """
    import ray

    from actors.frozen.worker import start_frozen_llm
    from actors.lifecycle import ActorSet
    from actors.retrieval.pool import start_retrieval_pool
    from actors.rollout.eval_worker import EvalWorker
    from cluster.ray_init import init_ray
    from pipelines.build_index import ensure_index

    names = parse_methods(methods)
    cfg = eval_frozen_config(cfg)
    plans = plan_methods(cfg, names, str(checkpoint) if checkpoint is not None else None)
    examples = load_questions(qa_file, cfg.data.dir, limit, sample_seed=cfg.seed if sample else None)
    if cfg.eval.mirage_questions:
        from pipelines.data import pack_file

        examples += mirage_examples(pack_file(cfg.data.mirage, cfg.data.dir), cfg.eval.mirage_questions, cfg.seed)
    needs_pool = any(recipe_class(p.recipe).retrieves for p in plans)
    generator_answers = any(recipe_class(p.recipe).generator_answers for p in plans)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    t_start = time.perf_counter()
    started_ray = init_ray(cfg.ray)
    actors = ActorSet()  # what this call started and must stop; handles passed in are never stopped
    try:
        # Frozen engines load while the pool starts and the first worker loads its engine.
        own_judge = cfg.eval_judge_model != cfg.frozen.model
        if generator is None and (generator_answers or "rstool" in names or (judge is None and not own_judge)):
            generator = start_frozen_llm(actors, cfg, "generator")
        if judge is None:
            judge = start_frozen_llm(actors, eval_judge_config(cfg), "judge") if own_judge else generator
        frozen = [h for h in {id(generator): generator, id(judge): judge}.values() if h is not None]
        if needs_pool and pool is None:
            ensure_index(cfg)  # built (resuming) when missing, as every entry point does
            pool = actors.adopt(start_retrieval_pool(cfg.index.dir, cfg.retrieval))

        # Methods sharing an engine share a worker; one worker (engine) is alive at a time.
        groups: dict[str, list[_Plan]] = {}
        for p in plans:
            groups.setdefault(json.dumps({**p.spec.model_dump(), **p.resources}, sort_keys=True), []).append(p)
        results: dict[str, list[dict]] = {}
        seconds: dict[str, float] = {}  # per method: episodes, generator answers and judging (wall, s)
        for group in groups.values():
            t0, spec = time.perf_counter(), group[0].spec
            worker = actors.start(EvalWorker, spec, pool, **group[0].resources)
            actors.wait_ready([worker, *frozen], timeout_s=1800, what=f"evaluation engine {spec.model} and frozen LLMs")
            frozen = []
            log(f"engine {spec.backend}:{spec.model} ready in {time.perf_counter() - t0:.0f} s")
            for p in group:
                same = next((q for q in plans if q.method in results and _same_run(p, q)), None)
                if same is not None:  # seeded decoding: the same run gives the same episodes
                    results[p.method] = copy.deepcopy(results[same.method])
                    seconds[p.method] = 0.0
                    log(f"{p.method}: same engine and recipe as {same.method}, its episodes reused")
                    continue
                t0 = time.perf_counter()
                results[p.method] = _run_questions(ray, worker, p, examples, eval_sampling(cfg), progress)
                seconds[p.method] = time.perf_counter() - t0
                log(f"{p.method}: episodes done in {seconds[p.method]:.0f} s")
            actors.stop([worker])

        # s3: the frozen generator answers from the searcher's final context (Fig. 12 prompt).
        for p in plans:
            if recipe_class(p.recipe).generator_answers:
                t0, recs = time.perf_counter(), results[p.method]
                answers = ray.get([generator.generate_answer.remote(r["question"], r["context"], ANSWER_PROMPT)
                                   for r in recs])
                for r, a in zip(recs, answers):
                    r["answer"] = a
                seconds[p.method] += time.perf_counter() - t0

        scored = [(p.method, p.recipe) for p in plans]
        if "rstool" in names:  # R-Search Fig. 2: the generator answers from the policy's evidence
            t0 = time.perf_counter()
            results["rstool"] = rstool_records(ray, generator, results["policy"],
                                               recipe_class(cfg.train.recipe).evidence_prompt)
            seconds["rstool"] = time.perf_counter() - t0
            scored.insert(scored.index(("policy", cfg.train.recipe)) + 1, ("rstool", cfg.train.recipe))
        rows_in: list[QARecord] = []
        judged: list[tuple[dict, bool | None]] = []
        with open(out / "predictions.jsonl", "w") as f:
            for method, recipe in scored:
                t0, recs = time.perf_counter(), results[method]
                flags, verdicts = _judge_flags(ray, judge, recs)
                acc_l = acc_l_verdicts(ray, judge, recs) if cfg.eval.acc_l else [None] * len(recs)
                seconds[method] = seconds.get(method, 0.0) + time.perf_counter() - t0
                for r, flag, verdict, acc in zip(recs, flags, verdicts, acc_l):
                    rows_in.append(qa_record(method, r, gen_acc=flag, acc_l=acc))
                    judged.append((r, verdict))
                    f.write(json.dumps(prediction_line(method, recipe, r, gen_acc=flag, judge=verdict, acc_l=acc,
                                                       searcher=method not in BASELINES)) + "\n")
        rows = add_intervals(compute_rows(rows_in), rows_in)
        qa_judged = [(r, v) for r, v in judged if not is_mirage(r["dataset"])]  # the rules decide QA answers only
        agreement = judge_agreement([r for r, _ in qa_judged], [v for _, v in qa_judged])
    finally:
        actors.stop()
        if started_ray:
            ray.shutdown()

    policy = next((p for p in plans if p.method == "policy"), None)
    n_mirage = sum(is_mirage(e["dataset"]) for e in examples)
    mirage_note = (f" and {n_mirage} MIRAGE questions (GenAcc = the judge alone, s3 A.4; not in the `all` row)"
                   if n_mirage else "")
    title = (f"Evaluation on {Path(qa_file).name} ({len(examples) - n_mirage} questions{mirage_note}): "
             f"recipe {cfg.train.recipe}, "
             f"policy {policy.spec.model if policy else '-'}, generator {cfg.frozen.model}, "
             f"judge {cfg.eval_judge_model}, top-{cfg.eval_topk}, temperature {cfg.eval.temperature:g}")
    note = agreement_note(agreement, cfg.eval_judge_model)
    from configs.loader import save_config

    save_config(cfg, out / "config.yaml")  # the resolved settings these numbers were measured with
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "judge_agreement.json").write_text(json.dumps(agreement, indent=2) + "\n")
    timing = method_timing(seconds, len(examples))
    (out / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    log(timing_line(timing))
    md = format_markdown(rows, title) + f"\n{note}\n"  # the note right under the table, the intervals below
    intervals = format_intervals_markdown(rows)
    (out / "results.md").write_text(md + (f"\n{intervals}" if intervals else ""))
    log(note)
    log(f"done in {time.perf_counter() - t_start:.0f} s; results in {out}")
    return rows


__all__ = [
    "ALL", "DEFAULT_METHODS", "EvaluationError", "METHODS", "MIRAGE", "QARecord", "is_mirage", "mirage_examples",
    "add_intervals", "compute_rows", "eval_judge_config", "eval_sampling", "evaluate", "format_intervals_markdown",
    "format_markdown", "load_questions", "prediction_line",
    "parse_methods", "plan_methods",
    "resolve_checkpoint",
]
