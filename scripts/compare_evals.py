"""Two evaluations paired question by question, from what `scripts.evaluate` wrote: e.g. an RL checkpoint
against its warm start evaluated in another run, on the same `--qa`, `--limit` and `--sample` questions.
Prints both methods' result rows (EM, F1, cover-EM, own searches, retrieval recall; per dataset, `all` and
`multi-hop`), their bootstrap intervals and the paired difference A − B over the questions both answered
(matched by dataset and id, never by position). Starts nothing and evaluates nothing again.

    .venv/bin/python -m scripts.compare_evals runs/<rl run>/eval-test runs/<warm-start run>/eval-test \
        [--names rl warm_start] [--out paired.md]

An argument is an evaluation directory (or its predictions.jsonl), optionally `:METHOD` (default `policy`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipelines.eval_rows import (
    add_intervals,
    compute_rows,
    format_intervals_markdown,
    format_markdown,
    records_from_predictions,
)


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
    na, nb = names or ((ma, mb) if ma != mb else (f"{ma} (A)", f"{mb} (B)"))
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


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", metavar="A", help="evaluation directory or predictions.jsonl, [:METHOD] (default policy)")
    parser.add_argument("b", metavar="B", help="the one to pair against: A − B")
    parser.add_argument("--names", nargs=2, metavar=("NAME_A", "NAME_B"), default=None,
                        help="row names (default: the methods; METHOD (A) / (B) when they are the same)")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the Markdown here")
    args = parser.parse_args(argv)
    try:
        _, md = compare(args.a, args.b, tuple(args.names) if args.names else None)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(md, end="")
    if args.out:
        Path(args.out).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
