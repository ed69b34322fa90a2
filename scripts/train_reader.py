"""Fine-tune a reader to serve as s3's frozen generator (`pipelines.reader_sft`).

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.train_reader [--config configs/s3_main_cpu.yaml] \
        [--questions 1000] [--depth 10] [--long-docs 0] [--epochs 1] [--lr 2e-5] [--out runs/reader-<time>] [key=value ...]

For `--questions` training questions (`data.train`, a sample seeded by `seed`) the question's top-`--depth`
documents (the config's one-shard BM25 index, searched in this process) give the contexts of
`pipelines.reader_sft.reader_contexts` (the top-k when it holds a gold answer, an s3-like selection
around the first gold-holding document, and with `--long-docs N` the top-k followed by more documents, N in
all); `frozen.model` (or `--model`) learns to answer them in the generator's own prompt (s3 Fig. 12) with the policy learner's supervised update on one rank. Prints the
override that serves it, `frozen.model=<out>/policy/hf`; keep `frozen.judge_model` on the old generator so that
GenAcc's judge does not change with it. Stops on SIGTERM / Ctrl-C with its learner shut down.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from scripts.cli import parse_config, user_errors


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, retrieve, build the rows, train, print where the reader is (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.train_reader", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=1000, help="training questions (a seeded sample)")
    parser.add_argument("--depth", type=int, default=10, help="documents retrieved per question (>= retrieval.topk)")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the rows")
    parser.add_argument("--lr", type=float, default=2e-5, help="learning rate of every optimizer step")
    parser.add_argument("--long-docs", type=int, default=0,
                        help="also a context of this many documents: the top-k then more of the top --depth documents "
                             "(as an s3 searcher that leaves every block whole builds one); 0 = none")
    parser.add_argument("--max-tokens", type=int, default=1024, help="rows longer than this (tokens) are dropped")
    parser.add_argument("--model", default=None, help="starting weights (default: frozen.model)")
    parser.add_argument("--out", default=None, help="output directory (default runs/reader-<time>)")
    args, cfg = parse_config(parser, argv, default_config="configs/s3_main_cpu.yaml")
    if args.questions < 1 or args.depth < cfg.retrieval.topk or args.epochs < 1:
        parser.exit(2, f"error: need --questions >= 1, --depth >= retrieval.topk ({cfg.retrieval.topk}) "
                       "and --epochs >= 1\n")
    if args.long_docs and not cfg.retrieval.topk < args.long_docs <= args.depth:
        parser.exit(2, f"error: --long-docs ({args.long_docs}) must be 0 or above retrieval.topk "
                       f"({cfg.retrieval.topk}) and at most --depth ({args.depth})\n")

    from transformers import AutoTokenizer

    from actors.engines.models import resolve_model
    from actors.retrieval.index_store import shard_name
    from actors.retrieval.shard import ShardSearcher
    from pipelines.build_index import ready_index, require_index_type
    from pipelines.data import iter_qa, pack_file
    from pipelines.reader_sft import reader_contexts, reader_rows, train_reader
    from recipes import get_recipe
    from recipes.base import Doc

    with user_errors():
        require_index_type(cfg, ("bm25",), "reads one BM25 shard in this process", shards=1)
        pool = list(iter_qa(pack_file(cfg.data.train, cfg.data.dir)))
        manifest = ready_index(cfg)
    if len(manifest.shards) != 1 or manifest.metric != "bm25":
        parser.exit(2, "error: index.dir: this script reads a one-shard BM25 index; use index.type=bm25 index.num_shards=1\n")
    model = resolve_model(args.model or cfg.frozen.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat = bool(getattr(tokenizer, "chat_template", None))  # as FrozenLLM decides
    rng = random.Random(cfg.seed)
    questions = rng.sample(pool, min(args.questions, len(pool)))
    shard = ShardSearcher(str(Path(cfg.index.dir) / shard_name(0)))
    recipe = get_recipe("s3")
    rows, with_context = [], 0
    for q in questions:
        _, ids, docs = shard.search_with_docs([q.question], args.depth)
        ranked = [Doc(str(i), docs[int(i)]["title"], docs[int(i)]["text"]) for i in ids[0] if i >= 0]
        contexts = reader_contexts(ranked, q.golden_answers, cfg.retrieval.topk, rng, args.long_docs)
        with_context += bool(contexts)
        rows += reader_rows(q.question, q.id, q.golden_answers, contexts, recipe.format_docs, tokenizer, chat,
                            args.max_tokens)
    if not rows:
        parser.exit(2, f"error: no question's top-{args.depth} holds a gold answer; nothing to train on\n")
    out = Path(args.out or f"runs/reader-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "reader_questions.json").write_text(json.dumps([q.id for q in questions]))
    print(f"{len(rows)} rows from {with_context} of {len(questions)} questions (a gold answer in the top-{args.depth})",
          flush=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
    summary = train_reader(cfg, rows, str(out), model=model, pad_token_id=int(pad), epochs=args.epochs, lr=args.lr,
                           seed=cfg.seed)
    summary.update({"questions": len(questions), "questions_with_context": with_context, "base_model": model,
                    "lr": args.lr, "epochs": args.epochs, "depth": args.depth, "long_docs": args.long_docs,
                    "max_tokens": args.max_tokens})
    (out / "reader.json").write_text(json.dumps(summary, indent=1))
    print(f"reader: NLL {summary['nll_first']:.3f} -> {summary['nll_last']:.3f} in {summary['update_s']:.0f} s; "
          f"serve it with frozen.model={summary['model_dir']} frozen.judge_model={cfg.frozen.judge_model or cfg.frozen.model}")


if __name__ == "__main__":
    main()
