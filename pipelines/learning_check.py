"""Learning check: does a recipe's own RL raise its own reward on the questions it trains on?

A fixed set of training questions (`pick_questions`: a seeded sample spread over the datasets, none of them a
question the warm start demonstrated) is scored with the recipe's own reward before and after `steps` updates
of the config's own algorithm (GRPO, PPO with GAE, ...) on exactly those questions (`check_config`: the training
pool is the set, and every step takes all of it). Both scorings run the same way:
- greedy: one episode per question at temperature 0;
- sampled: `rollout.samples_per_prompt` episodes per question at `rollout.temperature`, the first training step's
  seed. The "before" sampled scoring is the first step's own rollout (the same policy, questions, samples,
  temperature and seed), so it costs nothing extra; the "after" one repeats that call with the trained weights.
Also, for information, greedy episodes of `dev_questions` dev questions (the dev evaluation's sample).

Each metric (the total reward, each reward component the trajectories carry, answer EM and F1, own searches) is
averaged per question (over its samples), and before -> after is the paired difference over questions with its
95% percentile-bootstrap interval (`pipelines.eval_stats.paired_difference`). The check passes (`decide`) only
when the total reward rose with the interval's lower end above 0 (on the sampled scoring by default).

The policy starts where the config starts: after its warm start (`train.warm_start`, e.g. the recipe's expert
demonstrations) when it has one, else the base model; `start_from` skips the warm start and loads a saved policy
instead (a run's `checkpoints/warm-start`). R1-Searcher's stages are checked one at a time (`stage`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from configs.schema import Config
from pipelines.eval_stats import DEFAULT_RESAMPLES
from pipelines.learning_check_table import CRITERIA, LearningCheckError, build_table, decide, learnable_groups

log = logging.getLogger(__name__)

RESULT_DIR = "learning_check"
"""Inside the check's run directory: the scorings' trajectories (`<when>-<set>.jsonl.gz`) and `result.json`."""


# -- the config --------------------------------------------------------------------------------------------------

def check_config(cfg: Config, questions: int, steps: int, stage: int | None = None,
                 start_from: str | Path | None = None) -> Config:
    """`cfg` made into a learning check's config: `steps` training steps of `questions` questions each (the whole
    fixed set every step: `Trainer` then draws a permutation of the set each step), no learnable-question
    selection, no dev evaluation or checkpoint of the training loop's own, synchronous rollouts
    (`train.async_mode: off`), wandb off. Everything else (algorithm, recipe options, samples, temperature,
    learner, warm start) stays the config's.

    Args:
        cfg: the recipe config (with the user's overrides).
        questions: size of the fixed set (questions, >= 2: an interval needs pairs).
        steps: training steps (updates), >= 1.
        stage: 1-based stage of a staged config (R1-Searcher), required there and refused elsewhere; the config
            then holds that stage alone, `steps` long, with its recipe options and training file.
        start_from: a saved policy to start from instead of the warm start: a Hugging Face model folder
            (`config.json`), or a run directory holding `checkpoints/warm-start/policy/hf`; it becomes
            `learner.model` (so the reference model too, when the config has one) and the warm start is off.
    Returns:
        The validated config.
    Raises:
        LearningCheckError: `questions` < 2, `steps` < 1, a missing or unexpected `stage`, a `start_from` that
            holds no model.
        ConfigError: the changed config does not validate (one `dotted.key: message` line each).
    """
    from configs.loader import validate_config

    if int(questions) != questions or questions < 2:
        raise LearningCheckError(f"--questions {questions}: needs at least 2 questions (the interval pairs them)")
    if int(steps) != steps or steps < 1:
        raise LearningCheckError(f"--steps {steps}: needs at least 1 training step")
    data = cfg.model_dump(mode="json")
    train = data["train"]
    if cfg.train.stages:
        if stage is None:
            raise LearningCheckError(f"{cfg.name}: the config has {len(cfg.train.stages)} stages; check one at a time "
                                     f"with --stage 1 ... --stage {len(cfg.train.stages)}")
        if not 1 <= stage <= len(cfg.train.stages):
            raise LearningCheckError(f"--stage {stage}: the config has stages 1 to {len(cfg.train.stages)}")
        train["stages"] = [{**train["stages"][stage - 1], "steps": int(steps)}]
    elif stage is not None:
        raise LearningCheckError(f"--stage {stage}: {cfg.name} has no stages (train.stages is empty); "
                                 "leave --stage out")
    train.update({"total_steps": int(steps), "questions_per_step": int(questions), "select_questions": 0,
                  "eval_questions": 0, "eval_every": 0, "eval_untrained": False, "save_every": 0,
                  "async_mode": "off", "save_rollouts": True})
    train["wandb"]["mode"] = "disabled"
    if start_from is not None:
        data["learner"]["model"] = str(saved_policy(start_from))
        train["warm_start"] = None
    return validate_config(data, "the learning check's changes")


def saved_policy(path: str | Path) -> Path:
    """The Hugging Face model folder `path` names: `path` itself when it holds `config.json`, else a run
    directory's warm-started policy (`<path>/checkpoints/warm-start/policy/hf`).

    Raises:
        LearningCheckError: neither holds a `config.json`.
    """
    from pipelines.warm_start import WARM_START_DIR

    path = Path(path)
    for candidate in (path, path / WARM_START_DIR / "policy" / "hf"):
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    raise LearningCheckError(f"--start-from {path}: no model there (no config.json in it or in "
                             f"{path / WARM_START_DIR / 'policy' / 'hf'})")


def question_key(row: Mapping[str, Any]) -> str:
    """A question's key across the pack's datasets: its GRPO group id (`<dataset>/<id>`), which trajectories carry."""
    from actors.rollout.agent_loop import group_id_of

    return group_id_of(dict(row))


def pick_questions(pool: Sequence[dict], count: int, seed: int, exclude: Sequence[dict] = ()) -> list[dict]:
    """The fixed set: `count` questions of `pool` spread over the datasets (`pipelines.data.spread_sample`, seeded
    by `seed`), none of them in `exclude` (the warm start's questions: a demonstrated gold answer would be measured,
    not learned).

    Raises:
        LearningCheckError: fewer than `count` questions left after the exclusion.
    """
    from pipelines.data import spread_sample

    skip = {question_key(r) for r in exclude}
    rows = [r for r in pool if question_key(r) not in skip]
    if len(rows) < count:
        raise LearningCheckError(f"--questions {count}: only {len(rows)} training questions are left "
                                 f"({len(pool)} in the file, {len(skip)} taken by the warm start)")
    return spread_sample(rows, count, seed)


def learnable_fixed_set(candidates: Sequence[dict], trajs: Sequence[Mapping[str, Any]], count: int) -> list[dict]:
    """The fixed set from a selection: the first `count` of `candidates` (their spread order) whose sampled total
    rewards differ in `trajs` (`learnable_groups`).

    Raises:
        LearningCheckError: fewer than `count` candidates are learnable (the message says how many were).
    """
    keep = set(learnable_groups(trajs))
    rows = [q for q in candidates if question_key(q) in keep]
    if len(rows) < count:
        raise LearningCheckError(f"--candidates {len(candidates)}: only {len(rows)} had samples whose total rewards "
                                 f"differ, fewer than --questions {count}; raise --candidates or lower --questions")
    return rows[:count]


# -- the run -----------------------------------------------------------------------------------------------------

@dataclass
class CheckResult:
    """What a learning check found (`result.json` and `--out` hold `asdict` of it).

    `table`: `build_table`'s rows; `minutes`: wall minutes by phase (start = Ray, index and actors; warm_start;
    selection; before; training; after) and `total`; `selection`: how the fixed set was chosen; `start`: where
    the policy started (the warm start, a saved policy or the base model); `questions`: the fixed set's question
    keys; `run_dir`: the trajectories and logs."""

    config: str
    recipe: str
    stage: int | None
    algorithm: str
    start: str
    steps: int
    samples: int
    temperature: float
    criterion: str
    questions: list[str]
    selection: str
    table: list[dict[str, Any]]
    passed: bool
    reason: str
    run_dir: str
    minutes: dict[str, float] = field(default_factory=dict)
    step_metrics: list[dict[str, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN metrics as None)."""
        def clean(x: Any) -> Any:
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, list):
                return [clean(v) for v in x]
            return x

        return clean(asdict(self))


def algorithm_name(cfg: Config) -> str:
    """The training algorithm in words: the advantage estimator, with a critic for GAE, clip-higher and KL when set."""
    algo = cfg.algorithm
    parts = [f"{algo.advantage_estimator}" + (" (PPO with a critic)" if algo.needs_critic else "")]
    if getattr(algo, "clip_eps_high", None):
        parts.append(f"clip-higher {algo.clip_eps_high:g}")
    if algo.kl_coef:
        parts.append(f"KL {algo.kl_coef:g}")
    return ", ".join(parts)


def describe_start(cfg: Config, warm: Mapping[str, float] | None, start_from: str | Path | None) -> str:
    """Where the check's policy started, in words (its 'before' scores are that policy's).

    Args:
        cfg: the check's config (`check_config`'s).
        warm: the warm start's `warm_start/*` metrics, None when none ran.
        start_from: the saved policy given instead of the warm start, or None.
    """
    if start_from is not None:
        return f"a saved policy ({cfg.learner.model}), the config's warm start skipped"
    ws = cfg.train.warm_start
    if ws is None:
        return f"the base model ({cfg.learner.model}): the config has no warm start"
    kept = int((warm or {}).get("warm_start/kept", 0))
    if not kept:
        return f"the base model ({cfg.learner.model}): the {ws.source} warm start kept no episode"
    what = "the recipe's expert demonstrations" if ws.source == "expert" else "the policy's own best episodes"
    return (f"the config's warm start: {what}, {kept} kept of {int((warm or {}).get('warm_start/episodes', 0))} "
            f"episodes on {ws.questions} other training questions, {ws.epochs} epoch(s) at lr "
            f"{ws.lr if ws.lr is not None else cfg.learner.lr:g}")


def _fixed_pool_trainer(cfg: Config, run_dir: Path, questions: list[dict], progress: bool) -> Any:
    """A `pipelines.train.Trainer` whose training pool is `questions` (every step draws from them alone) and that
    keeps the first training step's trajectories (`first_rollout`): the 'before' sampled scoring."""
    from pipelines.train import Trainer

    class FixedPoolTrainer(Trainer):
        def __init__(self) -> None:
            super().__init__(cfg, run_dir, progress)
            self.fixed, self.first_rollout = list(questions), None

        def training_questions(self, file_name: str, recipe_options: dict) -> list[dict]:
            return self.fixed

        def step_rollout(self, step: int) -> list[dict]:
            trajs = super().step_rollout(step)
            if step == 0:
                self.first_rollout = trajs
            return trajs

    return FixedPoolTrainer()


def run_learning_check(cfg: Config, *, config_name: str, stage: int | None = None, dev_questions: int = 32,
                       criterion: str = "sampled", candidates: int = 0, start_from: str | Path | None = None,
                       replaced_warm_start: Any = None, progress: bool = False,
                       resamples: int = DEFAULT_RESAMPLES) -> CheckResult:
    """Run the check (module docstring) on `cfg`, already made by `check_config`; writes the scorings'
    trajectories and `result.json` under `<run_dir>/learning_check/` (`<cfg.run_dir>/learning-check-<recipe>-...`).

    Args:
        cfg: `check_config`'s config (its `train.questions_per_step` is the fixed set's size, `train.total_steps`
            the updates).
        config_name: the config file, for the report.
        stage: the stage checked (report only: `cfg` holds that stage alone).
        dev_questions: greedy dev questions scored before and after, for information (0: none).
        criterion: what `decide` reads ("sampled", "greedy", "both").
        candidates: 0: the fixed set is `pick_questions`' spread; else that many spread candidates are rolled out
            `train.select_samples` times each by the starting policy (at the config's temperature, a seed of their
            own) and the fixed set is the first of them whose total rewards differ (`learnable_fixed_set`).
        start_from: the saved policy `check_config` was given (report only).
        replaced_warm_start: the config's own `train.warm_start` when `start_from` replaced it (`check_config` turns
            it off): the fixed set leaves its questions out all the same (the saved policy was trained on them).
        progress: the training loop's progress output.
        resamples: bootstrap resamples of each interval.
    Returns:
        The `CheckResult` (`passed` as `decide`).
    Raises:
        LearningCheckError: a bad criterion, dev or candidate count, too few training or learnable questions.
        TrainConfigError, DataPackError: as `pipelines.train.validate`, before Ray starts.
        TrainingStopped: SIGTERM/SIGINT stopped the check (`pipelines.graceful_stop`); its actors are stopped.
        As `Trainer.start`, `Trainer.rollout` and `Trainer.step` (a dead learner is not rebuilt here).
    """
    import ray

    from cluster.logs import add_run_log, remove_run_log
    from cluster.ray_init import init_ray
    from configs.loader import make_run_dir
    from pipelines.checkpoints import save_rollouts
    from pipelines.data import iter_qa, pack_file, spread_sample
    from pipelines.graceful_stop import GracefulStop, StopRequested, TrainingStopped, stop_request
    from pipelines.step_schedule import stage_at
    from pipelines.train import validate
    from pipelines.train_metrics import step_summary
    from pipelines.warm_start import warm_start_questions

    if criterion not in CRITERIA:
        raise LearningCheckError(f"--criterion {criterion!r}: use one of {', '.join(CRITERIA)}")
    if dev_questions < 0:
        raise LearningCheckError(f"--dev-questions {dev_questions}: must be >= 0")
    if candidates and candidates < cfg.train.questions_per_step:
        raise LearningCheckError(f"--candidates {candidates}: needs at least --questions "
                                 f"{cfg.train.questions_per_step} (0: no selection)")
    cfg = validate(cfg, need_index=False)
    t_all = time.perf_counter()
    _, options, train_file = stage_at(cfg, 0)
    pool = [asdict(q) for q in iter_qa(pack_file(train_file, cfg.data.dir))]  # what Trainer.questions reads
    ws = cfg.train.warm_start
    taken = ws if ws is not None else replaced_warm_start  # the questions a warm start demonstrated
    warm_rows = warm_start_questions(pool, taken.questions, cfg.seed) if taken is not None else []
    fixed = pick_questions(pool, candidates or cfg.train.questions_per_step, cfg.seed, exclude=warm_rows)
    selection = f"{len(fixed)} training questions spread over the datasets"
    dev = (spread_sample([asdict(q) for q in iter_qa(pack_file(cfg.data.dev, cfg.data.dir))], dev_questions, seed=0)
           if dev_questions else [])
    steps, n, temperature = cfg.train.total_steps, cfg.rollout.samples_per_prompt, cfg.rollout.temperature
    sample_seed = cfg.seed * 1_000_003  # the first training step's seed (Trainer.step_rollout): the same draws

    recipe = cfg.train.recipe.replace(":", "-").replace(".", "-")  # a recipe named by import path too
    label = f"learning-check-{recipe}" + (f"-stage{stage}" if stage else "")
    run_dir = make_run_dir(cfg, label)
    out_dir = run_dir / RESULT_DIR
    out_dir.mkdir()
    log.info("learning check: run directory %s (log: %s)", run_dir, add_run_log(run_dir))
    log.info("learning check: %d training questions x %d steps of %s; scored greedy and with %d samples at "
             "temperature %g; %d dev questions", cfg.train.questions_per_step, steps, algorithm_name(cfg), n,
             temperature, len(dev))
    minutes: dict[str, float] = {}
    step_rows: list[dict[str, float]] = []
    started = init_ray(cfg.ray)
    trainer, stop = _fixed_pool_trainer(cfg, run_dir, fixed, progress), GracefulStop()
    completed = 0

    def phase(name: str, t0: float) -> float:
        minutes[name] = (time.perf_counter() - t0) / 60
        log.info("learning check: %s done in %.1f min", name, minutes[name])
        return time.perf_counter()

    def keep(when: str, sets: dict[str, list[dict]]) -> None:  # each as soon as scored: a stopped check leaves them
        for name, trajs in sets.items():
            save_rollouts(out_dir / f"{when}-{name}.jsonl.gz", trajs)

    try:
        from cluster.roles import check_ray_cluster
        from pipelines.build_index import ensure_index

        ensure_index(cfg, progress)
        check_ray_cluster(cfg)
        with stop.installed():
            trainer.on_phase = lambda name: setattr(stop, "phase", name)
            try:
                t = time.perf_counter()
                trainer.start()
                t = phase("start", t)
                warm = trainer.warm_start() if ws is not None else None
                stop.check()
                if warm is not None:
                    t = phase("warm_start", t)
                start = describe_start(cfg, warm, start_from)
                log.info("learning check: starting from %s", start)
                if candidates:
                    stop.phase = "selecting learnable questions"  # abortable: nothing trained yet
                    k = cfg.train.select_samples
                    picked = trainer.rollout(fixed, options, k, temperature, seed=sample_seed + 1)
                    keep("select", {"candidates": picked})
                    fixed = trainer.fixed = learnable_fixed_set(fixed, picked, cfg.train.questions_per_step)
                    selection = (f"the first {len(fixed)} of {candidates} spread candidates whose {k} samples' "
                                 f"total rewards differ ({len(learnable_groups(picked))} did)")
                    t = phase("selection", t)
                log.info("learning check: the fixed set: %s", selection)

                def greedy_sets(when: str) -> dict[str, list[dict]]:
                    stop.phase = "rollout+score"
                    out = {"greedy": trainer.rollout(fixed, options, 1, 0.0, seed=0)}
                    keep(when, out)
                    if dev:
                        stop.phase = "dev evaluation"
                        out["dev"] = trainer.rollout(dev, options, 1, 0.0, seed=0)
                        keep(when, {"dev": out["dev"]})
                    return out

                before = greedy_sets("before")
                t = phase("before", t)
                for step in range(steps):
                    metrics = trainer.step(step)
                    completed = step + 1
                    step_rows.append(metrics)
                    log.info("learning check: step %d/%d: %s", completed, steps,
                             step_summary(metrics, trainer.searches))
                    trainer.on_phase("next step")
                    if step == 0:
                        keep("before", {"sampled": trainer.first_rollout})
                    stop.check()
                before["sampled"] = trainer.first_rollout
                t = phase("training", t)
                after = greedy_sets("after")
                stop.phase = "rollout+score"
                after["sampled"] = trainer.rollout(fixed, options, n, temperature, seed=sample_seed)
                keep("after", {"sampled": after["sampled"]})
                phase("after", t)
            except (StopRequested, SystemError) as raised:  # SystemError: a StopRequested from inside Ray's core
                e = stop_request(raised)
                if e is None:
                    raise
                log.warning("learning check: %s after %d completed steps: stopping", e, completed)
                raise TrainingStopped(e.signum, run_dir, completed, None) from None
    finally:
        trainer.close(stop.shutdown_timeout_s)
        if started:
            ray.shutdown()
        remove_run_log(run_dir)
        from cluster.exit_deadline import disarm

        disarm()
    table = build_table(before, after, resamples=resamples)
    decision = decide(table, criterion)
    minutes["total"] = (time.perf_counter() - t_all) / 60
    result = CheckResult(
        config=config_name, recipe=cfg.train.recipe, stage=stage, algorithm=algorithm_name(cfg), start=start,
        steps=steps, samples=n, temperature=temperature, criterion=criterion,
        questions=[question_key(q) for q in fixed], selection=selection,
        table=table, passed=decision.passed, reason=decision.reason, run_dir=str(run_dir), minutes=minutes,
        step_metrics=step_rows)
    import json

    (out_dir / "result.json").write_text(json.dumps(result.to_json(), indent=1))
    return result


__all__ = [
    "CheckResult", "algorithm_name", "check_config", "describe_start", "learnable_fixed_set", "pick_questions",
    "question_key", "run_learning_check", "saved_policy",
]
