"""What s3's document selection could gain: the frozen generator's answers from each subset of the top-k.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.probes.selection [--config configs/s3_main_cpu.yaml] \
        [--qa dev.jsonl.gz] [--questions 64] [key=value ...]

For `--questions` questions of `--qa` (a seeded sample spread over the datasets, `seed`), the question's
top-k documents (`retrieval.topk`, the config's index, searched in this process) and the frozen
generator (`frozen.model` on `eval.frozen_backend`, else `frozen.backend`; s3 Fig. 12 prompt, greedy)
answering from every non-empty subset of them, in their order. Prints one row per subset (answer F1,
cover-EM, EM over the questions) and the oracle row: the best subset per question by F1, the most any
selection of the initial documents can reach. The all-documents row is naive RAG (s3 §4.1). Measure
this before training an s3 searcher on the initial documents alone: if no subset beats naive RAG on
average, selection alone has nothing general to learn.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from pathlib import Path

from scripts.cli import parse_config, user_errors


def subset_table(scores: dict[tuple[int, ...], list[dict[str, float]]]) -> list[dict]:
    """Mean metrics per subset plus the per-question oracle (best F1, its cover-EM and EM).

    Args:
        scores: subset (1-based doc positions) → one {"f1", "cover_em", "em"} per question, same order.
    Returns:
        rows {"subset", "f1", "cover_em", "em"}; the last row's subset is "oracle".
    """
    rows = []
    for subset, per_q in scores.items():
        n = max(1, len(per_q))
        rows.append({"subset": ",".join(map(str, subset)), **{m: sum(s[m] for s in per_q) / n
                                                             for m in ("f1", "cover_em", "em")}})
    per_question = list(zip(*scores.values()))
    best = [max(q, key=lambda s: (s["f1"], s["cover_em"])) for q in per_question]
    n = max(1, len(best))
    rows.append({"subset": "oracle", **{m: sum(s[m] for s in best) / n for m in ("f1", "cover_em", "em")}})
    return rows


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, retrieve, generate, print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.probes.selection", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qa", default="dev.jsonl.gz", help="QA file (path or data pack file name)")
    parser.add_argument("--questions", type=int, default=64, help="questions, spread over the datasets")
    parser.add_argument("--out", default="runs/probe_selection.json", help="JSON of the rows")
    args, cfg = parse_config(parser, argv, default_config="configs/s3_main_cpu.yaml")

    from actors.engines.spec import EngineHolder, engine_spec
    from actors.frozen.scorer import FrozenLLM
    from actors.retrieval.index_store import shard_name
    from actors.retrieval.shard import ShardSearcher
    from pipelines.evaluate import eval_frozen_config, load_questions
    from recipes.base import ANSWER_PROMPT, Doc, format_docs
    from recipes.metrics import cover_exact_match, exact_match, f1_score

    from pipelines.build_index import ready_index, require_index_type

    with user_errors():
        require_index_type(cfg, ("bm25",), "reads one BM25 shard in this process", shards=1)
        questions = load_questions(args.qa, cfg.data.dir, args.questions, sample_seed=cfg.seed)
        manifest = ready_index(cfg)  # built (resuming) when missing
    if len(manifest.shards) != 1 or manifest.metric != "bm25":
        parser.exit(2, "error: index.dir: this probe reads a one-shard BM25 index; use index.type=bm25 index.num_shards=1\n")
    shard = ShardSearcher(str(Path(cfg.index.dir) / shard_name(0)))
    k = cfg.retrieval.topk
    subsets = [s for r in range(1, k + 1) for s in itertools.combinations(range(1, k + 1), r)]

    async def run() -> dict[tuple[int, ...], list[dict[str, float]]]:
        holder = EngineHolder(engine_spec(eval_frozen_config(cfg), "generator"))
        llm = FrozenLLM(await holder.get(), cfg.frozen.model, None, cfg.frozen.max_answer_tokens)
        try:
            scores: dict[tuple[int, ...], list[dict[str, float]]] = {s: [] for s in subsets}
            for q in questions:
                _, ids, docs = shard.search_with_docs([q["question"]], k)
                top = [Doc(str(i), docs[int(i)]["title"], docs[int(i)]["text"]) for i in ids[0] if i >= 0]
                answers = await asyncio.gather(*[
                    llm.generate_answer(q["question"], format_docs([top[j - 1] for j in s if j <= len(top)]),
                                        ANSWER_PROMPT) for s in subsets])
                golds = list(q["golden_answers"])
                for s, a in zip(subsets, answers):
                    scores[s].append({"f1": f1_score(a, golds), "cover_em": cover_exact_match(a, golds),
                                      "em": exact_match(a, golds)})
            return scores
        finally:
            await holder.shutdown()

    rows = subset_table(asyncio.run(run()))
    print(f"| documents (of the top-{k}) | F1 | cover-EM | EM |\n| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['subset']} | {r['f1']:.3f} | {r['cover_em']:.3f} | {r['em']:.3f} |")
    print(f"\n{len(questions)} questions of {args.qa}; generator {cfg.frozen.model}; "
          f"all {k} documents = naive RAG")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
