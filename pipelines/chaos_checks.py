"""What `scripts.ops.chaos` checks in a finished run directory: every step's trajectory set against the
questions an uninterrupted run takes at that step (`pipelines.train.batch_indices`), and the metrics'
continuity. In `train.async_mode: fully` a step trains the groups that finished first, so the check
is over the whole run: each scheduled group (its `group_id` ends in `#<0-based step it was scheduled
for>`) trained once, with every sample. Pure file reading; no Ray."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from configs.schema import Config


@dataclass
class RunCheck:
    """The result of `check_run`.

    lost / duplicated: (question, sample) pairs missing from / repeated in a step's saved
        trajectories, over all steps (counts);
    same_order: every step holds exactly the questions of `batch_indices` for that step (fully: every
        step a full batch; which groups is completion order, and `lost`/`duplicated` count over the run);
    missing_steps: steps with no metrics row or no trajectory file;
    faults: the sum of each `faults/*` metric over the steps' final rows.
    """

    steps: int
    lost: int = 0
    duplicated: int = 0
    same_order: bool = True
    missing_steps: list[int] = field(default_factory=list)
    faults: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No pair lost or duplicated, the data order kept, no step missing."""
        return not (self.lost or self.duplicated or self.missing_steps) and self.same_order


def expected_questions(cfg: Config, step: int) -> list[str]:
    """Group ids ("<dataset>/<id>") of the questions of 1-based `step` in an uninterrupted run."""
    from actors.rollout.agent_loop import group_id_of
    from pipelines.data import iter_qa, pack_file
    from pipelines.train import batch_indices, stage_at

    pool = list(iter_qa(pack_file(stage_at(cfg, step - 1)[2], cfg.data.dir)))
    idx = batch_indices(step - 1, cfg.train.questions_per_step, len(pool), cfg.seed, cfg.train.shuffle)
    return [group_id_of({"id": pool[i].id, "dataset": pool[i].dataset}) for i in idx]


def check_run(run_dir: Path, cfg: Config, steps: int) -> RunCheck:
    """Check steps 1 … `steps` of `run_dir` (its rollouts/step-N.jsonl.gz and metrics.jsonl)."""
    from pipelines.tracking import read_metrics

    out = RunCheck(steps=steps)
    rows = {int(r["step"]): r for r in read_metrics(run_dir / "metrics.jsonl")}
    n = cfg.rollout.samples_per_prompt
    fully = cfg.train.async_mode == "fully"
    run_want: Counter = Counter()
    run_got: Counter = Counter()
    for step in range(1, steps + 1):
        path = run_dir / "rollouts" / f"step-{step}.jsonl.gz"
        want_q = expected_questions(cfg, step)
        run_want.update((f"{q}#{step - 1}", s) for q in want_q for s in range(n))
        if step not in rows or not path.is_file():
            out.missing_steps.append(step)
            continue
        with gzip.open(path, "rt") as f:
            trajs = [json.loads(line) for line in f]
        got = Counter((t["group_id"], int(t["sample_index"])) for t in trajs)
        for k, v in rows[step].items():
            if k.startswith("faults/"):
                out.faults[k] = out.faults.get(k, 0.0) + float(v)
        if fully:
            run_got.update(got)
            out.same_order &= len(got) == len(want_q) * n  # a full batch, whichever groups finished first
            continue
        want = Counter((q, s) for q in want_q for s in range(n))
        out.lost += sum((want - got).values())
        out.duplicated += sum((got - want).values())
        out.same_order &= {t["group_id"] for t in trajs} == set(want_q)  # within a step, workers interleave
    if fully:  # the run's steps take exactly its scheduled groups, each once, in completion order
        out.lost = sum((run_want - run_got).values())
        out.duplicated = sum((run_got - run_want).values())
    return out
