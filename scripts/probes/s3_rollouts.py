"""What an s3 run's searcher did, step by step, read from the rollouts the run saved.

    .venv/bin/python -m scripts.probes.s3_rollouts runs/<run> [--steps 1,8,16] [--json]

Reads `<run>/config.yaml` (the recipe and its options, to parse each turn as training did) and
`<run>/rollouts/step-<n>.jsonl.gz` (every step when `--steps` is left out). Prints one row a step:
- `reward`: the mean reward (s3 Eq. 1's Gain Beyond RAG, plus any configured term);
- `docs`: documents the frozen generator read (the selected context, D_s3), mean per episode;
- `ctx_recall`: share of episodes whose context holds a gold answer (`final.search.context_hit`);
- `searches`: the searcher's own searches per episode; `distinct_q>1`: episodes with 2+ different queries;
- `found`: share of episodes where a search of its own returned a gold-holding document not among the top-k (also
  where the top-k held another);
  `found_new`: share where the top-k held no gold answer and such a search found one (what `gained` can reach);
  `gained`: share whose context holds a gold answer the top-k lacked (`context_hit` without `initial_hit`:
  the searcher selected what its search found; at most `found` under `initial_block: keep`);
- `whole_first`: episodes whose first turn leaves the initial top-k unselected (read whole: naive RAG's context);
- `search_sel`: the commonest selections written after a search (`none`: no `<important_info>`);
- `tied`: GRPO groups whose samples all got the same reward (no gradient from them);
- `first_sel`: the commonest selections of the first turn, among the initial top-k (`none`: read whole);
- `lost`: of the episodes whose naive-RAG baseline was right (`gen_acc_rag` 1: questions kept with
  `prepare_data s3 --keep-answered`), those whose selected context lost the answer (`gen_acc_s3` below it);
- `first_adv`: GRPO's signal on the first turn's selection: the advantage the update trained on (the run's
  `algorithm.advantage_estimator` over the step's rewards: for `grpo`, (reward − group mean) / group std),
  summed over the episodes of groups that are not tied, by first-turn selection (the three largest in size).
  The std matters: with an F1 reward a group whose samples differ by 0.05 weighs as much as one that differs by
  1, so reward − mean alone (what `step_summary` sums without an algorithm) can have the other sign;
- `judge_only`: episodes whose accuracy 1 came from the judge alone (the generator's answer fails s3's span
  check), and `(F1 0: n)` of them, answers sharing no word with any gold answer: the judge's likely false yes
  (under `reward_metric: gen_acc` with `use_judge`; 0 otherwise).

No Ray, no engine, no index: what the rollouts hold is enough. Raises (exit 2): the run has no
config.yaml or no rollouts, a step without a file, a run whose recipe is not s3.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

TOP_SELECTIONS = 3


def _recipe(run: Path) -> Any:
    """The run's s3 recipe, built from its saved config. Raises ValueError: no config or not s3."""
    import yaml

    from recipes import get_recipe

    path = run / "config.yaml"
    if not path.is_file():
        raise ValueError(f"{path}: no such file (pass a run directory that `scripts.train` wrote)")
    cfg = yaml.safe_load(path.read_text()) or {}
    train = cfg.get("train") or {}
    if train.get("recipe") != "s3":
        raise ValueError(f"{run}: train.recipe is {train.get('recipe')!r}; this probe reads s3 runs")
    return get_recipe("s3", train.get("recipe_options") or {})


def _selection_label(ids: tuple[int, ...] | None) -> str:
    return "none" if ids is None else "[" + ", ".join(map(str, ids)) + "]"


def first_selection(recipe: Any, trajectory: dict) -> str:
    """The label of a trajectory's first-turn selection (`[1]`, `[]`; `none`: the initial top-k left unselected)."""
    from recipes.s3 import selected_ids

    turns = trajectory.get("turns") or []
    return _selection_label(selected_ids(recipe.parse(turns[0]["text"])) if turns else None)


def _algorithm(run: Path) -> Any:
    """The run's `AlgorithmConfig`, or None for GAE (its advantages need the critic's values, not saved)."""
    from configs.loader import load_config

    algorithm = load_config(run / "config.yaml").algorithm
    return None if algorithm.advantage_estimator == "gae" else algorithm


def _advantages(algorithm: Any, trajectories: list[dict]) -> list[float]:
    """Each episode's sequence advantage under `algorithm` (`algorithms.compute_advantages`, one token each)."""
    import torch

    from algorithms import compute_advantages

    rewards = torch.tensor([float(t.get("reward") or 0.0) for t in trajectories])
    adv, _ = compute_advantages(algorithm, rewards, torch.ones((len(trajectories), 1)),
                                group_ids=[str(t["group_id"]) for t in trajectories])
    return adv[:, 0].tolist()


def step_summary(recipe: Any, trajectories: list[dict], algorithm: Any = None) -> dict[str, Any]:
    """One step's measures (see the module docstring) from its saved trajectories (`Trajectory.to_json`);
    `algorithm` (an `AlgorithmConfig`) gives `first_adv` the advantages trained on, None reward − group mean."""
    from recipes.metrics import f1_score, span_check
    from recipes.s3 import selected_ids

    n = len(trajectories)
    groups: dict[str, list[float]] = defaultdict(list)
    search_sel: Counter[str] = Counter()
    first_sel: Counter[str] = Counter()
    first_label: dict[int, str] = {}
    out = Counter()
    for t in trajectories:
        search = (t.get("final") or {}).get("search") or {}
        groups[t["group_id"]].append(t.get("reward"))
        out["reward"] += t.get("reward") or 0.0
        out["docs"] += len((t.get("final") or {}).get("selected_doc_ids") or [])
        out["ctx_recall"] += bool(search.get("context_hit"))
        out["searches"] += int(search.get("own_searches") or 0)
        out["found"] += bool(search.get("found_by_search"))
        out["found_new"] += bool(search.get("found_by_search")) and not search.get("initial_hit")
        out["gained"] += bool(search.get("context_hit")) and not search.get("initial_hit")
        turns = t.get("turns") or []
        selections = [selected_ids(recipe.parse(turn["text"])) for turn in turns]
        out["whole_first"] += not turns or selections[0] is None
        search_sel.update(_selection_label(s) for s in selections[1:])
        first_label[id(t)] = first_selection(recipe, t)
        first_sel[first_label[id(t)]] += 1
        parts = t.get("reward_components") or {}
        if parts.get("gen_acc_rag", 0.0) >= 1.0:
            out["rag_right"] += 1
            out["lost"] += parts.get("gen_acc_s3", 0.0) < parts["gen_acc_rag"]
        answer, golds = (t.get("final") or {}).get("answer") or "", t.get("golden_answers") or []
        if parts.get("gen_acc_s3", 0.0) >= 1.0 and not span_check(answer, golds):
            out["judge_only"] += 1
            out["judge_only_f1_0"] += f1_score(answer, golds) == 0.0
        queries = {q.strip().lower() for turn in turns if (q := turn.get("query"))}
        out["distinct_q>1"] += len(queries) > 1
    tied = sum(len(set(rewards)) == 1 for rewards in groups.values())
    first_adv: Counter[str] = Counter()
    trained = _advantages(algorithm, trajectories) if algorithm is not None and n else None
    for i, t in enumerate(trajectories):
        rewards = groups[t["group_id"]]
        if len(set(rewards)) > 1:
            first_adv[first_label[id(t)]] += trained[i] if trained is not None else \
                (t.get("reward") or 0.0) - sum(r or 0.0 for r in rewards) / len(rewards)
    means = {k: out[k] / n for k in ("reward", "docs", "ctx_recall", "searches", "found", "found_new", "gained")} if n else {}
    return {"episodes": n, **means, "distinct_q>1": out["distinct_q>1"], "whole_first": out["whole_first"],
            "search_sel": dict(search_sel.most_common(TOP_SELECTIONS)), "tied": tied, "groups": len(groups),
            "first_sel": dict(first_sel.most_common(TOP_SELECTIONS)), "lost": out["lost"], "rag_right": out["rag_right"],
            "judge_only": out["judge_only"], "judge_only_f1_0": out["judge_only_f1_0"],
            "first_adv": dict(sorted(first_adv.items(), key=lambda kv: -abs(kv[1]))[:TOP_SELECTIONS])}


def _steps(run: Path, wanted: str | None) -> list[int]:
    have = sorted(int(p.name.split("-")[1].split(".")[0]) for p in (run / "rollouts").glob("step-*.jsonl.gz"))
    if not have:
        raise ValueError(f"{run}/rollouts: no step-<n>.jsonl.gz files (the run saved no rollouts yet)")
    if not wanted:
        return have
    steps = [int(s) for s in wanted.split(",") if s.strip()]
    missing = [s for s in steps if s not in have]
    if missing:
        raise ValueError(f"--steps {wanted}: no rollouts for step(s) {missing}; the run has {have[0]}-{have[-1]}")
    return steps


def _read(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    """Print the table (or JSON lines with --json); exit 2 with an `error:` line on a bad run or step."""
    parser = argparse.ArgumentParser(prog="python -m scripts.probes.s3_rollouts", description=__doc__.split("\n")[0])
    parser.add_argument("run", help="run directory (runs/s3-...)")
    parser.add_argument("--steps", default=None, help="comma-separated steps (default: every saved step)")
    parser.add_argument("--json", action="store_true", help="one JSON object a step instead of the table")
    args = parser.parse_args(argv)
    run = Path(args.run)
    try:
        recipe, algorithm = _recipe(run), _algorithm(run)
        steps = _steps(run, args.steps)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.json:
        print("| step | reward | docs | ctx_recall | searches | distinct_q>1 | found | found_new | gained | whole_first | search_sel | tied "
              "| first_sel | first_adv | lost | judge_only |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | --- | ---: | ---: |")
    for step in steps:
        s = step_summary(recipe, _read(run / "rollouts" / f"step-{step}.jsonl.gz"), algorithm)
        if args.json:
            print(json.dumps({"step": step, **s}))
            continue
        sel, first = (", ".join(f"`{k}` {v}" for k, v in s[c].items()) or "-" for c in ("search_sel", "first_sel"))
        adv = ", ".join(f"`{k}` {v:+.2f}" for k, v in s["first_adv"].items()) or "-"
        print(f"| {step} | {s['reward']:+.3f} | {s['docs']:.1f} | {s['ctx_recall']:.2f} | {s['searches']:.2f} | "
              f"{s['distinct_q>1']} of {s['episodes']} | {s['found']:.2f} | {s['found_new']:.2f} | "
              f"{s['gained']:.2f} | {s['whole_first']} of {s['episodes']} | "
              f"{sel} | {s['tied']} of {s['groups']} | {first} | {adv} | {s['lost']} of {s['rag_right']} | "
              f"{s['judge_only']} (F1 0: {s['judge_only_f1_0']}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
