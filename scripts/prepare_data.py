"""Prepare training sets: the s3 naive-RAG filter, R1-Searcher difficulty selection, FlashRAG import.

    .venv/bin/python -m scripts.prepare_data s3 [--split train | --input FILE] [--out FILE.jsonl.gz] [key=value ...]
    .venv/bin/python -m scripts.prepare_data r1_difficulty [--split train | --input FILE] [--out-dir DIR] [--n 8] ...
    .venv/bin/python -m scripts.prepare_data import_flashrag (--qa FILE --dataset NAME | --corpus FILE) --out F.jsonl.gz

s3: drops yes/no questions and questions the frozen generator already answers from naive top-k
RAG (s3 §4.1); kept rows get `rag_gen_acc`. Baselines are cached (`<out>.cache.jsonl`): a rerun
computes only what is missing. Report: `<out>.report.json`.

r1_difficulty: rounds of --n rollouts of the reference policy (prepare.r1_selection_model, else
learner.model; r1_searcher recipe with the §2.1 data-selection prompt) until a correct answer; easy < 10 rollouts, medium 10-20, hard > 20 (R1-Searcher §2.1); then the
Table-1 mix per stage. Writes difficulty.jsonl.gz, stage1/stage2.jsonl.gz, cache.jsonl and
report.json to --out-dir.

Config: --config and key=value overrides (index.dir, retrieval.* incl. topk, frozen.*, rollout.*, learner.model,
train.recipe_options when train.recipe matches, seed, ray.*). Mistakes exit 2 with one `error:` line,
before any actor starts.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from configs import DEFAULT_CONFIG, ConfigError, add_config_args, config_from_args
from scripts.cli import sigterm_as_interrupt, user_errors

SPLITS = ("train", "dev", "test")


def _chat(value: str) -> bool | None:
    v = value.lower()
    if v not in ("auto", "true", "false"):
        raise argparse.ArgumentTypeError(f"expected auto, true or false, got {value!r}")
    return None if v == "auto" else v == "true"


def _mapping(value: str) -> tuple[str, str]:
    name, sep, target = value.partition("=")
    if not sep or not name.strip() or not target.strip():
        raise argparse.ArgumentTypeError(
            f"expected NAME=TABLE_DATASET (e.g. hotpotqa+2wiki_train=hotpotqa), got {value!r}")
    return name.strip(), target.strip()


def build_parser() -> argparse.ArgumentParser:
    """The CLI parser: subcommands s3, r1_difficulty and import_flashrag, each with config options."""
    head, _, rest = __doc__.partition("\n")
    parser = argparse.ArgumentParser(prog="python -m scripts.prepare_data", description=head,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=rest)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="{s3,r1_difficulty,import_flashrag}")

    def source_args(p: argparse.ArgumentParser) -> None:
        """Add the input options to `p`: --split or --input (exclusive), --limit and --sample."""
        src = p.add_mutually_exclusive_group()
        src.add_argument("--split", choices=SPLITS, default=None, help="data pack split (default train; data.<split>)")
        src.add_argument("--input", default=None, help="a QA file (pack or FlashRAG format) instead of a pack split")
        p.add_argument("--limit", type=int, default=None, help="first N questions only")
        p.add_argument("--sample", action="store_true",
                       help="with --limit: N questions spread over the file's datasets (seeded by `seed`)")

    s3 = sub.add_parser("s3", help="s3 training set: naive-RAG GenAcc baseline + filter (s3 §4.1)")
    source_args(s3)
    s3.add_argument("--out", default=None, help="output *.jsonl.gz (default <run_dir>/prepared/s3_<split>.jsonl.gz)")
    s3.add_argument("--cache", default=None, help="baseline cache (default <out>.cache.jsonl)")
    s3.add_argument("--report", default=None, help="report JSON (default <out>.report.json)")
    s3.add_argument("--concurrency", type=int, default=16, help="questions in flight (default 16)")
    s3.add_argument("--keep-answered", type=float, default=0.0, metavar="SHARE",
                    help="keep this share (0..1, seeded by `seed`) of the questions naive RAG already answers, "
                         "with rag_gen_acc 1: Eq. 1 then costs a searcher that loses RAG's answer (default 0, the paper's)")
    s3.add_argument("--chat", type=_chat, default=None, help="frozen LLM chat template: auto|true|false (default auto)")
    add_config_args(s3, default_config=str(DEFAULT_CONFIG))

    r1 = sub.add_parser("r1_difficulty", help="R1-Searcher difficulty buckets + Table-1 mix (§2.1)")
    source_args(r1)
    r1.add_argument("--out-dir", default=None, help="output folder (default <run_dir>/prepared/r1_difficulty_<split>)")
    r1.add_argument("--n", type=int, default=8, help="rollouts per question per round (default 8)")
    r1.add_argument("--max-rollouts", type=int, default=None,
                    help="rollouts per question at most (default: smallest multiple of n above --hard-above)")
    r1.add_argument("--metric", choices=("cover_em", "span_check", "em", "f1"), default="cover_em",
                    help="answer correctness (default cover_em, the paper's ACC_R)")
    r1.add_argument("--f1-threshold", type=float, default=1.0, help="with --metric f1: correct if F1 >= this")
    r1.add_argument("--easy-below", type=int, default=10, help="easy: first correct rollout before this (default 10)")
    r1.add_argument("--hard-above", type=int, default=20, help="hard: no correct rollout up to this (default 20)")
    r1.add_argument("--stages", default="1,2", help="Table-1 stages to write (default 1,2)")
    r1.add_argument("--stage1-total", type=int, default=None, help="stage-1 questions (default Table 1's 350)")
    r1.add_argument("--stage2-total", type=int, default=None, help="stage-2 questions (default Table 1's 8,148)")
    r1.add_argument("--dataset-map", type=_mapping, action="append", default=[], metavar="NAME=TABLE_DATASET",
                    help="count dataset NAME as a Table-1 dataset (hotpotqa, 2wikimultihopqa); repeatable")
    r1.add_argument("--model", default=None, help="reference policy (default prepare.r1_selection_model, else learner.model)")
    r1.add_argument("--questions-per-call", type=int, default=32, help="questions per RolloutWorker call (default 32)")
    add_config_args(r1, default_config=str(DEFAULT_CONFIG))

    fr = sub.add_parser("import_flashrag", help="FlashRAG QA file or corpus -> data pack format")
    what = fr.add_mutually_exclusive_group(required=True)
    what.add_argument("--qa", default=None, help="FlashRAG QA file {id, question, golden_answers, metadata}")
    what.add_argument("--corpus", default=None, help="FlashRAG corpus {id, contents} or {id, title, text}")
    fr.add_argument("--dataset", default=None, help="dataset name (with --qa): the rows' source and id prefix")
    fr.add_argument("--out", required=True, help="output *.jsonl.gz")
    fr.add_argument("--limit", type=int, default=None, help="first N rows only")
    fr.add_argument("--no-prefix-ids", action="store_true", help="keep QA ids as they are (no '<dataset>:' prefix)")
    add_config_args(fr, default_config=str(DEFAULT_CONFIG))
    return parser


def _input_file(args, cfg) -> tuple[Path, str]:
    """(QA file, a short name for default outputs)."""
    from pipelines.data import pack_file

    if args.input:
        path = Path(args.input)
        if not path.is_file():
            raise FileNotFoundError(f"--input {path}: no such file")
        name = path.name.split(".")[0]
        return path, name
    split = args.split or "train"
    return pack_file(getattr(cfg.data, split), cfg.data.dir), split


def _stages(text: str) -> list[int]:
    from pipelines.prepare.common import PrepareError
    from pipelines.prepare.r1_difficulty import R1_TABLE1

    try:
        stages = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise PrepareError(f"--stages {text!r}: expected a comma-separated list such as 1,2") from None
    bad = [s for s in stages if s not in R1_TABLE1]
    if not stages or bad:
        raise PrepareError(f"--stages {text!r}: Table 1 has stages {sorted(R1_TABLE1)}")
    return stages


def main(argv: list[str] | None = None) -> int:
    """Entry point: prepare a training set (s3 filter, R1-Searcher difficulty, FlashRAG import); exit 2 on mistakes.

    Usage: .venv/bin/python -m scripts.prepare_data s3 [--split train | --input FILE] [--out FILE.jsonl.gz] [key=value ...]
       or: .venv/bin/python -m scripts.prepare_data r1_difficulty [--split train | --input FILE] [--out-dir DIR] [--n 8] ...
       or: .venv/bin/python -m scripts.prepare_data import_flashrag (--qa FILE --dataset NAME | --corpus FILE) --out F.jsonl.gz
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)  # as Ctrl-C: the actor session's cleanup runs
    from pipelines.prepare.common import PrepareError
    from pipelines.prepare.flashrag import import_flashrag_corpus, import_flashrag_qa
    from pipelines.prepare.r1_difficulty import prepare_r1_difficulty
    from pipelines.prepare.s3_filter import prepare_s3

    def say(msg: str) -> None:
        """Print a progress line, flushed."""
        print(msg, flush=True)

    try:
        with user_errors():
            if args.limit is not None and args.limit < 0:
                raise PrepareError(f"--limit must be >= 0, got {args.limit}")
            if getattr(args, "sample", False) and args.limit is None:  # import_flashrag has no --sample
                raise PrepareError("--sample needs --limit N (how many questions to sample)")
            if args.cmd == "import_flashrag":
                if args.qa:
                    if not args.dataset:
                        raise PrepareError("--qa needs --dataset NAME (the rows' source, e.g. --dataset nq)")
                    report = import_flashrag_qa(args.qa, args.out, args.dataset, limit=args.limit,
                                                prefix_ids=not args.no_prefix_ids)
                else:
                    report = import_flashrag_corpus(args.corpus, args.out, limit=args.limit)
            elif args.cmd == "s3":
                src, name = _input_file(args, cfg)
                out = Path(args.out) if args.out else Path(cfg.run_dir) / "prepared" / f"s3_{name}.jsonl.gz"
                report = prepare_s3(cfg, src, out, cache_path=args.cache, report_path=args.report,
                                    limit=args.limit, sample_seed=cfg.seed if args.sample else None,
                                    keep_answered=args.keep_answered, seed=cfg.seed,
                                    concurrency=args.concurrency, chat=args.chat, progress=say)
            else:
                src, name = _input_file(args, cfg)
                default_dir = Path(cfg.run_dir) / "prepared" / f"r1_difficulty_{name}"
                out_dir = Path(args.out_dir) if args.out_dir else default_dir
                totals = {1: args.stage1_total, 2: args.stage2_total}
                report = prepare_r1_difficulty(
                    cfg, src, out_dir, n=args.n, max_rollouts=args.max_rollouts, metric=args.metric,
                    f1_threshold=args.f1_threshold, easy_below=args.easy_below, hard_above=args.hard_above,
                    stage_totals={s: totals[s] for s in _stages(args.stages)}, dataset_aliases=dict(args.dataset_map),
                    model=args.model, limit=args.limit,
                    sample_seed=cfg.seed if args.sample else None, questions_per_call=args.questions_per_call, progress=say,
                )
    except (PrepareError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {k: report[k] for k in ("job", "counts", "rows", "output", "output_dir", "stages") if k in report}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
