"""The expert's ceiling: what the recipe's rule-based expert (the warm start's demonstrations) finds and answers.

    SEARCHRL_DATA=../shared/data .venv/bin/python -m scripts.probes.expert_ceiling --config configs/main_cpu.yaml \
        [--split train.jsonl.gz] [--questions 400] [key=value ...]

Runs `AgentLoop(expert=True)` in this process (no Ray, no engine: only the policy's tokenizer) against the
config's BM25 index (`index.dir`, built when missing) with the training recipe and options, on a seeded
sample of `--questions` questions spread over the datasets. Prints, per dataset and over all: the share of
questions the expert demonstrates, its own searches per question, retrieval recall (a shown document holds
a gold answer), the initial top-k's recall, the share where its own search found a gold-holding document,
gold-paragraph recall, and its answers' F1 over all questions (a question without a demonstration scores 0):
the most a policy that imitates it perfectly could reach on these questions. Override the recipe's options
as usual, e.g. `train.recipe_options.expert_searches=always train.recipe_options.fresh_docs=true`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import defaultdict
from typing import Any

from scripts.cli import parse_config, user_errors


class TokenizerOnly:
    """The part of an `Engine` the expert's agent loop reads: the tokenizer and a weight version (never generates)."""

    weight_version = 0

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    async def generate(self, *args: Any, **kwargs: Any):  # pragma: no cover - the expert writes every turn
        """Never called: the expert writes every turn. Raises RuntimeError."""
        raise RuntimeError("the expert's probe never asks the engine")


def bm25_searcher(index_dir: str):
    """`await search(query, k)` over every shard of a BM25 index in this process (hits merged by score)."""
    from pathlib import Path

    from actors.retrieval.shard import ShardSearcher

    shards = [ShardSearcher(str(p)) for p in sorted(Path(index_dir).glob("shard-*"))]

    async def search(query: str, k: int) -> list[dict]:
        hits = []
        for shard in shards:
            scores, ids, docs = shard.search_with_docs([query], k)
            hits += [{**docs[int(i)], "score": float(s)} for s, i in zip(scores[0], ids[0]) if i >= 0]
        return sorted(hits, key=lambda h: -h["score"])[:k]

    return search


def summarize(trajs: list[Any]) -> dict[str, dict[str, float]]:
    """Per dataset and `all`: questions, demonstrated share, own searches, retrieval / initial recall, found by
    search, gold-paragraph recall (rows listing gold paragraphs), context recall (recipes whose frozen generator
    reads a context: s3's selection holds a gold answer) and the answers' F1 (0 without a demonstration; s3's
    expert never answers, so 0 there)."""
    from recipes.metrics import f1_score

    groups: dict[str, list[Any]] = defaultdict(list)
    for t in trajs:
        groups[t.group_id.split("/", 1)[0]].append(t)
        groups["all"].append(t)
    out = {}
    for name, ts in sorted(groups.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        n = len(ts)
        s = [t.final["search"] for t in ts]
        demo = [t.finish_reason in ("answer", "complete") for t in ts]
        gold = [x["gold_paragraph_recall"] for x in s if x["gold_paragraph_recall"] is not None]
        out[name] = {
            "n": n, "demonstrated": sum(demo) / n,
            "own_searches": sum(x["own_searches"] for x in s) / n,
            "retrieval_recall": sum(x["retrieval_hit"] for x in s) / n,
            "initial_recall": sum(x["initial_hit"] for x in s) / n,
            "found_by_search": sum(x["found_by_search"] for x in s) / n,
            "gold_paragraph_recall": sum(gold) / len(gold) if gold else float("nan"),
            **({"context_recall": sum(bool(x["context_hit"]) for x in s) / n}
               if any(x.get("context_hit") is not None for x in s) else {}),
            "f1": sum(f1_score(t.final["answer"] or "", t.golden_answers) if d else 0.0
                      for t, d in zip(ts, demo)) / n,
        }
    return out


def undemonstrated_lines(trajs: list[Any], max_new_tokens_per_turn: int, max_total_tokens: int) -> list[str]:
    """Why the expert demonstrated nothing for some questions: one line giving the count of each stop reason
    other than an answer or completion, and, when turns did not fit (`EXPERT_TURN_OVER_LIMIT`), one naming the
    limits to raise; [] when every question was demonstrated."""
    from collections import Counter

    from actors.rollout.agent_loop import EXPERT_TURN_OVER_LIMIT

    reasons = Counter(t.finish_reason for t in trajs if t.finish_reason not in ("answer", "complete"))
    if not reasons:
        return []
    lines = ["not demonstrated: " + ", ".join(f"{n} {r}" for r, n in reasons.most_common())]
    if reasons[EXPERT_TURN_OVER_LIMIT]:
        lines.append(f"{reasons[EXPERT_TURN_OVER_LIMIT]} expert turns did not fit the limits: raise "
                     f"rollout.max_new_tokens_per_turn ({max_new_tokens_per_turn}) or rollout.max_total_tokens "
                     f"({max_total_tokens})")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.probes.expert_ceiling", description=__doc__.splitlines()[0])
    parser.add_argument("--split", default=None, help="QA file of the pack (default: data.train)")
    parser.add_argument("--questions", type=int, default=400, help="questions, a seeded sample (default 400)")
    parser.add_argument("--show", type=int, default=3, help="print this many demonstrations that searched")
    args, cfg = parse_config(parser, argv)
    from transformers import AutoTokenizer

    from actors.engines.base import Sampling
    from actors.engines.models import resolve_model
    from actors.rollout.agent_loop import AgentLoop, RolloutLimits
    from pipelines.build_index import ensure_index
    from pipelines.data import iter_qa, pack_file, spread_sample
    from recipes import get_recipe

    with user_errors():
        path = pack_file(args.split or cfg.data.train, cfg.data.dir)
    ensure_index(cfg)
    rows = [{"id": e.id, "question": e.question, "golden_answers": list(e.golden_answers), "dataset": e.dataset,
             "meta": e.meta} for e in iter_qa(path)]
    rows = spread_sample(rows, min(args.questions, len(rows)), seed=cfg.seed)
    recipe = get_recipe(cfg.train.recipe, cfg.recipe_config())
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.learner.model))
    ro = cfg.rollout
    loop = AgentLoop(TokenizerOnly(tokenizer), recipe, bm25_searcher(cfg.index.dir), Sampling(temperature=0.0),
                     RolloutLimits(ro.max_new_tokens_per_turn, ro.max_observation_tokens, ro.max_total_tokens),
                     chat=ro.chat, compute_reward=False, expert=True)
    t0 = time.perf_counter()
    trajs = asyncio.run(loop.run_batch(rows, 1))
    seconds = time.perf_counter() - t0
    table = summarize(trajs)
    keys = list(next(iter(table.values())))
    print(f"expert of {recipe.name} ({recipe.config.model_dump(include={'initial_search', 'max_turns', 'topk', 'fresh_docs', 'expert_searches'})}) "
          f"on {len(rows)} questions of {path.name}, {seconds:.0f} s")
    print("| dataset | " + " | ".join(keys) + " |")
    print("| --- |" + " ---: |" * len(keys))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.0f}" if k == "n" else f"{row[k]:.3f}" for k in keys) + " |")
    for line in undemonstrated_lines(trajs, ro.max_new_tokens_per_turn, ro.max_total_tokens):
        print(line)
    for t in [t for t in trajs if t.final["search"]["own_searches"] and t.finish_reason == "answer"][: args.show]:
        print(f"\n--- {t.group_id}: {t.question} (gold {t.golden_answers})")
        for turn in t.turns:
            print(f"  [{turn.action}] {turn.text.strip()[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
