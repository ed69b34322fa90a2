"""Which way one GRPO update moves an s3 searcher's first-turn selection, and why.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.probes.update_direction runs/<run> --checkpoint 12 \
        [--heldout 14,15] [--json]

Replays the update of step `checkpoint + 1` in this process (no Ray, no engine): the run's `PolicyLearner`
restored from `checkpoints/step-<checkpoint>` (weights, AdamW state, learning-rate schedule), the trajectories the
run saved for step `checkpoint + 1` (`rollouts/step-<n>.jsonl.gz`), their GRPO advantages and trained rows as
`scripts.train` computes them (and the reference log-probs of the KL term from the run's warm-started policy).
The update runs three times from the same restored state:
- `full`: as training ran it, every policy token under the loss;
- `first_turn`: only the first turn's tokens under the loss (later turns' queries and selections left out),
  which isolates the gradient that reaches the first-turn selection directly;
- `momentum`: the trained rows with advantages of 1e-12, so the optimizer step is AdamW's first moment alone
  (beta1: the earlier steps' gradients), which the full update carries too.

For each, the mean change of log π(first turn | prompt) (nats, the sampled first turn's tokens summed) by
first-turn selection (`[1]`, `[]`, `none` = the top-k read whole; the largest labels), on the trained rows and on
the first turns of `--heldout` steps' rollouts (contexts the update never saw: how the change generalizes).
With it, the GRPO signal each label got: the rows trained and their advantages' sum (one value a row).

A label whose log-prob rises under `full` while its advantage sum is negative, and falls under `first_turn`, is
carried by the gradient of the other turns' tokens; one that rises under `momentum` too, by the earlier steps'.

Needs the memory of one learner update and a reference model (~7 GB for Gemma 3 270M; never beside a training
run) and a checkpoint of one learner rank (DeepSpeed loads a checkpoint into the world size that wrote it); 9 min a
replay for the 270M searcher on a 2-core EPYC. The run's `keep_checkpoints` keeps only the latest few: train with
`train.keep_every` to keep every k-th whole, or copy the ones to replay aside while the run goes on (a folder holding
the run's `config.yaml`, a link to its `rollouts/` and the copies under `checkpoints/` is a run to this probe).

Raises (exit 2): no config or rollouts, no checkpoint `step-<checkpoint>`, a run whose recipe is not s3.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from scripts.probes.s3_rollouts import _read, _recipe, first_selection

TOP_LABELS = 4


def first_turn_labels(recipe: Any, trajectories: list[dict]) -> list[str]:
    """The first turn's selection of each trajectory (`s3_rollouts.first_selection`)."""
    return [first_selection(recipe, t) for t in trajectories]


def first_turn_mask(trajectories: list[dict], loss_mask: Any) -> Any:
    """`[B, R]` float32: 1 on each row's first-turn policy tokens (the first `generated_tokens` of its response:
    the first turn starts the response), 0 elsewhere."""
    import torch

    mask = torch.zeros_like(loss_mask)
    for i, t in enumerate(trajectories):
        turns = t.get("turns") or []
        n = int(turns[0]["generated_tokens"]) if turns else 0
        mask[i, :n] = loss_mask[i, :n]
    return mask


def first_turns(trajectories: list[dict]) -> list[dict]:
    """Each trajectory cut to its prompt and first turn (what the first-turn log-prob reads: no pass over the rest)."""
    out = []
    for t in trajectories:
        turns = t.get("turns") or []
        n = max(1, int(turns[0]["generated_tokens"]) if turns else 0)
        out.append({**t, **{k: t[k][:n] for k in ("response_ids", "loss_mask", "logprobs")}})
    return out


def _logprobs(learner: Any, batch: Any) -> Any:
    """`[B, R]` float32: the learner's log-probs in the batch's row order (it computes them group by group)."""
    import torch

    out = learner.compute_logprobs(batch)
    lp = torch.zeros((batch.size, batch.response_len))
    lp[out["rows"]] = out["logprobs"]
    return lp


def _first_turn_logprob(learner: Any, batch: Any) -> Any:
    """`[B]` float32: log π of each row's first-turn policy tokens (a `first_turns` batch), summed (nats)."""
    return (_logprobs(learner, batch) * batch.loss_mask).sum(-1)


def _by_label(labels: list[str], values: Any, rows: Any = None) -> dict[str, dict[str, float]]:
    keep = set(range(len(labels))) if rows is None else set(rows.tolist())
    acc: dict[str, list[float]] = defaultdict(list)
    for i, label in enumerate(labels):
        if i in keep:
            acc[label].append(float(values[i]))
    return {k: {"n": len(v), "mean": sum(v) / len(v), "sum": sum(v)} for k, v in acc.items()}


def replay(run: Path, checkpoint: int, heldout: list[int]) -> dict[str, Any]:
    """The probe's measures (see the module docstring) as a dict."""
    import torch

    from actors.learner.batch import make_train_batch, scatter_rows, trained_rows
    from actors.learner.policy import single_step
    from actors.learner.reference import ReferenceModel
    from algorithms import compute_advantages
    from configs.loader import load_config
    from pipelines.warm_start import WARM_START_DIR
    from scripts.bench.learner_local import _learner

    recipe = _recipe(run)
    ckpt = run / "checkpoints" / f"step-{checkpoint}"
    step_file = run / "rollouts" / f"step-{checkpoint + 1}.jsonl.gz"
    for path in (ckpt, step_file, *(run / "rollouts" / f"step-{s}.jsonl.gz" for s in heldout)):
        if not path.exists():
            raise ValueError(f"{path}: not there (--checkpoint names a saved step whose next step's rollouts exist)")
    cfg = load_config(run / "config.yaml")
    trajs = _read(step_file)
    batch = make_train_batch(trajs, 0)
    rewards = torch.tensor([float(t.get("reward") or 0.0) for t in trajs])
    algo = cfg.algorithm
    advantages, returns = compute_advantages(algo, rewards, batch.loss_mask, group_ids=batch.group_ids)
    rows = trained_rows(algo, advantages, batch)
    fields: dict[str, Any] = {"advantages": advantages, "returns": returns, "old_logprobs": None}
    if algo.kl_coef > 0 and not algo.kl_in_reward and len(rows):
        warm = run / WARM_START_DIR / "policy" / "hf"
        ref_cfg = cfg.learner.model_copy(update={"reference_model": cfg.learner.reference_model or (
            str(warm) if (warm / "config.json").is_file() else None)})
        ref = ReferenceModel(ref_cfg, temperature=cfg.rollout.temperature)
        fields["ref_logprobs"] = scatter_rows(ref.compute_logprobs(batch.select(rows)), rows, batch.size,
                                              batch.response_len)
        del ref
    labels = first_turn_labels(recipe, trajs)
    firsts = make_train_batch(first_turns(trajs), 0)
    held = [(make_train_batch(first_turns(h), 0), first_turn_labels(recipe, h)) for h in (_read(
        run / "rollouts" / f"step-{s}.jsonl.gz") for s in heldout)]

    learner = _learner(cfg, cfg.learner, random_init=False)
    out: dict[str, Any] = {"checkpoint": checkpoint, "trained_step": checkpoint + 1, "rows": len(rows),
                           "episodes": batch.size, "signal": _by_label(labels, advantages[:, 0], rows)}
    # momentum: the same rows trained with advantages of 1e-12 (0 would leave them out), so the optimizer step
    # carries AdamW's first moment alone (the earlier steps' gradients; the KL term's is ~0 near the reference)
    tiny = torch.zeros_like(advantages)
    tiny[rows] = 1e-12 * batch.loss_mask[rows]
    modes = {"full": batch.with_fields(**fields),
             "first_turn": batch.with_fields(**fields, loss_mask=first_turn_mask(trajs, batch.loss_mask)),
             "momentum": batch.with_fields(**{**fields, "advantages": tiny})}
    for name, train in modes.items():
        learner.load_checkpoint(str(ckpt))
        before = _first_turn_logprob(learner, firsts)
        held_before = [_first_turn_logprob(learner, b) for b, _ in held]
        if not single_step(cfg.learner, batch.size):
            lp = scatter_rows(_logprobs(learner, train.select(rows)), rows, batch.size, batch.response_len)
            train = train.with_fields(old_logprobs=lp)
        metrics = learner.update(train, algo)
        after = _first_turn_logprob(learner, firsts)
        out[name] = {"grad_norm": float(metrics.get("grad_norm", float("nan"))),
                     "trained": _by_label(labels, after - before, rows),
                     "heldout": _by_label(sum((lab for _, lab in held), []), torch.cat(
                         [_first_turn_logprob(learner, b) - hb for (b, _), hb in zip(held, held_before)])
                         if held else torch.zeros(0))}
    learner.shutdown()
    return out


MODES = ("full", "first_turn", "momentum")


def _table(out: dict[str, Any]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for part in (out["signal"], out["full"]["heldout"]):
        for k, v in part.items():
            counts[k] += v["n"]
    labels = sorted(counts, key=lambda k: -counts[k])[:TOP_LABELS]
    norms = ", ".join(f"{m} {out[m]['grad_norm']:.2f}" for m in MODES)
    lines = [f"checkpoint step-{out['checkpoint']}, the update of step {out['trained_step']}: {out['rows']} of "
             f"{out['episodes']} rows trained; grad_norm: {norms}",
             "| first-turn selection | rows trained | advantage sum | Δ log π trained: full | first turn only | momentum "
             "| held-out episodes | Δ log π held-out: full | first turn only | momentum |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k in labels:
        s = out["signal"].get(k, {"n": 0, "sum": 0.0})
        cells = {part: [f"{v['mean']:+.3f}" if (v := out[m][part].get(k)) else "-" for m in MODES]
                 for part in ("trained", "heldout")}
        held = out["full"]["heldout"].get(k, {"n": 0})["n"]
        lines.append(f"| `{k}` | {s['n']} | {s['sum']:+.2f} | {' | '.join(cells['trained'])} | {held} | "
                     f"{' | '.join(cells['heldout'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table (or one JSON object with --json); exit 2 with an `error:` line on a bad run or step."""
    parser = argparse.ArgumentParser(prog="python -m scripts.probes.update_direction",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("run", help="run directory (runs/s3-...)")
    parser.add_argument("--checkpoint", type=int, required=True, help="the saved step to start from (step-<n>)")
    parser.add_argument("--heldout", default="", help="comma-separated steps whose first turns are measured too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = replay(Path(args.run), args.checkpoint, [int(s) for s in args.heldout.split(",") if s.strip()])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out) if args.json else _table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
