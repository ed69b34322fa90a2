"""Side by side with TRL: the same GRPO run under searchrl and under TRL's GRPOTrainer, on this machine.

Both workloads train Gemma 3 270M with 8 samples per question, no KL, and the same questions, learning
rate, AdamW betas, weight decay, precision, temperature and token limits; the reward is the recipe's
own (`recipes/`), the answer's token F1.
- `single_turn` (`configs/peer_single_turn_cpu.yaml`): the naive-RAG answerer as the policy: the
  question's BM25 top-3 in the s3 Fig. 12 answer prompt, one answer turn.
- `multi_turn` (`configs/peer_multi_turn_cpu.yaml`): Search-R1's loop, `<search>` → `<information>`
  → `<answer>`, at most 2 searches and a forced answer turn, observation tokens out of the loss.
  TRL's `tools=`/`environment_factory=` cannot run it with a base model (no chat template; see
  `scripts/peer/trl_search.py` for TRL's exact error), so TRL runs it through its `rollout_func` hook
  with `env_mask`, searching the project's `/retrieve` (`scripts.serve_retrieval`, started here on
  127.0.0.1 over the same BM25 index).

searchrl runs first (`scripts.train`); its rollouts give TRL the very same questions in the same order.
Then TRL runs in its own virtual environment, never `.venv` and never in CI (`scripts/peer/trl_runner.py`):

    python3.11 -m venv .venv-trl && .venv-trl/bin/pip install -c constraints-cpu.txt -r requirements-trl.txt

Prints one line per workload,
`peer: workload=... trl_s_per_step=... ours_s_per_step=... speedup=... trl_reward=first3->last3
ours_reward=first3->last3 tokens_per_step=... trl_tokens_per_step=... speedup_per_token=...`
(seconds per step: the median over steps 2 to N; tokens: the policy's, mean over the steps), each
framework's step split into phases, and the reward curves' step-to-step spread; writes
`<out>/<workload>/peer_rewards.png` and `<out>/<workload>/peer.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from scripts.cli import parse_config

WORKLOAD_CONFIGS = {"single_turn": "configs/peer_single_turn_cpu.yaml",
                    "multi_turn": "configs/peer_multi_turn_cpu.yaml"}


def first_last(values: list[float], k: int = 3) -> str:
    """`mean(first k)->mean(last k)`, 3 decimals."""
    return f"{statistics.fmean(values[:k]):.3f}->{statistics.fmean(values[-k:]):.3f}" if values else "n/a"


def median_from_step2(values: list[float]) -> float:
    """Median of steps 2..N (the first step holds one-time warm-up), or of all with one step."""
    return statistics.median(values[1:] if len(values) > 1 else values)


def trl_rows(run_dir: Path, steps: int, tokenizer_dir: str) -> list[dict]:
    """The run's questions in step order, one row per question: the prompt text as the policy saw it
    (decoded from the trajectory's prompt token ids, special tokens dropped: TRL's tokenizer adds the
    BOS back), the question and the gold answers."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows = []
    for step in range(1, steps + 1):
        with gzip.open(run_dir / "rollouts" / f"step-{step}.jsonl.gz", "rt") as f:
            seen: dict[str, dict] = {}
            for line in f:
                t = json.loads(line)
                if t["group_id"] not in seen:
                    seen[t["group_id"]] = {"prompt": tok.decode(t["prompt_ids"], skip_special_tokens=True),
                                           "question": t["question"], "golden_answers": t["golden_answers"]}
        rows.extend(seen.values())
    return rows


def ours_summary(run_dir: Path) -> dict:
    """Per-step seconds, phases, rewards and policy tokens from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/reward_mean" in r]
    phases = {k: median_from_step2([r[f"time/{k}"] for r in rows]) for k in ("rollout_s", "prepare_s", "update_s", "sync_s")}
    return {"step_s": [r["time/step_s"] for r in rows], "reward": [r["rollout/reward_mean"] for r in rows],
            "tokens": [r["rollout/policy_tokens"] * r["rollout/episodes"] for r in rows], "phases": phases}


def spread(values: list[float]) -> float:
    """Step-to-step spread of a reward curve: the standard deviation of its per-step means."""
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def plot(out: Path, workload: str, ours: list[float], trl: list[float]) -> Path:
    """Both reward curves against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(ours) + 1), ours, marker="o", label="searchrl")
    ax.plot(range(1, len(trl) + 1), trl, marker="s", label="TRL GRPOTrainer")
    ax.set_title(workload.replace("_", "-"))
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (answer F1)")
    ax.legend()
    fig.tight_layout()
    path = out / "peer_rewards.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@contextlib.contextmanager
def retrieval_server(config: str, index_dir: str, port: int, timeout_s: float = 180.0):
    """`scripts.serve_retrieval` over `index_dir` on 127.0.0.1:`port` in its own process group, for TRL's
    searches; yields its base URL once `/health` answers and stops it with SIGTERM (then SIGKILL after
    60 s). Raises RuntimeError when it does not come up within `timeout_s` seconds."""
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "scripts.serve_retrieval", "--config", config,
                             f"index.dir={index_dir}", f"serve.port={port}", "serve.host=127.0.0.1"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=5):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the retrieval server on port {port} did not come up (exit {proc.poll()})")
            time.sleep(2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_trl(args, workload: str, cfg, out: Path, run_dir: Path, model_dir: str, url: str | None) -> dict:
    """TRL's side of one workload in its own environment (`scripts.peer.trl_runner`); its JSON results."""
    steps, ro, ln = cfg.train.total_steps, cfg.rollout, cfg.learner
    data = out / "trl_prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in trl_rows(run_dir, steps, model_dir)))
    trl_out = out / "trl.json"
    limits = {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn,
              "max_observation_tokens": ro.max_observation_tokens, "max_total_tokens": ro.max_total_tokens}
    cmd = [args.trl_python, "-m", "scripts.peer.trl_runner", "--data", str(data), "--model", model_dir,
           "--out", str(trl_out), "--steps", str(steps), "--questions-per-step", str(cfg.train.questions_per_step),
           "--samples", str(ro.samples_per_prompt), "--max-new-tokens", str(ro.max_new_tokens_per_turn),
           "--temperature", str(ro.temperature), "--lr", str(ln.lr), "--betas", str(ln.adam_beta1),
           str(ln.adam_beta2), "--weight-decay", str(ln.weight_decay), "--seed", str(cfg.seed),
           "--threads", str(ln.torch_threads or 2), *(["--bf16"] if ln.dtype == "bf16" else []),
           "--workload", workload, "--recipe", cfg.train.recipe,
           "--recipe-options", json.dumps(cfg.train.recipe_options), "--limits", json.dumps(limits),
           *(["--lora", json.dumps(ln.lora.model_dump())] if ln.lora else []),
           *(["--retrieve-url", url] if url else [])]
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": str(Path.cwd())}
    subprocess.run(cmd, check=True, env=env)
    return json.loads(trl_out.read_text())


def run_workload(args, workload: str, cfg) -> str:
    """Both runs of one workload, then its line (also in `<out>/<workload>/peer.json`)."""
    from actors.engines.models import resolve_model
    from cluster.ray_init import shutdown_local_ray

    out = Path(args.out) / workload
    out.mkdir(parents=True, exist_ok=True)
    if args.ours_run:
        run_dir = Path(args.ours_run)
    else:
        from pipelines.train import train

        run_dir = train(cfg.model_copy(update={"run_dir": str(out)}), progress=True)
        shutdown_local_ray()  # TRL's run gets the machine to itself
    model_dir = resolve_model(cfg.learner.model)
    if args.trl_results:
        trl = json.loads(Path(args.trl_results).read_text())
    elif workload == "multi_turn":
        with retrieval_server(args.config_path, cfg.index.dir, args.retrieve_port) as url:
            trl = run_trl(args, workload, cfg, out, run_dir, model_dir, url)
    else:
        trl = run_trl(args, workload, cfg, out, run_dir, model_dir, None)
    ours = ours_summary(run_dir)
    trl_steps = [s["step_s"] for s in trl["steps"]]
    trl_reward = [s.get("reward", float("nan")) for s in trl["steps"]]
    ours_s, trl_s = median_from_step2(ours["step_s"]), median_from_step2(trl_steps)
    trl_phases = {k: median_from_step2([s.get(k, 0.0) for s in trl["steps"]])
                  for k in ("generate_s", "search_s", "score_s")}
    trl_phases["logprobs+update_s"] = trl_s - sum(trl_phases.values())
    tokens, trl_tokens = statistics.fmean(ours["tokens"]), statistics.fmean(s["tokens"] for s in trl["steps"])
    per_token = (trl_s / trl_tokens) / (ours_s / tokens)
    line = (f"peer: workload={workload} trl_s_per_step={trl_s:.1f} ours_s_per_step={ours_s:.1f} "
            f"speedup={trl_s / ours_s:.2f} trl_reward={first_last(trl_reward)} ours_reward={first_last(ours['reward'])} "
            f"tokens_per_step={tokens:.0f} trl_tokens_per_step={trl_tokens:.0f} speedup_per_token={per_token:.2f}")
    gap = abs(statistics.fmean(trl_reward[-3:]) - statistics.fmean(ours["reward"][-3:]))
    spread_line = (f"reward spread (std of step means): ours={spread(ours['reward']):.3f} "
                   f"trl={spread(trl_reward):.3f} last-third gap={gap:.3f}")
    png = plot(out, workload, ours["reward"], trl_reward)
    (out / "peer.json").write_text(json.dumps({"line": line, "ours": ours, "trl": trl, "trl_phases": trl_phases,
                                               "ours_run": str(run_dir), "spread": spread_line}, indent=1))
    print(line)
    print("ours phases (median s): " + " ".join(f"{k}={v:.1f}" for k, v in ours["phases"].items()))
    print("trl phases (median s): " + " ".join(f"{k}={v:.1f}" for k, v in trl_phases.items()))
    print(spread_line)
    print(f"rewards: {png}")
    return line


def main(argv: list[str] | None = None) -> int:
    """Entry point: both frameworks on each workload, then the lines (exit 2: no TRL environment or a bad config)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.peer", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench_peer", help="folder for the runs and the results")
    parser.add_argument("--workload", choices=(*WORKLOAD_CONFIGS, "both"), default="both")
    parser.add_argument("--trl-python", default=".venv-trl/bin/python", help="the TRL environment's interpreter")
    parser.add_argument("--ours-run", default=None, help="reuse this finished searchrl run instead of training "
                                                         "(one workload only)")
    parser.add_argument("--trl-results", default=None, help="reuse this finished TRL run's trl.json instead of "
                                                            "training (one workload only)")
    parser.add_argument("--retrieve-port", type=int, default=8011, help="port of TRL's retrieval server (multi_turn)")
    workloads = ["single_turn", "multi_turn"]
    args, _ = parse_config(parser, argv, default_config=WORKLOAD_CONFIGS["single_turn"])  # checks the overrides early
    if args.workload != "both":
        workloads = [args.workload]
    if not args.trl_results and not Path(args.trl_python).is_file():
        print(f"error: no TRL environment at {args.trl_python}; make it with: python3.11 -m venv .venv-trl && "
              f".venv-trl/bin/pip install -c constraints-cpu.txt -r requirements-trl.txt", file=sys.stderr)
        return 2
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a.startswith("--config")]
    if (given or args.ours_run or args.trl_results) and len(workloads) > 1:
        print("error: --config, --ours-run and --trl-results name one workload's run; add --workload "
              "single_turn|multi_turn",
              file=sys.stderr)
        return 2
    from configs.loader import ConfigError, load_config

    lines = []
    for workload in workloads:
        args.config_path = args.config if given else WORKLOAD_CONFIGS[workload]
        try:
            wcfg = load_config(args.config_path, args.overrides)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        lines.append(run_workload(args, workload, wcfg))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
