"""Chaos run: a short real training run that survives SIGKILLed actors and a SIGKILLed driver.

    .venv/bin/python -m scripts.ops.chaos [--config configs/s3_cpu.yaml] [--steps 6] [key=value ...]

It starts its own one-node Ray cluster (`cluster.local_cluster.LocalCluster`: `ray start --head
--block`, its own temp dir, ports and auth token), runs `scripts.train` as a separate driver process
on it (s3 recipe, GRPO, 2 questions x 2 samples per step, a checkpoint every step) and, from this
process, SIGKILLs actor processes in the middle of steps (found by class in Ray's state API, killed
by PID):

- during step 2: one retrieval shard (`ShardSearcher`) and one rollout worker (`RolloutWorker`);
- during step 3: one frozen LLM (`FrozenLLMWorker`);
- during step 4: one learner rank (`PolicyLearner`);
- after step 4's checkpoint: the driver itself, then `scripts.train --resume` finishes the run.

Then it checks every step's saved trajectories: each (question, sample) pair exactly once and the
questions an uninterrupted run takes at that step (`pipelines.chaos_checks`), and prints

    chaos: steps=6 kills=shard:1,rollout:1,frozen:1,learner:1,driver:1 lost=0 duplicated=0 resumed_same_order=true seconds=…

Exit status 0 when every kill happened and every check passed, 1 otherwise, 2 for a bad config. The
driver builds the config's index first when it is missing (resuming). SIGTERM or
Ctrl-C stops the driver and the Ray cluster it started; a failed run keeps the cluster's logs in
`<work-dir>/ray-logs`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KILLS = (  # (step during which to kill, label, actor class)
    (2, "shard", "ShardSearcher"), (2, "rollout", "RolloutWorker"), (3, "frozen", "FrozenLLMWorker"),
    (4, "learner", "PolicyLearner"),
)
CHAOS_OVERRIDES = (  # small steps; GRPO (no critic) keeps the learner to one model on 2 cores
    "algorithm.advantage_estimator=grpo", "algorithm.kl_coef=0.0", "train.questions_per_step=2",
    "rollout.samples_per_prompt=2", "learner.mini_batch_size=4", "rollout.max_new_tokens_per_turn=64",
    "train.eval_questions=0", "train.eval_every=0", "train.save_every=1", "train.keep_checkpoints=1",
    "train.stages=[]", "train.wandb.mode=disabled", "train.select_questions=0", "train.warm_start=null",
)


def _wait(condition, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: its process exited with status {proc.returncode} (see the logs in the work dir)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(0.5)


def _kill_actor(cluster, class_name: str) -> bool:
    """SIGKILL the process of one live actor of `class_name` (the cluster's state API finds it; all
    its nodes are on this machine); True when one was."""
    for actor in cluster.list_actors():
        if actor.get("class_name") == class_name and actor.get("state") == "ALIVE" and actor.get("pid"):
            os.kill(int(actor["pid"]), signal.SIGKILL)
            return True
    return False


def _driver(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen([sys.executable, "-m", "scripts.train", "--no-progress", *args], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the chaos schedule; returns the exit status (see the module docstring)."""
    from scripts.cli import parse_config, user_errors

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="training steps (at least 5: the schedule needs 4+1)")
    parser.add_argument("--work-dir", default=None, help="run and Ray folders (default: a new temp folder)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args, cfg = parse_config(parser, [*CHAOS_OVERRIDES, f"train.total_steps={max(5, args_steps(argv))}", *argv],
                             default_config=str(REPO / "configs" / "s3_cpu.yaml"))
    from pipelines.chaos_checks import check_run
    from pipelines.train import cfg_to_yaml, validate

    with user_errors():
        cfg = validate(cfg, need_index=False)  # the driver (scripts.train) builds a missing index first
    steps = cfg.train.total_steps
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="searchrl-chaos-")).resolve()
    (work / "runs").mkdir(parents=True, exist_ok=True)
    cfg = cfg.model_copy(update={"run_dir": str(work / "runs")})
    config = work / "config.yaml"
    config.write_text(cfg_to_yaml(cfg))
    from cluster.local_cluster import LocalCluster, NodeSpec

    log, cluster = work / "driver.log", LocalCluster(NodeSpec(num_cpus=cfg.ray.num_cpus or 8,
                                                              object_store_bytes=4 * 2**30), cwd=REPO)
    driver, done, ok = None, {}, False
    t0 = time.monotonic()
    try:
        cluster.start()
        env = {**cluster.env(), "RAY_ADDRESS": cluster.gcs_address}
        driver = _driver(["--config", str(config)], env, log)
        _wait(lambda: any((work / "runs").iterdir()), 600, "run directory", driver)
        run_dir = next((work / "runs").iterdir())
        for step, label, cls in KILLS:
            _wait(lambda s=step: _checkpointed(run_dir, s - 1), 1800, f"checkpoint of step {step - 1}", driver)
            time.sleep(3)  # into the rollout phase of `step`
            if _kill_actor(cluster, cls):
                done[label] = done.get(label, 0) + 1
                print(f"chaos: killed a {cls} during step {step}", flush=True)
        _wait(lambda: _checkpointed(run_dir, 4), 1800, "checkpoint of step 4", driver)
        _stop(driver, signal.SIGKILL)  # the driver and nothing else: its actors die with it (owner gone)
        done["driver"] = 1
        print("chaos: killed the driver after step 4; resuming", flush=True)
        driver = _driver(["--resume", str(run_dir)], env, log)
        status = driver.wait(timeout=3600)
        if status != 0:
            print(f"chaos: the resumed driver exited with status {status}; see {log}", file=sys.stderr)
            return 1
        check = check_run(run_dir, cfg, steps)
        ok = True
    except KeyboardInterrupt:
        print("chaos: interrupted; stopping the driver and the Ray cluster", file=sys.stderr)
        return 130
    finally:
        _stop(driver)
        if not ok:
            print(f"chaos: Ray logs kept in {cluster.keep_logs(work / 'ray-logs')}", file=sys.stderr)
        cluster.stop()
    kills = ",".join(f"{label}:{done.get(label, 0)}" for label in ("shard", "rollout", "frozen", "learner", "driver"))
    print(f"chaos: steps={steps} kills={kills} lost={check.lost} duplicated={check.duplicated} "
          f"resumed_same_order={str(check.same_order).lower()} seconds={time.monotonic() - t0:.0f}")
    print("chaos: faults " + " ".join(f"{k.split('/')[1]}={v:g}" for k, v in sorted(check.faults.items())))
    if check.missing_steps:
        print(f"chaos: steps without metrics or trajectories: {check.missing_steps}", file=sys.stderr)
    all_kills = all(done.get(label, 0) == 1 for label in ("shard", "rollout", "frozen", "learner", "driver"))
    return 0 if check.ok and all_kills else 1


def args_steps(argv: list[str]) -> int:
    """`--steps N` from `argv` (before parsing: it sets train.total_steps), default 6."""
    for i, a in enumerate(argv):
        if a == "--steps" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--steps="):
            return int(a.split("=", 1)[1])
    return 6


def _checkpointed(run_dir: Path, step: int) -> bool:
    from pipelines.checkpoints import checkpoint_step, last_checkpoint

    ckpt = last_checkpoint(run_dir)
    return ckpt is not None and checkpoint_step(ckpt) >= step


if __name__ == "__main__":
    sys.exit(main())
