"""What `--checkpoint PATH` names: a run directory (its newest complete checkpoint), a
`checkpoints/step-N` directory, a Hugging Face model directory, or a model name (`gemma3-270m`, a
hub name: the untrained base model). No Ray, no model loading."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipelines.checkpoints import STATE_FILE, last_checkpoint
from pipelines.evaluate import EvaluationError, resolve_checkpoint


class CheckpointError(ValueError):
    """PATH names nothing servable; the message says what it is missing and what to pass."""


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


def _step_dir(step_dir: Path) -> Served:
    """A `checkpoints/step-N` directory (its `policy/hf` weights) of a run."""
    try:
        model = resolve_checkpoint(step_dir)
    except EvaluationError as e:
        raise CheckpointError(str(e).replace("--checkpoint", "checkpoint")) from None
    state = step_dir / STATE_FILE
    step = json.loads(state.read_text()).get("step") if state.is_file() else None
    if step is None and step_dir.name.startswith("step-") and step_dir.name[5:].isdigit():
        step = int(step_dir.name[5:])
    run = step_dir.parent.parent if step_dir.parent.name == "checkpoints" else None
    config = run / "config.yaml" if run is not None and (run / "config.yaml").is_file() else None
    name = f"{run.name}-step-{step}" if run is not None and step is not None else step_dir.name
    return Served(model, str(step_dir.resolve()), step, config, name)


def resolve_served(path: str) -> Served:
    """The policy `path` names (see the module docstring).

    Raises:
        CheckpointError: a path that does not exist, a run directory without a complete checkpoint,
            or a directory that is neither a checkpoint nor a Hugging Face model.
    """
    if not _looks_like_path(path):
        return Served(path, None, None, None, path)  # a model name, resolved by the engine layer
    p = Path(path).expanduser()
    if not p.is_dir():
        raise CheckpointError(f"checkpoint {p}: no such directory; pass a run directory, a checkpoints/step-N "
                              f"directory, a Hugging Face model directory or a model name such as gemma3-270m")
    if (p / "checkpoints").is_dir():
        newest = last_checkpoint(p, resumable=False)
        if newest is None:
            raise CheckpointError(f"checkpoint {p}: a run directory with no complete checkpoint under "
                                  f"{p / 'checkpoints'} (each needs {STATE_FILE}); train longer or pass a model")
        return _step_dir(newest)
    if (p / STATE_FILE).is_file() or (p / "policy").is_dir():
        return _step_dir(p)
    try:
        model = resolve_checkpoint(p)
    except EvaluationError as e:
        raise CheckpointError(str(e).replace("--checkpoint", "checkpoint")) from None
    return Served(model, model, None, None, p.resolve().name)
