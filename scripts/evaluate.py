"""Evaluate a trained searcher and the baselines on a QA file (EM, F1, cover-EM, span_check, GenAcc).

    .venv/bin/python -m scripts.evaluate --config CONFIG [--checkpoint DIR] --qa FILE --out DIR \\
        [--limit N [--sample]] [--methods direct,naive_rag,policy] [key=value ...]

The policy runs recipe `train.recipe` on the checkpoint's `policy/hf/` model (or on `learner.model`
without `--checkpoint`); `direct` and `naive_rag` answer with the frozen generator (`frozen.model`);
`untrained` runs the recipe on `learner.model`; `warm_start` on the warm-started policy of the
`--checkpoint` run (`train.warm_start`: the "warm start only" row); `no_search` is the policy with its own
searches off; `expert` is the recipe's rule-based expert in the policy's place (it reads the gold answers: a
ceiling, not a baseline); `rstool` is R-Search's tool mode.
For s3 the frozen generator answers from the searcher's selected context. GenAcc's judge is
`frozen.judge_model` (default `frozen.model`).
`--qa` is a file path or a data pack file name (e.g. test.jsonl.gz). Writes `results.json`,
`results.md` and `predictions.jsonl` to `--out` and prints the table. See `pipelines/evaluate.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipelines.eval_inputs import METHODS
from scripts.cli import announce_machine, parse_config, user_errors


def main(argv: list[str] | None = None) -> int:
    """Entry point: evaluate a checkpoint and the baselines on a QA file and print the results table.

    Usage: .venv/bin/python -m scripts.evaluate --config CONFIG [--checkpoint DIR] --qa FILE --out DIR
        [--limit N [--sample]] [--methods direct,naive_rag,policy] [key=value ...]
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=None, metavar="DIR",
                        help="learner checkpoint (holds policy/hf/) or a Hugging Face model directory; "
                             "default: the untrained learner.model")
    parser.add_argument("--qa", required=True, metavar="FILE", help="QA file (path or data pack file name)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="first N questions (default: all)")
    parser.add_argument("--sample", action="store_true",
                        help="with --limit: N questions spread over the file's datasets (seeded by `seed`)")
    parser.add_argument("--methods", default="direct,naive_rag,policy",
                        help="comma-separated, of: " + ", ".join(METHODS) + " (default: %(default)s); "
                             "results.md gives paired 95%% intervals of policy - untrained, - warm_start, "
                             "- naive_rag, - no_search, warm_start - untrained and expert - naive_rag, for those "
                             "evaluated")
    args, cfg = parse_config(parser, argv)
    announce_machine(cfg)
    from pipelines.evaluate import EvaluationError, evaluate, format_markdown, timing_line

    with user_errors():
        try:
            rows = evaluate(cfg, args.qa, args.out, checkpoint=args.checkpoint, limit=args.limit,
                            methods=args.methods, sample=args.sample)
        except EvaluationError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    print(format_markdown(rows), end="", flush=True)
    timing = Path(args.out) / "timing.json"
    if timing.exists():  # seconds per question of each method, as evaluate() measured them
        print(timing_line(json.loads(timing.read_text())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
