"""What `scripts.serve --checkpoint PATH` serves and with which config (no Ray, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from configs import ConfigError, load_config, save_config
from serving.checkpoint import CheckpointError, resolve_served
from serving.config import DEFAULT_CONFIG, load_serving


def fake_model(d: Path) -> Path:
    d.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (d / name).write_text("{}")
    return d


def fake_run(root: Path, steps=(4, 8), complete=(4, 8)) -> Path:
    run = root / "search_r1-20260101-000000"
    for s in steps:
        fake_model(run / "checkpoints" / f"step-{s}" / "policy" / "hf")
        if s in complete:
            (run / "checkpoints" / f"step-{s}" / "trainer_state.json").write_text(json.dumps({"step": s}))
    save_config(load_config(Path("configs/search_r1_learn_cpu.yaml")), run / "config.yaml")
    return run


def test_run_dir_serves_its_newest_complete_checkpoint(tmp_path):
    run = fake_run(tmp_path, steps=(4, 8, 12), complete=(4, 8))  # step 12 is half written
    served = resolve_served(str(run))
    assert served.step == 8 and served.model == str(run / "checkpoints/step-8/policy/hf")
    assert served.checkpoint == str(run / "checkpoints/step-8") and served.config == run / "config.yaml"
    assert served.name == f"{run.name}-step-8"
    assert resolve_served(str(run / "checkpoints" / "step-4")).step == 4


def test_model_dir_and_name(tmp_path):
    d = fake_model(tmp_path / "my-model")
    served = resolve_served(str(d))
    assert (served.model, served.step, served.config, served.name) == (str(d.resolve()), None, None, "my-model")
    served = resolve_served("gemma3-270m")
    assert (served.model, served.checkpoint, served.name) == ("gemma3-270m", None, "gemma3-270m")


def test_unservable_paths_name_the_problem(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint .*missing: does not exist"):
        resolve_served(str(tmp_path / "missing"))
    run = fake_run(tmp_path, steps=(4,), complete=())
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_served(str(run))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        resolve_served(str(tmp_path / "empty"))


def test_config_defaults_to_the_runs_own_with_overrides(tmp_path):
    run = fake_run(tmp_path)
    served, cfg = load_serving(str(run), None, ["serve.port=8123", "serve.replicas=2"])
    assert cfg.train.recipe == "search_r1" and cfg.train.recipe_options["prefill"] == "<search>"
    assert (cfg.serve.port, cfg.serve.replicas, cfg.serve.host) == (8123, 2, "127.0.0.1")
    assert cfg.serve.max_body_bytes == 65536
    _, cfg = load_serving("gemma3-270m")
    assert cfg.train.recipe == load_config(DEFAULT_CONFIG).train.recipe == "search_r1"  # the main job's loop
    assert not cfg.eval_recipe_config()["initial_search"]  # asked a question, the agent writes its own first query
    with pytest.raises(ConfigError, match="serve.max_queued_requests"):
        load_serving(str(run), None, ["serve.max_queued_requests=0"])
    with pytest.raises(ConfigError, match="serve.replica"):
        load_serving(str(run), None, ["serve.replica=2"])
