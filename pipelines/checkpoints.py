"""Checkpoint folders of a run: which one to resume or evaluate, and which keep their optimizer state.

`runs/<run>/checkpoints/step-<n>/` holds, per learner role, `<role>/deepspeed/` (weights, optimizer,
scheduler and RNG states: what `--resume` needs) and `<role>/hf/` (the Hugging Face weights that
vLLM, evaluation and serving load), then `trainer_state.json`, written last: its presence marks a
complete checkpoint. The newest `train.keep_checkpoints` stay whole, and so does every `train.keep_every`-th
step's; of the older ones only the best by dev answer F1 (`dev_answer_f1` in its state, when the run evaluated
at a saved step) stays, with its `hf/` weights alone; the rest are deleted, so a run's disk is bounded however
long it runs (for Gemma 3 270M the DeepSpeed state is ~3.5 GB a role, the weights 0.5).

A run with `train.warm_start` also has `checkpoints/warm-start/` (the warm-started policy's `policy/hf/`,
not resumable; its `trainer_state.json` holds its dev answer F1 once evaluated). `checkpoints/best` is a
link to the best of all of them by dev answer F1, the warm start included (held-out early stopping):
`scripts.evaluate --checkpoint runs/<run>/checkpoints/best` evaluates it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

_WEIGHTS = ("*.safetensors", "*.bin")
_TOKENIZER = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")

STATE_FILE = "trainer_state.json"
DEEPSPEED_DIR = "deepspeed"
WARM_START_NAME = "warm-start"
"""The warm-started policy's folder under `<run>/checkpoints/` (it comes before step 1)."""
BEST_NAME = "best"
"""The link under `<run>/checkpoints/` to the best checkpoint by dev answer F1 (`name_best_checkpoint`)."""


def checkpoint_step(checkpoint: Path) -> int:
    """The completed steps a checkpoint folder holds: n of `step-<n>`; 0 for the warm start's folder."""
    if checkpoint.name == WARM_START_NAME:
        return 0
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
    """The checkpoint with the highest `dev_answer_f1` in its state (the newest on a tie; the warm start
    counts as step 0, before step 1), or None when none has one."""
    scored = []
    for ckpt in checkpoints:
        f1 = json.loads((ckpt / STATE_FILE).read_text()).get("dev_answer_f1")
        if f1 is not None:
            scored.append((float(f1), checkpoint_step(ckpt), ckpt.name != WARM_START_NAME, ckpt))
    return max(scored)[3] if scored else None


def name_best_checkpoint(run_dir: str | Path) -> Path | None:
    """Point `<run>/checkpoints/best` at the best checkpoint by dev answer F1 (`best_checkpoint`) of the
    run's complete `step-<n>` checkpoints and its warm start (when its state holds a dev F1): a relative
    link, replaced atomically, so a reader never finds it half made. Returns the checkpoint it names, or
    None (and no link) when none has a dev F1."""
    root = Path(run_dir) / "checkpoints"
    candidates = complete_checkpoints(run_dir)
    warm = root / WARM_START_NAME
    if (warm / STATE_FILE).is_file():
        candidates = [warm, *candidates]
    best = best_checkpoint(candidates)
    link = root / BEST_NAME
    if best is None:
        if link.is_symlink():
            link.unlink()
        return None
    tmp = root / f".{BEST_NAME}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(best.name, target_is_directory=True)
    os.replace(tmp, link)
    return best


def record_warm_start_dev(run_dir: str | Path, dev_answer_f1: float) -> Path:
    """Write the warm start's `trainer_state.json` (step 0, not resumable, its dev answer F1) into
    `<run>/checkpoints/warm-start/`, so `name_best_checkpoint` weighs it against the RL checkpoints.

    Raises:
        FileNotFoundError: the run has no warm-started policy (`policy/hf/`) to describe.
    """
    warm = Path(run_dir) / "checkpoints" / WARM_START_NAME
    if not (warm / "policy" / "hf").is_dir():
        raise FileNotFoundError(f"{warm / 'policy' / 'hf'}: no warm-started policy to record a dev F1 for")
    (warm / STATE_FILE).write_text(json.dumps({"step": 0, "warm_start": True, "resumable": False,
                                               "dev_answer_f1": float(dev_answer_f1)}))
    return warm


def prune_checkpoints(run_dir: str | Path, keep: int, keep_every: int = 0) -> list[Path]:
    """Keep the newest `keep` (>= 1) complete checkpoints whole, every one whose step is a multiple of
    `keep_every` (> 0) whole too (`train.keep_every`: for update replays), and, if it is older, the best by
    dev answer F1 (`best_checkpoint`) with its `<role>/hf/` weights and `trainer_state.json` only (marked
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
        if keep_every > 0 and checkpoint_step(ckpt) % keep_every == 0:
            continue
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


# ----------------------------------------------------------------------------- what a --checkpoint path names


class CheckpointPathError(ValueError):
    """A path that names no policy model; the message starts "checkpoint PATH:" and says what to pass."""


def model_dir_problem(d: Path) -> str | None:
    """What `d` lacks to be a Hugging Face model directory (config.json, weights, tokenizer), or None."""
    if not d.is_dir():
        return "not a directory"
    missing = []
    if not (d / "config.json").is_file():
        missing.append("config.json")
    if not any(next(d.glob(p), None) for p in _WEIGHTS):
        missing.append("weights (*.safetensors)")
    if not any((d / t).is_file() for t in _TOKENIZER):
        missing.append("a tokenizer (tokenizer.json / tokenizer_config.json)")
    return f"no {', '.join(missing)}" if missing else None


def policy_model_dir(path: str | Path) -> tuple[Path, Path | None]:
    """The one way evaluation and serving read a checkpoint path: (the policy's Hugging Face model directory,
    the checkpoint folder it came from or None for a bare model directory), both absolute.

    `path`: a run directory (its newest complete checkpoint, resumable or not: the best by dev F1 keeps its
    weights), a checkpoint folder the learner wrote (`<ckpt>/policy/hf`) or a Hugging Face model directory.

    Raises:
        CheckpointPathError: the path does not exist, a run directory holds no complete checkpoint, or neither
            `<path>/policy/hf` nor `<path>` is a model directory (the message names what is missing).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointPathError(f"checkpoint {p}: does not exist; pass a run directory, a checkpoint directory "
                                  f"written by the learner (it holds policy/hf/) or a Hugging Face model directory")
    if (p / "checkpoints").is_dir():  # a run directory: its newest checkpoint
        newest = last_checkpoint(p, resumable=False)
        if newest is None:
            raise CheckpointPathError(f"checkpoint {p}: a run directory with no complete checkpoint under "
                                      f"{p / 'checkpoints'} (each needs {STATE_FILE}); train it further or pass a "
                                      "model directory")
        p = Path(newest)
    hf = p / "policy" / "hf"
    if model_dir_problem(hf) is None:
        return hf.resolve(), p.resolve()
    if model_dir_problem(p) is None:
        return p.resolve(), None
    raise CheckpointPathError(
        f"checkpoint {p}: not a checkpoint ({hf}: {model_dir_problem(hf)}) and not a Hugging Face model "
        f"directory ({p}: {model_dir_problem(p)}); pass the directory the learner's save_checkpoint wrote "
        f"or a model directory with config.json, *.safetensors and the tokenizer")
