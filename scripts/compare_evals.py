"""Two evaluations paired question by question, from what `scripts.evaluate` wrote: e.g. an RL checkpoint
against its warm start evaluated in another run, on the same `--qa`, `--limit` and `--sample` questions.
Prints both methods' result rows (EM, F1, cover-EM, own searches, retrieval recall; per dataset, `all` and
`multi-hop`), their bootstrap intervals and the paired difference A − B over the questions both answered
(matched by dataset and id, never by position). Starts nothing and evaluates nothing again.

    .venv/bin/python -m scripts.compare_evals runs/<rl run>/eval-test runs/<warm-start run>/eval-test \
        [--names rl warm_start] [--out paired.md]

An argument is an evaluation directory (or its predictions.jsonl), optionally `:METHOD` (default `policy`).
`--by-search` adds where A's own search mattered: the paired questions split by whether the initial top-k held a
gold answer and whether A's own search found a gold-holding document beyond it, with both methods' F1 and the
paired difference per part (e.g. a policy against its own `no_search`: does it answer from what it found?).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipelines.eval_rows import (
    ALL,
    add_intervals,
    compute_rows,
    format_intervals_markdown,
    format_markdown,
    records_from_predictions,
)
from pipelines.eval_stats import paired_by_question, paired_difference
from recipes.metrics import f1_score

SEARCH_PARTS = (
    (True, True, "top-k holds a gold answer; A's search found another"),
    (True, False, "top-k holds a gold answer; A's search found none"),
    (False, True, "top-k holds none; A's search found one"),
    (False, False, "top-k holds none; nor did A's search"),
)
"""(initial_hit, found_by_search, label): the parts of `by_search`, from A's `search` record."""


def parse_source(arg: str) -> tuple[Path, str]:
    """`DIR[:METHOD]` or `FILE[:METHOD]` → (the predictions.jsonl path, the method; default `policy`).

    Raises:
        FileNotFoundError: no predictions.jsonl there (the message names the path looked at).
    """
    path, method = arg, "policy"
    if ":" in arg and not Path(arg).exists():
        path, method = arg.rsplit(":", 1)
    p = Path(path)
    if p.is_dir():
        p = p / "predictions.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: pass an evaluation directory that scripts.evaluate wrote "
                                "(its --out), or its predictions.jsonl, optionally with :METHOD")
    return p, method


def compare(a: str, b: str, names: tuple[str, str] | None = None) -> tuple[list[dict], str]:
    """The paired rows and their Markdown for evaluations `a` and `b` (`DIR[:METHOD]` each).

    Returns:
        (rows, markdown): `add_intervals` rows for both methods, A's pooled rows carrying `paired[B]`
        ({"n", "em", "f1", "cover_em"}: [mean(A − B), lo, hi], 95% percentile bootstrap, 2000 resamples).
    Raises:
        FileNotFoundError: see `parse_source`.
        ValueError: a method missing from its file, the two names equal, or no question in both.
    """
    (pa, ma), (pb, mb) = parse_source(a), parse_source(b)
    na, nb = _row_names(ma, mb, names)
    if na == nb:
        raise ValueError(f"--names gives the same name twice ({na!r}); name A and B apart")
    records = (records_from_predictions(_lines(pa), ma, as_method=na, source=str(pa))
               + records_from_predictions(_lines(pb), mb, as_method=nb, source=str(pb)))
    rows = add_intervals(compute_rows(records), records, pairs=((na, nb),))
    if not any(nb in r.get("paired", {}) for r in rows):
        raise ValueError(f"{pa} and {pb} share no question (dataset and id): evaluate both on the same --qa, "
                         "--limit and --sample")
    title = f"{na} = {pa.parent}:{ma}; {nb} = {pb.parent}:{mb}"
    return rows, format_markdown(rows, title) + "\n" + format_intervals_markdown(rows)


def by_search(a: str, b: str, names: tuple[str, str] | None = None) -> tuple[list[dict], str]:
    """Paired F1 of `a` and `b` (`DIR[:METHOD]` each) on the questions both answered, split by A's search record:
    whether the initial top-k held a gold answer (`initial_hit`) and whether A's own search found a gold-holding
    document beyond it (`found_by_search`), `SEARCH_PARTS`.

    Returns:
        (parts, markdown): one dict per part with questions ("n"), "f1_a", "f1_b" (mean answer F1 in [0, 1]) and
        "paired" ([mean(A − B), lo, hi], 95% percentile bootstrap; None for fewer than 2 questions).
    Raises:
        FileNotFoundError: see `parse_source`.
        ValueError: a method missing from its file, no question in both, or A's lines without `search`
            (a method that does not search, e.g. naive RAG or direct inference).
    """
    (pa, ma), (pb, mb) = parse_source(a), parse_source(b)
    na, nb = _row_names(ma, mb, names)
    la, lb = _method_lines(pa, ma), _method_lines(pb, mb)
    if not all(isinstance(r.get("search"), dict) and "initial_hit" in r["search"] for r in la.values()):
        raise ValueError(f"{pa}: {ma} lines carry no search record (initial_hit, found_by_search); put the method "
                         "that searches first")
    if not la.keys() & lb.keys():
        raise ValueError(f"{pa} and {pb} share no question (dataset and id): evaluate both on the same --qa, "
                         "--limit and --sample")
    keys, f1a, f1b = paired_by_question({k: f1_score(r["answer"] or "", r["golden_answers"]) for k, r in la.items()},
                                        {k: f1_score(r["answer"] or "", r["golden_answers"]) for k, r in lb.items()})
    parts = []
    for hit, found, label in SEARCH_PARTS:
        idx = [i for i, k in enumerate(keys)
               if bool(la[k]["search"]["initial_hit"]) is hit and bool(la[k]["search"]["found_by_search"]) is found]
        xa, xb = f1a[idx], f1b[idx]
        parts.append({"part": label, "n": len(idx), "f1_a": float(xa.mean()) if idx else None,
                      "f1_b": float(xb.mean()) if idx else None,
                      "paired": [float(v) for v in paired_difference(xa, xb)] if len(idx) > 1 else None})
    lines = [f"Answer F1 by A's search ({na} = {pa.parent}:{ma}; {nb} = {pb.parent}:{mb}; {ALL}: {len(keys)} "
             "questions):", "", f"| part | questions | {na} F1 | {nb} F1 | {na} − {nb}, 95% CI |",
             "| --- | ---: | ---: | ---: | --- |"]
    for p in parts:
        cells = ("–", "–", "–") if p["n"] == 0 else (
            f"{p['f1_a']:.3f}", f"{p['f1_b']:.3f}",
            "–" if p["paired"] is None else "{:.3f} [{:.3f}, {:.3f}]".format(*p["paired"]))
        lines.append(f"| {p['part']} | {p['n']} | " + " | ".join(cells) + " |")
    return parts, "\n".join(lines) + "\n"


def _method_lines(path: Path, method: str) -> dict[tuple[str, str, int], dict]:
    """`method`'s lines of `path` keyed by (dataset, id, k): k counts earlier lines with that dataset and id."""
    lines = _lines(path)
    records_from_predictions(lines, method, source=str(path))  # the same checks: the method is there, fields too
    out: dict[tuple[str, str, int], dict] = {}
    seen: dict[tuple[str, str], int] = {}
    for r in lines:
        if r.get("method") == method:
            q = (r["dataset"], str(r.get("id", "")))
            seen[q] = seen.get(q, -1) + 1
            out[(*q, seen[q])] = r
    return out


def _row_names(ma: str, mb: str, names: tuple[str, str] | None) -> tuple[str, str]:
    """`names`, else the two methods, told apart as METHOD (A) / (B) when they are the same."""
    return names or ((ma, mb) if ma != mb else (f"{ma} (A)", f"{mb} (B)"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", metavar="A", help="evaluation directory or predictions.jsonl, [:METHOD] (default policy)")
    parser.add_argument("b", metavar="B", help="the one to pair against: A − B")
    parser.add_argument("--names", nargs=2, metavar=("NAME_A", "NAME_B"), default=None,
                        help="row names (default: the methods; METHOD (A) / (B) when they are the same)")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the Markdown here")
    parser.add_argument("--by-search", action="store_true",
                        help="also split the paired questions by A's search: initial top-k hit, own search found")
    args = parser.parse_args(argv)
    names = tuple(args.names) if args.names else None
    try:
        _, md = compare(args.a, args.b, names)
        if args.by_search:
            md += "\n" + by_search(args.a, args.b, names)[1]
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(md, end="")
    if args.out:
        Path(args.out).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
