"""Checkpoint folders of a run: which one to resume or evaluate, and which keep their optimizer state.

`runs/<run>/checkpoints/step-<n>/` holds, per learner role, `<role>/deepspeed/` (weights, optimizer,
scheduler and RNG states: what `--resume` needs) and `<role>/hf/` (the Hugging Face weights that
vLLM, evaluation and serving load), then `trainer_state.json`, written last: its presence marks a
complete checkpoint. Only the newest `train.keep_checkpoints` keep `deepspeed/`; older saved steps
keep their `hf/` weights (for Gemma 3 270M the DeepSpeed state is ~3.5 GB a role, the weights 0.5).
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


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete the DeepSpeed state of every complete checkpoint but the newest `keep` (>= 1); their
    `<role>/hf/` weights and `trainer_state.json` (marked `"resumable": false`) stay. Returns the
    pruned checkpoints.

    Raises:
        ValueError: `keep` < 1 (the newest checkpoint is what a resume needs).
    """
    if keep < 1:
        raise ValueError(f"train.keep_checkpoints must be >= 1 (a resume needs the newest), got {keep}")
    pruned = []
    for ckpt in complete_checkpoints(run_dir)[:-keep]:
        if not is_resumable(ckpt):
            continue
        state = json.loads((ckpt / STATE_FILE).read_text())
        (ckpt / STATE_FILE).write_text(json.dumps({**state, "resumable": False}))  # first: never a half state
        for ds in ckpt.glob(f"*/{DEEPSPEED_DIR}"):
            shutil.rmtree(ds)
        pruned.append(ckpt)
    return pruned


def dir_bytes(path: str | Path) -> int:
    """Size of the files under `path` (bytes)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def save_rollouts(path: Path, trajs: Sequence[dict]) -> None:
    """One step's trajectories (with rewards) as gzip JSONL, for inspection and `--resume` checks."""
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for t in trajs:
            f.write(json.dumps(t) + "\n")
