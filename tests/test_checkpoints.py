"""Checkpoint retention: the newest checkpoints stay whole, the best older one by dev F1 keeps its weights, the
rest go."""

from __future__ import annotations

import json

import pytest

from pipelines.checkpoints import (
    best_checkpoint,
    complete_checkpoints,
    dir_bytes,
    is_resumable,
    last_checkpoint,
    name_best_checkpoint,
    policy_model_dir,
    prune_checkpoints,
    record_warm_start_dev,
)


def _checkpoint(run, step: int, complete: bool = True, dev_f1: float | None = None):
    path = run / "checkpoints" / f"step-{step}"
    for role in ("policy", "critic"):
        (path / role / "deepspeed" / "state").mkdir(parents=True)
        (path / role / "deepspeed" / "state" / "optim.pt").write_bytes(b"x" * 1000)
        (path / role / "hf").mkdir()
        (path / role / "hf" / "model.safetensors").write_bytes(b"w" * 100)
    if complete:
        state = {"step": step} if dev_f1 is None else {"step": step, "dev_answer_f1": dev_f1}
        (path / "trainer_state.json").write_text(json.dumps(state))
    return path


def test_prune_keeps_the_newest_whole_and_deletes_the_rest(tmp_path):
    for step in (10, 2, 5):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 20, complete=False)  # being written: never touched
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-2", "step-5", "step-10"]
    pruned = prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in pruned] == ["step-2", "step-5"] and not any(p.exists() for p in pruned)
    assert is_resumable(tmp_path / "checkpoints" / "step-10")
    assert (tmp_path / "checkpoints" / "step-20" / "policy" / "deepspeed").is_dir()
    assert last_checkpoint(tmp_path).name == "step-10"
    assert prune_checkpoints(tmp_path, keep=1) == []  # idempotent


def test_prune_keeps_the_best_older_checkpoints_weights(tmp_path):
    _checkpoint(tmp_path, 10, dev_f1=0.20)
    _checkpoint(tmp_path, 20, dev_f1=0.35)  # the best
    _checkpoint(tmp_path, 30, dev_f1=0.25)
    _checkpoint(tmp_path, 40)  # not evaluated at this step
    _checkpoint(tmp_path, 50, dev_f1=0.30)
    assert best_checkpoint(complete_checkpoints(tmp_path)).name == "step-20"
    pruned = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in pruned] == ["step-10", "step-20", "step-30"]
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-20", "step-40", "step-50"]
    best = tmp_path / "checkpoints" / "step-20"
    assert not is_resumable(best) and not list(best.glob("*/deepspeed"))
    assert dir_bytes(best) == 200 + len((best / "trainer_state.json").read_bytes())  # the two hf folders stay
    assert last_checkpoint(tmp_path).name == "step-50" and last_checkpoint(tmp_path, resumable=False).name == "step-50"
    # A newer best: the old best goes; disk stays at keep + 1 checkpoints however long the run.
    _checkpoint(tmp_path, 60, dev_f1=0.40)
    prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-50", "step-60"]
    assert best_checkpoint([]) is None


def test_keep_every_keeps_those_steps_whole_for_replays(tmp_path):
    """`train.keep_every`: the multiples stay whole (resumable, DeepSpeed state kept) past `keep`; the rest of the
    older ones go as before, and a keep_every that no saved step is a multiple of is refused in the config."""
    for step in (2, 4, 6, 8, 10):
        _checkpoint(tmp_path, step)
    pruned = prune_checkpoints(tmp_path, keep=1, keep_every=4)
    assert sorted(p.name for p in pruned) == ["step-2", "step-6"]
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-4", "step-8", "step-10"]
    assert all(is_resumable(p) and list(p.glob("*/deepspeed")) for p in complete_checkpoints(tmp_path))
    assert last_checkpoint(tmp_path).name == "step-10"
    assert [p.name for p in prune_checkpoints(tmp_path, keep=1)] == ["step-4", "step-8"]  # 0: the old rule
    from configs.schema import TrainConfig

    assert TrainConfig(save_every=2, keep_every=4).keep_every == 4
    with pytest.raises(ValueError, match="keep_every to a multiple of save_every"):
        TrainConfig(save_every=4, keep_every=6)


def test_last_checkpoint_skips_pruned_ones_for_resume(tmp_path):
    assert last_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, 1)
    _checkpoint(tmp_path, 2)
    assert prune_checkpoints(tmp_path, keep=2) == []
    assert all(is_resumable(p) for p in complete_checkpoints(tmp_path))
    state = tmp_path / "checkpoints" / "step-2" / "trainer_state.json"
    state.write_text(json.dumps({"step": 2, "resumable": False}))  # e.g. pruned by a later run's setting
    assert last_checkpoint(tmp_path).name == "step-1"
    assert last_checkpoint(tmp_path, resumable=False).name == "step-2"
    with pytest.raises(ValueError, match="keep_checkpoints must be >= 1"):
        prune_checkpoints(tmp_path, keep=0)


def _warm_start(run):
    hf = run / "checkpoints" / "warm-start" / "policy" / "hf"
    hf.mkdir(parents=True)
    for name, text in (("config.json", "{}"), ("model.safetensors", "w"), ("tokenizer.json", "{}")):
        (hf / name).write_text(text)
    return hf


def test_best_names_the_best_by_dev_f1_with_the_warm_start_weighed_in(tmp_path):
    """`checkpoints/best` follows the best dev F1 through pruning; the warm start is a candidate once its
    dev F1 is recorded, and loses a tie to a later step (the newest on a tie)."""
    best = tmp_path / "checkpoints" / "best"
    _checkpoint(tmp_path, 5)  # no dev F1 anywhere: no link
    assert name_best_checkpoint(tmp_path) is None and not best.is_symlink()
    with pytest.raises(FileNotFoundError, match="no warm-started policy"):
        record_warm_start_dev(tmp_path, 0.3)
    _warm_start(tmp_path)
    record_warm_start_dev(tmp_path, 0.30)
    assert name_best_checkpoint(tmp_path).name == "warm-start"
    assert best.is_symlink() and best.readlink().name == "warm-start"  # relative: the run can move
    assert policy_model_dir(best)[0] == (tmp_path / "checkpoints" / "warm-start" / "policy" / "hf").resolve()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-5"]  # never resumed from or pruned
    _checkpoint(tmp_path, 10, dev_f1=0.25)
    assert name_best_checkpoint(tmp_path).name == "warm-start"  # RL below the warm start: it stays the best
    _checkpoint(tmp_path, 20, dev_f1=0.30)
    assert name_best_checkpoint(tmp_path).name == "step-20"  # a tie: the later one
    _checkpoint(tmp_path, 30, dev_f1=0.10)
    _checkpoint(tmp_path, 40, dev_f1=0.20)
    prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-20", "step-40"]
    assert name_best_checkpoint(tmp_path).name == "step-20" and (best / "policy" / "hf").is_dir()
    assert not (tmp_path / "checkpoints" / ".best.tmp").exists()
