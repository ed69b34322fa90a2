"""What `--checkpoint PATH` names: a run directory (its newest complete checkpoint), a
`checkpoints/step-N` directory, a Hugging Face model directory, or a model name (`gemma3-270m`, a
hub name: the untrained base model). No Ray, no model loading."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipelines.checkpoints import STATE_FILE, CheckpointPathError, policy_model_dir


class CheckpointError(ValueError):
    """PATH names nothing servable; the message says what it is missing and what to pass
    (`pipelines.checkpoints.CheckpointPathError`'s)."""


@dataclass(frozen=True)
class Served:
    """The served policy. `model`: what `engine_spec` loads (a directory or a name); `checkpoint`:
    the checkpoint or model directory (None for a name); `step`: its training step (None when not a
    training checkpoint); `config`: the run's saved `config.yaml` when there is one; `name`: the
    model id of /v1/models."""

    model: str
    checkpoint: str | None
    step: int | None
    config: Path | None
    name: str


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or Path(text).expanduser().exists()


def resolve_served(path: str) -> Served:
    """The policy `path` names (see the module docstring): a model name as it is, else what
    `pipelines.checkpoints.policy_model_dir` resolves (the one reading evaluation shares), with the
    checkpoint's step, its run's `config.yaml` and a model id.

    Raises:
        CheckpointError: a path that does not exist, a run directory without a complete checkpoint,
            or a directory that is neither a checkpoint nor a Hugging Face model.
    """
    if not _looks_like_path(path):
        return Served(path, None, None, None, path)  # a model name, resolved by the engine layer
    try:
        model, ckpt = policy_model_dir(path)
    except CheckpointPathError as e:
        raise CheckpointError(str(e)) from None
    if ckpt is None:
        return Served(str(model), str(model), None, None, model.name)
    state = ckpt / STATE_FILE
    step = json.loads(state.read_text()).get("step") if state.is_file() else None
    if step is None and ckpt.name.startswith("step-") and ckpt.name[5:].isdigit():
        step = int(ckpt.name[5:])
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
    config = run / "config.yaml" if run is not None and (run / "config.yaml").is_file() else None
    name = f"{run.name}-step-{step}" if run is not None and step is not None else ckpt.name
    return Served(str(model), str(ckpt), step, config, name)
