"""Checkpoint retention: only the newest checkpoints keep the DeepSpeed state a resume needs."""

from __future__ import annotations

import json

import pytest

from pipelines.checkpoints import complete_checkpoints, dir_bytes, is_resumable, last_checkpoint, prune_checkpoints


def _checkpoint(run, step: int, complete: bool = True):
    path = run / "checkpoints" / f"step-{step}"
    for role in ("policy", "critic"):
        (path / role / "deepspeed" / "state").mkdir(parents=True)
        (path / role / "deepspeed" / "state" / "optim.pt").write_bytes(b"x" * 1000)
        (path / role / "hf").mkdir()
        (path / role / "hf" / "model.safetensors").write_bytes(b"w" * 100)
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"step": step}))
    return path


def test_prune_keeps_the_newest_resumable_and_every_hf_folder(tmp_path):
    for step in (10, 2, 5):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 20, complete=False)  # being written: never touched
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-2", "step-5", "step-10"]
    pruned = prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in pruned] == ["step-2", "step-5"]
    for p in pruned:
        assert not is_resumable(p) and not list(p.glob("*/deepspeed"))
        assert dir_bytes(p) == 200 + len((p / "trainer_state.json").read_bytes())  # the two hf folders stay
    assert is_resumable(tmp_path / "checkpoints" / "step-10")
    assert (tmp_path / "checkpoints" / "step-20" / "policy" / "deepspeed").is_dir()
    assert last_checkpoint(tmp_path).name == "step-10"
    assert prune_checkpoints(tmp_path, keep=1) == []  # idempotent


def test_last_checkpoint_skips_pruned_ones_for_resume(tmp_path):
    assert last_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, 1)
    _checkpoint(tmp_path, 2)
    prune_checkpoints(tmp_path, keep=2)
    assert all(is_resumable(p) for p in complete_checkpoints(tmp_path))
    state = tmp_path / "checkpoints" / "step-2" / "trainer_state.json"
    state.write_text(json.dumps({"step": 2, "resumable": False}))  # e.g. pruned by a later run's setting
    assert last_checkpoint(tmp_path).name == "step-1"
    assert last_checkpoint(tmp_path, resumable=False).name == "step-2"
    with pytest.raises(ValueError, match="keep_checkpoints must be >= 1"):
        prune_checkpoints(tmp_path, keep=0)
