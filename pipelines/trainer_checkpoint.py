"""A trainer's checkpoints: what `Trainer.save` writes and `Trainer.resume` loads (`pipelines/checkpoints.py`
has the folder layout and the retention rule)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from pipelines.checkpoints import STATE_FILE, dir_bytes, name_best_checkpoint, prune_checkpoints

log = logging.getLogger(__name__)


def save_checkpoint(trainer: Any, step: int) -> Path:
    """Checkpoint after `step` completed steps: learners (weights, optimizer, scheduler, RNG), then
    `trainer_state.json` (written last: its presence marks a complete checkpoint), with the step's dev
    answer F1 when it was evaluated, the questions the warm start trained on (`warm_start_questions`, for
    `train/question_visits` after --resume) and, in `train.async_mode: fully`, the groups trained so far (the
    rest are generated again on --resume). Older checkpoints beyond `train.keep_checkpoints` are
    deleted, but for the best by dev F1, which keeps its Hugging Face weights (`prune_checkpoints`);
    `checkpoints/best` names the best by dev F1, the warm start included (`name_best_checkpoint`).
    The learner snapshot (`train.learner_recovery: snapshot`), older now, is removed. Returns the folder."""
    path = trainer.run_dir / "checkpoints" / f"step-{step}"
    trainer.policy.save_checkpoint(str(path))
    if trainer.critic is not None:
        trainer.critic.save_checkpoint(str(path))
    state = {"step": step, "wandb_id": trainer.tracker.wandb_id if trainer.tracker else None, "time": time.time(),
             "warm_start_questions": float(getattr(trainer, "warm_questions", 0.0))}
    dev_f1 = getattr(trainer, "dev_f1", {})
    if step in dev_f1:
        state["dev_answer_f1"] = dev_f1[step]
    if getattr(trainer, "stream", None) is not None:
        state["stream_committed"] = trainer.stream.committed()
    (path / STATE_FILE).write_text(json.dumps(state))
    if trainer.snapshot is not None:  # the checkpoint is newer: the snapshot's memory goes back
        trainer.snapshot.remove()
    for old in prune_checkpoints(trainer.run_dir, trainer.cfg.train.keep_checkpoints,
                                 trainer.cfg.train.keep_every):
        if old.is_dir():
            log.info("checkpoint %s: the best by dev F1, Hugging Face weights kept (%.2f GB)", old.name,
                     dir_bytes(old) / 1e9)
        else:
            log.info("checkpoint %s: deleted (train.keep_checkpoints)", old.name)
    log.info("checkpoint %s: %.2f GB", path.name, dir_bytes(path) / 1e9)
    best = name_best_checkpoint(trainer.run_dir)
    if best is not None:
        log.info("checkpoint best: %s (dev answer F1 %.4f)", best.name,
                 json.loads((best / STATE_FILE).read_text())["dev_answer_f1"])
    return path


def load_checkpoint(trainer: Any, checkpoint: Path) -> int:
    """Load a checkpoint into the learners and sync the policy to the workers; returns its step.
    In fully async mode the groups it trained are kept for the rollout stream (`stream_committed`).
    `trainer.warm_questions` comes back from the checkpoint (the warm start does not run again); a checkpoint
    from before it was saved keeps the count its run logged then, `train.warm_start.questions`."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    if "warm_start_questions" in state:
        trainer.warm_questions = float(state["warm_start_questions"])
    else:  # older checkpoints: the count their metrics already used, so the visits never go back
        ws = getattr(trainer.cfg.train, "warm_start", None)
        trainer.warm_questions = float(ws.questions) if ws is not None else 0.0
    trainer.stream_committed = [tuple(k) for k in state.get("stream_committed", [])]
    trainer.policy.load_checkpoint(str(checkpoint))
    if trainer.critic is not None:
        trainer.critic.load_checkpoint(str(checkpoint))
    trainer.policy.sync_weights(trainer.workers, version=int(state["step"]))
    trainer.weight_version = int(state["step"])
    return trainer.weight_version
