"""Learning check: does the recipe's own RL raise its own reward on the questions it trains on?

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.ops.learning_check --config CONFIG [--questions 16]
        [--steps 2] [--candidates 0] [--stage N] [--dev-questions 32] [--criterion sampled] [--start-from DIR]
        [--out FILE] [key=value ...]

On the config's real policy (Gemma 3 270M on the CPU configs): a fixed set of `--questions` training questions
(spread over the datasets, none the warm start demonstrated; with `--candidates N`, the first of N such questions
whose `train.select_samples` samples' total rewards differ, as a group of equal rewards trains nothing) is scored
with the recipe's own reward, greedy (one episode a question, temperature 0) and sampled (`rollout.samples_per_prompt` episodes at `rollout.temperature`);
then `--steps` updates of the config's own algorithm (PPO with GAE for s3, GRPO for the others, as their configs
say) train on exactly those questions, every step all of them; then the same questions are scored the same way.
It prints, for each reward component, the total reward, answer EM and F1 and own searches, before -> after and the
paired 95% bootstrap interval over questions, on the training questions and (for information) on `--dev-questions`
dev questions. The policy starts where the config starts: after its warm start (e.g. the recipe's expert
demonstrations) when it has one, else the base model; the `start:` line above the table says which.
`--start-from` skips the warm start and loads a saved policy (a run directory's `checkpoints/warm-start`, or any
Hugging Face model folder). A staged config (R1-Searcher) is checked one stage at a time: `--stage 1`, `--stage 2`.
`--questions` and `--steps` win over the same keys given as key=value (train.questions_per_step, train.total_steps).

Exit status: 0 when the total reward rose with its interval above 0 (`--criterion`: on the sampled scoring, the
greedy one, or both); 1 when it did not; 2 for a bad option, config, data pack or index; 128 + the signal number
when SIGTERM or Ctrl-C stopped it (the running rollout is aborted, an update in flight finishes, the actors stop:
`pipelines/graceful_stop.py`, as in `scripts.train`). The trajectories of every scoring and `result.json` land in
`runs/learning-check-<recipe>-<timestamp>/learning_check/`; `--out` writes the same JSON elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scripts.cli import announce_machine, parse_config, user_errors


def build_parser() -> argparse.ArgumentParser:
    """The check's own options (`parse_config` adds --config, key=value overrides and --verbose)."""
    from pipelines.learning_check_table import CRITERIA

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=16, help="training questions in the fixed set (default 16)")
    parser.add_argument("--steps", type=int, default=2, help="training steps (updates) on them (default 2)")
    parser.add_argument("--candidates", type=int, default=0,
                        help="choose the fixed set among this many training questions: the first --questions whose "
                             "train.select_samples samples' total rewards differ (default 0: no selection)")
    parser.add_argument("--stage", type=int, default=None,
                        help="the stage of a staged config (R1-Searcher: 1 or 2), checked alone; required there")
    parser.add_argument("--dev-questions", type=int, default=32,
                        help="dev questions scored greedy before and after, for information (default 32; 0: none)")
    parser.add_argument("--criterion", choices=CRITERIA, default="sampled",
                        help="whose total reward must rise: the sampled scoring (default), the greedy one, or both")
    parser.add_argument("--start-from", default=None, metavar="DIR",
                        help="start from this saved policy instead of the config's warm start: a run directory "
                             "(its checkpoints/warm-start) or a Hugging Face model folder")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="also write the result (table included) as JSON here")
    parser.add_argument("--no-progress", action="store_true", help="no progress output of the training loop")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point (see the module docstring); exits 0 passed, 1 failed, 2 bad input, 128 + signum stopped."""
    parser = build_parser()
    args, cfg = parse_config(parser, argv)
    from cluster.roles import ResourceFitError
    from pipelines.learning_check import check_config, run_learning_check
    from pipelines.learning_check_table import LearningCheckError, format_table
    from pipelines.train import TrainConfigError, TrainingStopped

    with user_errors():
        try:
            replaced = cfg.train.warm_start if args.start_from else None  # its questions stay out of the fixed set
            cfg = check_config(cfg, args.questions, args.steps, args.stage, args.start_from)
            announce_machine(cfg)
            result = run_learning_check(cfg, config_name=args.config, stage=args.stage,
                                        dev_questions=args.dev_questions, criterion=args.criterion,
                                        candidates=args.candidates,
                                        start_from=args.start_from, replaced_warm_start=replaced,
                                        progress=not args.no_progress)
        except (LearningCheckError, TrainConfigError, ResourceFitError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        except TrainingStopped as e:  # SIGTERM/SIGINT: the actors are stopped; nothing to resume
            print(f"learning check {e.message()}", file=sys.stderr)
            raise SystemExit(e.exit_status) from None
    stage = f", stage {result.stage}" if result.stage else ""
    print(f"\nlearning check: {result.config} ({result.recipe}{stage}; {result.algorithm})")
    print(f"start: {result.start}")
    print(f"questions: {result.selection}")
    print(f"{len(result.questions)} training questions x {result.steps} steps; sampled = {result.samples} samples at "
          f"temperature {result.temperature:g}; intervals: paired 95% bootstrap over questions\n")
    print(format_table(result.table))
    minutes = ", ".join(f"{k} {v:.1f}" for k, v in result.minutes.items() if k != "total")
    print(f"\nminutes: {result.minutes.get('total', 0.0):.1f} ({minutes})")
    print(f"run directory: {result.run_dir}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result.to_json(), indent=1))
        print(f"result: {args.out}")
    print(("PASSED: " if result.passed else "FAILED: ") + result.reason)
    raise SystemExit(0 if result.passed else 1)


if __name__ == "__main__":
    main()
