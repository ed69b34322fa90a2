"""Side by side with TRL: the same GRPO run under searchrl and under TRL's GRPOTrainer, on this machine.

The single-turn workload (`configs/peer_single_turn_cpu.yaml`): the naive-RAG answerer as the policy
(the question's BM25 top-3 in the s3 Fig. 12 answer prompt, one answer turn, reward = the answer's
token F1 by `recipes/`), Gemma 3 270M, 8 samples per question, no KL, the same questions, learning rate,
AdamW betas, weight decay, precision, temperature and new-token limit. searchrl runs first
(`scripts.train`); its rollouts give TRL the very same prompts in the same order. Then TRL runs in
its own virtual environment, never `.venv` and never in CI (`scripts/peer_trl_runner.py`):

    python3.11 -m venv .venv-trl && .venv-trl/bin/pip install -c constraints-cpu.txt -r requirements-trl.txt

Prints one line per workload,
`peer: workload=... trl_s_per_step=... ours_s_per_step=... speedup=... trl_reward=first3->last3
ours_reward=first3->last3 tokens_per_step=...` (seconds per step: the median over steps 2 to N), each
framework's step split into phases, and writes `<out>/peer_rewards.png` and `<out>/peer.json`.

The multi-turn search workload is not measured yet (issue 27).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

from scripts.cli import parse_config

DEFAULT_CONFIG = "configs/peer_single_turn_cpu.yaml"


def first_last(values: list[float], k: int = 3) -> str:
    """`mean(first k)->mean(last k)`, 3 decimals."""
    return f"{statistics.fmean(values[:k]):.3f}->{statistics.fmean(values[-k:]):.3f}" if values else "n/a"


def median_from_step2(values: list[float]) -> float:
    """Median of steps 2..N (the first step holds one-time warm-up), or of all with one step."""
    return statistics.median(values[1:] if len(values) > 1 else values)


def trl_rows(run_dir: Path, steps: int, tokenizer_dir: str) -> list[dict]:
    """The run's questions in step order, one row per question: the prompt text as the policy saw it
    (decoded from the trajectory's prompt token ids, special tokens dropped: TRL's tokenizer adds the
    BOS back) and the gold answers."""
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
                                           "golden_answers": t["golden_answers"]}
        rows.extend(seen.values())
    return rows


def ours_summary(run_dir: Path) -> dict:
    """Per-step seconds, phases, rewards and policy tokens from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/reward_mean" in r]
    phases = {k: median_from_step2([r[f"time/{k}"] for r in rows]) for k in ("rollout_s", "prepare_s", "update_s", "sync_s")}
    return {"step_s": [r["time/step_s"] for r in rows], "reward": [r["rollout/reward_mean"] for r in rows],
            "tokens": [r["rollout/policy_tokens"] * r["rollout/episodes"] for r in rows], "phases": phases}


def plot(out: Path, ours: list[float], trl: list[float]) -> Path:
    """Both reward curves against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(ours) + 1), ours, marker="o", label="searchrl")
    ax.plot(range(1, len(trl) + 1), trl, marker="s", label="TRL GRPOTrainer")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (answer F1)")
    ax.legend()
    fig.tight_layout()
    path = out / "peer_rewards.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """Entry point: both runs, then the line (exit 2: no TRL environment or a bad config)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_peer", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench_peer", help="folder for both runs and the results")
    parser.add_argument("--trl-python", default=".venv-trl/bin/python", help="the TRL environment's interpreter")
    parser.add_argument("--ours-run", default=None, help="reuse this finished searchrl run instead of training")
    args, cfg = parse_config(parser, argv, default_config=DEFAULT_CONFIG)
    if not Path(args.trl_python).is_file():
        print(f"error: no TRL environment at {args.trl_python}; make it with: python3.11 -m venv .venv-trl && "
              f".venv-trl/bin/pip install -c constraints-cpu.txt -r requirements-trl.txt", file=sys.stderr)
        return 2
    from actors.engines.models import resolve_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps, ro, ln = cfg.train.total_steps, cfg.rollout, cfg.learner
    if args.ours_run:
        run_dir = Path(args.ours_run)
    else:
        from pipelines.train import train

        run_dir = train(cfg.model_copy(update={"run_dir": str(out)}), progress=True)
    model_dir = resolve_model(ln.model)
    data = out / "trl_prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in trl_rows(run_dir, steps, model_dir)))
    trl_out = out / "trl.json"
    cmd = [args.trl_python, "-m", "scripts.peer_trl_runner", "--data", str(data), "--model", model_dir,
           "--out", str(trl_out), "--steps", str(steps), "--questions-per-step", str(cfg.train.questions_per_step),
           "--samples", str(ro.samples_per_prompt), "--max-new-tokens", str(ro.max_new_tokens_per_turn),
           "--temperature", str(ro.temperature), "--lr", str(ln.lr), "--betas", str(ln.adam_beta1),
           str(ln.adam_beta2), "--weight-decay", str(ln.weight_decay), "--seed", str(cfg.seed),
           "--threads", str(ln.torch_threads or 2), *(["--bf16"] if ln.dtype == "bf16" else [])]
    subprocess.run(cmd, check=True)
    trl = json.loads(trl_out.read_text())
    ours = ours_summary(run_dir)
    trl_steps = [s["step_s"] for s in trl["steps"]]
    trl_reward = [s.get("reward", float("nan")) for s in trl["steps"]]
    ours_s, trl_s = median_from_step2(ours["step_s"]), median_from_step2(trl_steps)
    trl_phases = {"generate_s": median_from_step2([s["generate_s"] for s in trl["steps"]]),
                  "score_s": median_from_step2([s["score_s"] for s in trl["steps"]])}
    trl_phases["logprobs+update_s"] = trl_s - trl_phases["generate_s"] - trl_phases["score_s"]
    tokens = statistics.fmean(ours["tokens"])
    line = (f"peer: workload=single_turn trl_s_per_step={trl_s:.1f} ours_s_per_step={ours_s:.1f} "
            f"speedup={trl_s / ours_s:.2f} trl_reward={first_last(trl_reward)} ours_reward={first_last(ours['reward'])} "
            f"tokens_per_step={tokens:.0f}")
    png = plot(out, ours["reward"], trl_reward)
    (out / "peer.json").write_text(json.dumps({"line": line, "ours": ours, "trl": trl, "trl_phases": trl_phases,
                                               "ours_run": str(run_dir)}, indent=1))
    print(line)
    print("ours phases (median s): " + " ".join(f"{k}={v:.1f}" for k, v in ours["phases"].items()))
    print("trl phases (median s): " + " ".join(f"{k}={v:.1f}" for k, v in trl_phases.items()))
    print(f"rewards: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
