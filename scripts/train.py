"""Train a search agent.

    .venv/bin/python -m scripts.train --config configs/s3_cpu.yaml [key=value ...]
    .venv/bin/python -m scripts.train --resume runs/s3-20261121-120000 [key=value ...]

Starts (or joins, with `ray.address` / RAY_ADDRESS, as under `ray job submit`) a Ray cluster,
creates the actors and runs `pipelines.train`. The run directory `runs/<recipe>-<timestamp>/` gets
config.yaml (resolved), metrics.jsonl, wandb files (offline unless configured), checkpoints/step-<n>/
and reward_curves.png. `--resume RUN_DIR` (or `--resume=RUN_DIR`) continues a run from its last
checkpoint with its own config.yaml, which is never rewritten; overrides may change only the step
count, evaluation and saving cadence, logging and Ray settings (e.g. train.total_steps=40 to extend
it) and go to config.resume-<step>.yaml; any other override is refused, naming the key.

SIGTERM or Ctrl-C aborts the running step (or lets its update finish), checkpoints the last completed
step, stops the actors and exits with 128 + the signal number, printing the `--resume` command; a
second signal stops at once (`pipelines/graceful_stop.py`).
"""

from __future__ import annotations

import argparse
import sys

from scripts.cli import announce_machine, parse_config, user_errors


def main(argv: list[str] | None = None) -> None:
    """Entry point: train a search agent (or resume a run from its last checkpoint).

    Usage: .venv/bin/python -m scripts.train --config configs/s3_cpu.yaml [key=value ...]
       or: .venv/bin/python -m scripts.train --resume runs/s3-20261121-120000 [key=value ...]
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    args, cfg = parse_config(parser, argv, resume=True)
    announce_machine(cfg)
    from cluster.roles import ResourceFitError
    from pipelines.tracking import REWARD_CURVE
    from pipelines.train import TrainConfigError, TrainingStopped, train

    with user_errors():
        try:
            run_dir = train(cfg, resume=args.resume, progress=not args.no_progress)
        except (TrainConfigError, ResourceFitError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        except TrainingStopped as e:  # SIGTERM/SIGINT: actors stopped, last completed step checkpointed
            print(e.message(), file=sys.stderr)
            raise SystemExit(e.exit_status) from None
    print(f"run directory: {run_dir}")
    print(f"metrics: {run_dir / 'metrics.jsonl'}")
    print(f"reward curves: {run_dir / REWARD_CURVE}")
    wandb_dirs = sorted((run_dir / "wandb").glob("offline-run-*")) if (run_dir / "wandb").is_dir() else []
    if wandb_dirs:
        print(f"wandb (offline): {wandb_dirs[-1]}  (upload: wandb sync {wandb_dirs[-1]})")
    print(f"checkpoints: {run_dir / 'checkpoints'}")


if __name__ == "__main__":
    main()
