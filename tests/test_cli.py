"""One command-line parser for every entry point: --config / --resume (both forms) / overrides /
flags in any order; a resumed run never rewrites its history; user errors come before Ray."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from configs import load_config, save_config
from scripts.cli import parse_config


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as scripts.train leaves it: config.yaml and one complete checkpoint."""
    run = tmp_path / "s3-20261123-000000"
    cfg = load_config("configs/s3_cpu.yaml", [f"index.dir={Path(__file__).parent}"])
    save_config(cfg, run / "config.yaml")
    ckpt = run / "checkpoints" / "step-3"
    (ckpt / "policy" / "deepspeed").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 3}))
    return run


def _parse(argv, **kw):
    parser = argparse.ArgumentParser()
    parser.add_argument("--flag", action="store_true")
    return parse_config(parser, argv, **kw)


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_resume_reads_the_run_s_own_config_in_both_forms(run_dir, form):
    argv = ["--resume", str(run_dir)] if form == "separate" else [f"--resume={run_dir}"]
    args, cfg = _parse(["train.total_steps=9", *argv, "--flag"], resume=True)
    saved = load_config(run_dir / "config.yaml")
    assert cfg.train.recipe == "s3" and cfg.train.total_steps == 9 and args.flag
    assert cfg.model_copy(update={"train": cfg.train.model_copy(update={"total_steps": 5})}) == saved
    assert args.resume_changes == {"train.total_steps": (5, 9)} and args.config is None


@pytest.mark.parametrize("override, key", [
    ("train.recipe=search_r1", "train.recipe"), ("learner.model=other", "learner.model"),
    ("data.train=other.jsonl.gz", "data.train"), ("algorithm.advantage_estimator=grpo", "algorithm.advantage_estimator"),
])
def test_resume_refuses_overrides_that_change_what_the_run_is(run_dir, capsys, override, key):
    with pytest.raises(SystemExit) as e:
        _parse(["--resume", str(run_dir), override], resume=True)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{key}:" in err and "a resumed run keeps what it is" in err


def test_resume_with_config_is_an_error(run_dir, capsys):
    with pytest.raises(SystemExit):
        _parse(["--config", "configs/s3_cpu.yaml", "--resume", str(run_dir)], resume=True)
    assert "drop --config" in capsys.readouterr().err


def test_resume_leaves_the_saved_config_and_records_changes(run_dir):
    from pipelines.train import resume_checkpoint

    before = (run_dir / "config.yaml").read_bytes()
    _, cfg = _parse([f"--resume={run_dir}", "train.total_steps=12", "train.wandb.mode=disabled"], resume=True)
    assert resume_checkpoint(run_dir, cfg).name == "step-3"
    assert (run_dir / "config.yaml").read_bytes() == before
    recorded = load_config(run_dir / "config.resume-3.yaml")
    assert recorded.train.total_steps == 12 and recorded.train.wandb.mode == "disabled"
    from configs import ConfigError

    with pytest.raises(ConfigError, match="train.questions_per_step"):  # programmatic callers are checked too
        resume_checkpoint(run_dir, cfg.model_copy(update={"train": cfg.train.model_copy(update={"questions_per_step": 7})}))


def test_config_defaults_to_the_entry_point_s_default():
    args, cfg = _parse(["retrieval.topk=4"], default_config="configs/s3_cpu.yaml")
    assert args.config == "configs/s3_cpu.yaml" and cfg.train.recipe == "s3" and cfg.retrieval.topk == 4


@pytest.mark.parametrize("module", ["scripts.main", "scripts.train"])
def test_missing_data_pack_is_reported_before_ray_starts(module, monkeypatch, capsys, tmp_path):
    import importlib

    import cluster.ray_init

    def no_ray(*a, **k):
        raise AssertionError("Ray was started before the data pack was checked")

    monkeypatch.setattr(cluster.ray_init, "init_ray", no_ray)
    monkeypatch.delenv("SEARCHRL_DATA", raising=False)
    entry = importlib.import_module(module)
    with pytest.raises(SystemExit) as e:
        entry.main(["--config", "configs/s3_cpu.yaml", f"data.dir={tmp_path / 'nope'}",
                    f"index.dir={Path(__file__).parent}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: data dir") and "is not a directory" in err


def test_main_refuses_a_trained_row_without_a_checkpoint(monkeypatch, capsys, tmp_path, data_dir):
    """With no checkpoint, `evaluate` would score `learner.model` as the trained searcher: the
    "trained" row would be the untrained model. The main job stops with an error instead."""
    from types import SimpleNamespace

    import cluster.ray_init
    import pipelines.build_index
    import pipelines.evaluate
    import pipelines.train
    import scripts.main

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    monkeypatch.setattr(cluster.ray_init, "init_ray", lambda *a, **k: False)
    monkeypatch.setattr(pipelines.build_index, "ensure_index", lambda cfg, progress=True: SimpleNamespace(num_docs=1))
    monkeypatch.setattr(pipelines.train, "train", lambda cfg, resume=None: run_dir)

    def no_eval(*a, **k):
        raise AssertionError("evaluated a trained row without a checkpoint")

    monkeypatch.setattr(pipelines.evaluate, "evaluate", no_eval)
    code = scripts.main.main([f"data.dir={data_dir}"])
    assert code == 1 and "training left no checkpoint" in capsys.readouterr().err


def test_main_stopped_during_the_evaluation_says_how_to_evaluate_the_run(monkeypatch, capsys, tmp_path, data_dir):
    """A SIGTERM (KeyboardInterrupt via scripts.cli) after training used to print "the index build resumes":
    the message names the finished run and the scripts.evaluate command that completes its evaluation."""
    from types import SimpleNamespace

    import cluster.ray_init
    import pipelines.build_index
    import pipelines.checkpoints
    import pipelines.evaluate
    import pipelines.train
    import scripts.main

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-1").mkdir(parents=True)
    monkeypatch.setattr(cluster.ray_init, "init_ray", lambda *a, **k: False)
    monkeypatch.setattr(pipelines.build_index, "ensure_index", lambda cfg, progress=True: SimpleNamespace(num_docs=1))
    monkeypatch.setattr(pipelines.train, "train", lambda cfg, resume=None: run_dir)
    monkeypatch.setattr(pipelines.checkpoints, "last_checkpoint", lambda *a, **k: run_dir / "checkpoints" / "step-1")

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipelines.evaluate, "evaluate", stopped)
    code = scripts.main.main([f"data.dir={data_dir}", "--eval-limit", "32"])
    err = capsys.readouterr().err
    assert code == 130 and "index build" not in err
    assert f"checkpointed in {run_dir}" in err
    assert (f"scripts.evaluate --config {run_dir}/config.yaml --checkpoint {run_dir / 'checkpoints' / 'step-1'} "
            "--qa test.jsonl.gz --limit 32") in err


def test_main_evaluates_the_checkpoint_its_dev_evaluation_chose(monkeypatch, capsys, tmp_path, data_dir):
    """`checkpoints/best` names the warm start (RL lowered dev F1): the test rows are the warm start's, not the
    newest step's, and the summary says which step they are."""
    import json
    from types import SimpleNamespace

    import cluster.ray_init
    import pipelines.build_index
    import pipelines.evaluate
    import pipelines.train
    import scripts.main
    from pipelines.checkpoints import name_best_checkpoint

    run_dir = tmp_path / "run"
    for name, f1 in (("warm-start", 0.25), ("step-8", 0.20)):
        (run_dir / "checkpoints" / name / "policy" / "hf").mkdir(parents=True)
        (run_dir / "checkpoints" / name / "trainer_state.json").write_text(json.dumps({"dev_answer_f1": f1}))
    name_best_checkpoint(run_dir)
    (run_dir / "metrics.jsonl").write_text("")
    evaluated = []
    monkeypatch.setattr(cluster.ray_init, "init_ray", lambda *a, **k: False)
    monkeypatch.setattr(pipelines.build_index, "ensure_index", lambda cfg, progress=True: SimpleNamespace(num_docs=1))
    monkeypatch.setattr(pipelines.train, "train", lambda cfg, resume=None: run_dir)

    def fake_eval(cfg, qa, out, checkpoint, **kwargs):
        evaluated.append(checkpoint)
        out.mkdir(parents=True)
        (out / "results.md").write_text("| method |\n")

    monkeypatch.setattr(pipelines.evaluate, "evaluate", fake_eval)
    assert scripts.main.main([f"data.dir={data_dir}", "--eval-limit", "8"]) == 0
    assert evaluated == [(run_dir / "checkpoints" / "warm-start").resolve()]
    assert "the trained row is the warm start (step 0), the best by dev F1 (0.250)" in capsys.readouterr().out


def test_main_stopped_before_training_ends_says_the_index_build_resumes(monkeypatch, capsys, data_dir):
    import cluster.ray_init
    import pipelines.build_index
    import scripts.main

    def stopped(cfg, progress=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster.ray_init, "init_ray", lambda *a, **k: False)
    monkeypatch.setattr(pipelines.build_index, "ensure_index", stopped)
    assert scripts.main.main([f"data.dir={data_dir}"]) == 130
    assert "the index build resumes" in capsys.readouterr().err
