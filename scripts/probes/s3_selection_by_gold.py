"""Does an s3 searcher select the documents that hold the answer, or a position? Read from a run's saved rollouts.

    .venv/bin/python -m scripts.probes.s3_selection_by_gold runs/<run> [--steps 32-41] [--json]

A searcher that reads for the answer selects a gold-holding document more often than one that holds none, at every
position; one that learned a position selects position 1 (say) as often either way (the expert's
selections depend on the documents, the trained searcher's must too). For every selection the searcher wrote, by
the document's position in the block it selects among (1 = the retriever's first):
- `initial`: turn 1's selection among the initial top-k (`final.search.shown_doc_ids[:retrieval.topk]`);
- `search`: turn k's selection among turn k−1's search results (`turns[k-1].doc_ids`), k ≥ 2;
- per position: `gold n` (documents holding a gold answer: `recipes.search_metrics.doc_holds_answer`, s3's span
  check) and the share of them selected; `other n` and its share; `lift` = gold share − other share (about 0 for
  a position);
- `unwritten`: blocks whose turn wrote no `<important_info>` (left out of the shares: what they mean depends on
  `initial_block` / `unselected_search_block`).

Reads `<run>/config.yaml` (recipe options, data pack, `retrieval.topk`), `<run>/rollouts/step-<n>.jsonl.gz` and the
run's corpus (`data.dir`, else $SEARCHRL_DATA) for the documents' text. No Ray, no engine, no index. Raises (exit 2):
no config or rollouts, a run whose recipe is not s3, a step range with no saved step, a missing data pack.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from scripts.probes.s3_rollouts import _read, _recipe, _steps

BLOCKS = ("initial", "search")


def _blocks(trajectory: dict, topk: int) -> Iterable[tuple[str, list[str], str]]:
    """`(block, doc ids shown in order, text of the turn that selects among them)` for each selection turn."""
    turns = trajectory.get("turns") or []
    shown = ((trajectory.get("final") or {}).get("search") or {}).get("shown_doc_ids") or []
    if turns and shown:
        yield "initial", list(shown[:topk]), turns[0]["text"]
    for k in range(1, len(turns)):
        if turns[k - 1].get("doc_ids"):
            yield "search", list(turns[k - 1]["doc_ids"]), turns[k]["text"]


def selection_by_gold(recipe: Any, trajectories: Iterable[dict], topk: int,
                      holds_gold: Callable[[str, Sequence[str]], bool]) -> dict[str, Any]:
    """Counts per block and position (see the module docstring) over `trajectories` (`Trajectory.to_json` rows).

    `holds_gold(doc_id, golden_answers)` says whether a document holds a gold answer. Returns
    `{block: {"positions": {p: {"gold_n", "gold_selected", "other_n", "other_selected"}}, "unwritten": int}}`,
    counts (int), positions 1-based."""
    from recipes.s3 import selected_ids

    out: dict[str, Any] = {b: {"positions": {}, "unwritten": 0} for b in BLOCKS}
    for t in trajectories:
        golds = t.get("golden_answers") or []
        for block, ids, text in _blocks(t, topk):
            selected = selected_ids(recipe.parse(text))
            if selected is None:
                out[block]["unwritten"] += 1
                continue
            for p, doc_id in enumerate(ids, 1):
                row = out[block]["positions"].setdefault(p, Counter(gold_n=0, gold_selected=0, other_n=0, other_selected=0))
                kind = "gold" if holds_gold(doc_id, golds) else "other"
                row[f"{kind}_n"] += 1
                row[f"{kind}_selected"] += p in selected
    for block in BLOCKS:
        out[block]["positions"] = {p: dict(c) for p, c in sorted(out[block]["positions"].items())}
    return out


def _share(selected: int, n: int) -> float | None:
    return selected / n if n else None


def corpus_docs(run: Path, wanted: set[str]) -> dict[str, Any]:
    """`{doc_id: recipes.base.Doc}` of the run's corpus (`data.dir`, else $SEARCHRL_DATA), keeping only the `wanted`
    doc ids' text (a full Wikipedia corpus does not fit in memory). Raises DataPackError / ValueError."""
    from configs.loader import load_config
    from pipelines.data import iter_corpus, resolve_data_dir
    from recipes.base import Doc

    cfg = load_config(run / "config.yaml")
    path = resolve_data_dir(cfg.data.dir) / cfg.data.corpus
    return {p.id: Doc(p.id, p.title, p.text) for p in iter_corpus(path) if p.id in wanted}


def doc_lookup(corpus: dict[str, Any]) -> Callable[[str], Any]:
    """`corpus[doc_id]`, raising ValueError that names the corpus mismatch for an id it lacks."""

    def doc(doc_id: str) -> Any:
        if doc_id not in corpus:
            raise ValueError(f"{doc_id}: not in the run's corpus (data.dir / data.corpus name another corpus)")
        return corpus[doc_id]

    return doc


def _step_range(run: Path, wanted: str | None) -> list[int]:
    """Saved steps within `wanted` ("LO-HI", "N" or None: all). Raises ValueError: none saved in the range."""
    have = _steps(run, None)
    if not wanted:
        return have
    lo, _, hi = wanted.partition("-")
    try:
        lo_i, hi_i = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--steps {wanted}: write LO-HI or N (for example 32-41)") from None
    steps = [s for s in have if lo_i <= s <= hi_i]
    if not steps:
        raise ValueError(f"--steps {wanted}: no saved step in that range; the run has {have[0]}-{have[-1]}")
    return steps


def run_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The probes' shared command line: `run`, `--steps LO-HI`, `--json`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("run", help="run directory (runs/s3-...)")
    parser.add_argument("--steps", default=None, help="LO-HI or N: the saved steps to pool (default: every one)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    return parser


def load_run(run: Path, steps_arg: str | None) -> tuple[Any, list[int], int, list[dict], dict[str, Any]]:
    """`(recipe, steps, topk, trajectories, corpus)` of an s3 run: the saved steps in `steps_arg`, their rollouts,
    `retrieval.topk` and `corpus_docs` of every document shown in a selection block. Raises ValueError (not s3, no
    step in range, a bad range), OSError, DataPackError."""
    from configs.loader import load_config

    recipe, steps = _recipe(run), _step_range(run, steps_arg)
    topk = load_config(run / "config.yaml").retrieval.topk
    trajectories = [t for s in steps for t in _read(run / "rollouts" / f"step-{s}.jsonl.gz")]
    wanted = {d for t in trajectories for _, ids, _ in _blocks(t, topk) for d in ids}
    return recipe, steps, topk, trajectories, corpus_docs(run, wanted)


def run_probe(argv: list[str] | None, prog: str, description: str,
              compute: Callable[[Any, int, list[dict], dict[str, Any]], dict[str, Any]],
              table: Callable[[dict[str, Any]], None]) -> int:
    """The probes' `main`: parse `run [--steps] [--json]`, `load_run`, `compute(recipe, topk, trajectories, corpus)`,
    then print one JSON object (`run`, `steps` and the result) or a header line and `table(result)`. Returns 0, or
    2 after an `error:` line on stderr for a bad run, range or data pack."""
    from pipelines.data import DataPackError

    args = run_parser(prog, description).parse_args(argv)
    run = Path(args.run)
    try:
        recipe, steps, topk, trajectories, corpus = load_run(run, args.steps)
        out = compute(recipe, topk, trajectories, corpus)
    except (ValueError, OSError, DataPackError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"run": str(run), "steps": [steps[0], steps[-1]], **out}))
        return 0
    print(f"{run} steps {steps[0]}-{steps[-1]} ({len(steps)} saved)")
    table(out)
    return 0


def _table(counts: dict[str, Any]) -> None:
    print("| block | position | gold n | gold selected | other n | other selected | lift |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for block in BLOCKS:
        for p, c in counts[block]["positions"].items():
            g, o = _share(c["gold_selected"], c["gold_n"]), _share(c["other_selected"], c["other_n"])
            lift = f"{g - o:+.2f}" if g is not None and o is not None else "-"
            print(f"| {block} | {p} | {c['gold_n']} | {'-' if g is None else f'{g:.2f}'} | {c['other_n']} | "
                  f"{'-' if o is None else f'{o:.2f}'} | {lift} |")
        print(f"| {block} | unwritten | {counts[block]['unwritten']} | | | | |")


def main(argv: list[str] | None = None) -> int:
    """Print the table (or one JSON object with --json); exit 2 with an `error:` line on a bad run or range."""
    from recipes.search_metrics import doc_holds_answer

    def compute(recipe: Any, topk: int, trajectories: list[dict], corpus: dict[str, Any]) -> dict[str, Any]:
        doc = doc_lookup(corpus)
        return selection_by_gold(recipe, trajectories, topk, lambda d, golds: doc_holds_answer(doc(d), golds))

    return run_probe(argv, "python -m scripts.probes.s3_selection_by_gold", __doc__.split("\n")[0], compute, _table)


if __name__ == "__main__":
    sys.exit(main())
