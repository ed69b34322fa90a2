"""SIGTERM to a real `scripts.train` process (tiny Gemma policy on the transformers backend, the real
retrieval pool over a 2-shard index, its own Ray cluster): it stops within a bounded time, checkpoints
the last completed step, stops its cluster, prints the `--resume` command and exits 143; the resume
then finishes the run from that checkpoint. Slow: two short training processes (about 3 minutes) a mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_train import _tiny_run

REPO = Path(__file__).resolve().parents[1]


def _own_env() -> dict[str, str]:
    """This environment without the test process's Ray cluster and wandb service: a driver here starts
    its own of both (runs killed with SIGKILL would otherwise leave their wandb run open in the test
    process's service, and the resume would find its run ID "in use")."""
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_SERVICE")}


def _start_train(cfg, tmp_path: Path, new_session: bool = False) -> tuple[subprocess.Popen, Path, dict]:
    """`scripts.train` on `cfg` (written to tmp_path/config.yaml) as a child process logging to
    tmp_path/train.log; `new_session`: its own process group (to SIGKILL it with all it started)."""
    from pipelines.train import cfg_to_yaml

    config = tmp_path / "config.yaml"
    config.write_text(cfg_to_yaml(cfg))
    env, log = _own_env(), tmp_path / "train.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "scripts.train", "--config", str(config), "--no-progress"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=new_session)
    return proc, log, env


def _wait_for_step(run_root: Path, proc: subprocess.Popen, log: Path, timeout_s: float) -> Path:
    """The run directory, once its metrics.jsonl holds step 1."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = [p for p in run_root.glob("r1_searcher-*") if (p / "metrics.jsonl").is_file()]
        if runs and (runs[0] / "metrics.jsonl").read_text().strip():
            return runs[0]
        assert proc.poll() is None, f"scripts.train exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no step after {timeout_s} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.parametrize("async_mode", ["off", pytest.param("one_step", marks=pytest.mark.heavy),
                                        pytest.param("fully", marks=pytest.mark.heavy)])
def test_sigterm_checkpoints_stops_and_resumes(small_index, tiny_gemma_dir, tmp_path, async_mode):
    """In every `train.async_mode`: a rollout running ahead (one_step) or groups in flight (fully) do not
    hold the stop up, and the resumed run trains each scheduled (question, sample) once."""
    from pipelines.chaos_checks import check_run

    cfg = _tiny_run("configs/r1_searcher_cpu.yaml", small_index, tiny_gemma_dir, tmp_path / "runs",
                    "train.total_steps=40", "train.stages=[]", "train.eval_questions=0", "ray.num_cpus=4",
                    f"train.async_mode={async_mode}",
                    *(["algorithm.off_policy_correction=tis"] if async_mode != "off" else []))
    proc, log, env = _start_train(cfg, tmp_path)
    try:
        run_dir = _wait_for_step(tmp_path / "runs", proc, log, timeout_s=600)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        status = proc.wait(timeout=180)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert status == 128 + signal.SIGTERM, text[-3000:]
    assert f"resume: .venv/bin/python -m scripts.train --resume {run_dir}" in text, text[-3000:]
    from pipelines.checkpoints import last_checkpoint

    checkpoint = last_checkpoint(run_dir)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert checkpoint is not None and int(checkpoint.name.split("-")[1]) == steps[-1] < 40, (checkpoint, steps)
    print(f"stopped {stop_s:.1f} s after SIGTERM at step {steps[-1]}")

    done = steps[-1] + 1
    resumed = subprocess.run([sys.executable, "-m", "scripts.train", "--resume", str(run_dir), "--no-progress",
                              f"train.total_steps={done}"], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1] == done and last_checkpoint(run_dir).name == f"step-{done}"
    check = check_run(run_dir, cfg, done)
    assert check.ok, check


def _step_questions(run_dir: Path, step: int) -> list[str]:
    import gzip

    with gzip.open(run_dir / "rollouts" / f"step-{step}.jsonl.gz", "rt") as f:
        return list(dict.fromkeys(json.loads(line)["group_id"] for line in f))


@pytest.mark.slow
@pytest.mark.heavy
def test_sigkill_then_resume_continues_in_the_same_data_order(small_index, tiny_gemma_dir, tmp_path):
    """SIGKILL of the driver and everything it started (its process group, the local Ray cluster
    included: a lost node), then `--resume`: the run ends with every step's metrics, and each step's
    questions are the ones an uninterrupted run takes at that step (`batch_indices`)."""
    from pipelines.chaos_checks import check_run, expected_questions
    from pipelines.checkpoints import last_checkpoint

    cfg = _tiny_run("configs/r1_searcher_cpu.yaml", small_index, tiny_gemma_dir, tmp_path / "runs",
                    "train.total_steps=3", "train.stages=[]", "train.eval_questions=0", "train.save_every=1",
                    "ray.num_cpus=4")
    proc, log, env = _start_train(cfg, tmp_path, new_session=True)
    try:
        run_dir = _wait_for_step(tmp_path / "runs", proc, log, timeout_s=600)
        deadline = time.monotonic() + 300
        while last_checkpoint(run_dir) is None:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    killed_at = int(last_checkpoint(run_dir).name.split("-")[1])
    assert killed_at < 3
    resumed = subprocess.run([sys.executable, "-m", "scripts.train", "--resume", str(run_dir), "--no-progress"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = {json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()}
    assert rows == {1, 2, 3} and last_checkpoint(run_dir).name == "step-3"
    check = check_run(run_dir, cfg, 3)  # each (question, sample) once, the uninterrupted run's questions
    assert check.ok, check
    for step in (1, 2, 3):  # one rollout worker: in the uninterrupted run's order too
        assert _step_questions(run_dir, step) == expected_questions(cfg, step), step
