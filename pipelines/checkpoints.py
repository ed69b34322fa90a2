"""Checkpoint folders of a run: which one to resume or evaluate, and which keep their optimizer state.

`runs/<run>/checkpoints/step-<n>/` holds, per learner role, `<role>/deepspeed/` (weights, optimizer,
scheduler and RNG states: what `--resume` needs) and `<role>/hf/` (the Hugging Face weights that
vLLM, evaluation and serving load), then `trainer_state.json`, written last: its presence marks a
complete checkpoint. The newest `train.keep_checkpoints` stay whole; of the older ones only the best
by dev answer F1 (`dev_answer_f1` in its state, when the run evaluated at a saved step) stays, with its
`hf/` weights alone; the rest are deleted, so a run's disk is bounded however long it runs (for Gemma 3
270M the DeepSpeed state is ~3.5 GB a role, the weights 0.5).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

STATE_FILE = "trainer_state.json"
DEEPSPEED_DIR = "deepspeed"


def checkpoint_step(checkpoint: Path) -> int:
    """The completed steps a checkpoint folder holds: n of `step-<n>`."""
    return int(checkpoint.name.split("-")[1])


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's complete checkpoints (with `trainer_state.json`), oldest step first."""
    done = [p for p in (Path(run_dir) / "checkpoints").glob("step-*") if (p / STATE_FILE).is_file()]
    return sorted(done, key=checkpoint_step)


def is_resumable(checkpoint: Path) -> bool:
    """True while the checkpoint still holds its DeepSpeed state (not pruned by `prune_checkpoints`)."""
    return bool(json.loads((checkpoint / STATE_FILE).read_text()).get("resumable", True))


def last_checkpoint(run_dir: str | Path, resumable: bool = True) -> Path | None:
    """The newest complete checkpoint of a run, or None; with `resumable`, the newest that `--resume`
    can continue from (its DeepSpeed state kept)."""
    found = [p for p in complete_checkpoints(run_dir) if not resumable or is_resumable(p)]
    return found[-1] if found else None


def best_checkpoint(checkpoints: Sequence[Path]) -> Path | None:
    """The checkpoint with the highest `dev_answer_f1` in its state (the newest on a tie), or None
    when none has one."""
    scored = []
    for ckpt in checkpoints:
        f1 = json.loads((ckpt / STATE_FILE).read_text()).get("dev_answer_f1")
        if f1 is not None:
            scored.append((float(f1), checkpoint_step(ckpt), ckpt))
    return max(scored)[2] if scored else None


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Keep the newest `keep` (>= 1) complete checkpoints whole and, if it is older, the best by dev
    answer F1 (`best_checkpoint`) with its `<role>/hf/` weights and `trainer_state.json` only (marked
    `"resumable": false`); delete every other complete checkpoint. Checkpoints being written (no
    state file yet) are never touched. Returns the pruned ones (deleted: no longer a directory).

    Raises:
        ValueError: `keep` < 1 (the newest checkpoint is what a resume needs).
    """
    if keep < 1:
        raise ValueError(f"train.keep_checkpoints must be >= 1 (a resume needs the newest), got {keep}")
    done = complete_checkpoints(run_dir)
    best = best_checkpoint(done)
    pruned = []
    for ckpt in done[:-keep]:
        if ckpt != best:
            (ckpt / STATE_FILE).unlink()  # first: a half-deleted folder is never taken for a checkpoint
            shutil.rmtree(ckpt)
            pruned.append(ckpt)
            continue
        if not is_resumable(ckpt):
            continue
        state = json.loads((ckpt / STATE_FILE).read_text())
        (ckpt / STATE_FILE).write_text(json.dumps({**state, "resumable": False}))  # first: never a half state
        for ds in ckpt.glob(f"*/{DEEPSPEED_DIR}"):
            shutil.rmtree(ds)
        pruned.append(ckpt)
    return pruned


def dir_bytes(path: str | Path) -> int:
    """Size of the files under `path` (bytes; links not followed, so nothing is counted twice)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file() and not f.is_symlink())


def save_rollouts(path: Path, trajs: Sequence[dict]) -> None:
    """One step's trajectories (with rewards) as gzip JSONL, for inspection and `--resume` checks."""
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for t in trajs:
            f.write(json.dumps(t) + "\n")
