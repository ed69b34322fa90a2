"""Could a searcher tell the documents that hold the answer from what it can see? Question overlap, from saved rollouts.

    .venv/bin/python -m scripts.probes.s3_overlap_signal runs/<run> [--steps 49-64] [--json]

The expert selects what holds the answer by reading the gold, which a searcher never sees. This probe
asks how far one signal a searcher does see separates those documents: a document's `overlap`, the share of the
question's content words (`recipes.expert.key_words`) found in its title and text (normalized as EM normalizes).
For each block a selection chooses from (`initial`: the top-k before turn 1; `search`: a search's results,
`scripts.probes.s3_selection_by_gold`), over every document shown in it:
- `docs`, `gold` (documents holding a gold answer, `recipes.search_metrics.doc_holds_answer`, s3's span check);
- `auc`: the probability that a gold-holding document has the higher overlap than one holding none (ties count
  half; 0.5 = no signal, 1 = a threshold separates them);
- per threshold t: `selected` (documents with overlap ≥ t), `precision` (their gold share), `recall` (share of the
  gold-holding documents kept), the rule "keep a document when overlap ≥ t" would give.

Reads what `s3_selection_by_gold` reads (config, `rollouts/step-<n>.jsonl.gz`, the run's corpus); no Ray, no engine,
no index. Raises (exit 2): no config or rollouts, a run whose recipe is not s3, a step range with no saved step, a
missing data pack.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from scripts.probes.s3_selection_by_gold import BLOCKS, _blocks, doc_lookup, run_probe

THRESHOLDS = (0.2, 0.4, 0.6, 0.8)


def overlap(words: set[str], title: str, text: str) -> float:
    """Share (0-1) of `words` (the question's content words, `recipes.expert.key_words`) present in the document's
    normalized title + text; 0 for an empty `words`."""
    from recipes.metrics import normalize_answer

    return len(words & set(normalize_answer(f"{title} {text}").split())) / len(words) if words else 0.0


def auc(scores: Sequence[tuple[float, bool]]) -> float | None:
    """Mann-Whitney AUC of `(score, positive)` pairs: P(score of a positive > score of a negative), ties half.
    None when either class is empty."""
    ordered = sorted(scores, key=lambda s: s[0])
    ranks: list[float] = [0.0] * len(ordered)
    i = 0
    while i < len(ordered):  # average rank over each run of tied scores
        j = i
        while j < len(ordered) and ordered[j][0] == ordered[i][0]:
            j += 1
        ranks[i:j] = [(i + j + 1) / 2] * (j - i)
        i = j
    n_pos = sum(p for _, p in ordered)
    n_neg = len(ordered) - n_pos
    if not n_pos or not n_neg:
        return None
    rank_sum = sum(r for r, (_, p) in zip(ranks, ordered) if p)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def overlap_signal(trajectories: Iterable[dict], topk: int, doc: Any, holds_gold: Any,
                   thresholds: Sequence[float] = THRESHOLDS) -> dict[str, Any]:
    """`{block: {"docs", "gold", "auc", "thresholds": [{"t", "selected", "precision", "recall"}]}}` over every
    document shown in each selection block of `trajectories` (`Trajectory.to_json` rows). `doc(doc_id)` gives a
    `recipes.base.Doc`; `holds_gold(doc, golden_answers)` says whether it holds a gold answer."""
    from recipes.expert import key_words

    scores: dict[str, list[tuple[float, bool]]] = {b: [] for b in BLOCKS}
    for t in trajectories:
        words, golds = set(key_words(t.get("question") or "")), t.get("golden_answers") or []
        for block, ids, _ in _blocks(t, topk):
            for doc_id in ids:
                d = doc(doc_id)
                scores[block].append((overlap(words, d.title, d.text), bool(holds_gold(d, golds))))
    out: dict[str, Any] = {}
    for block, rows in scores.items():
        gold = sum(p for _, p in rows)
        cuts = []
        for th in thresholds:
            kept = [p for s, p in rows if s >= th]
            cuts.append({"t": th, "selected": len(kept), "precision": sum(kept) / len(kept) if kept else None,
                         "recall": sum(kept) / gold if gold else None})
        out[block] = {"docs": len(rows), "gold": gold, "auc": auc(rows), "thresholds": cuts}
    return out


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _table(out: dict[str, Any]) -> None:
    print("| block | docs | gold | AUC | " + " | ".join(f"overlap ≥ {t}: kept, precision, recall" for t in THRESHOLDS)
          + " |")
    print("| --- | ---: | ---: | ---: |" + " --- |" * len(THRESHOLDS))
    for block, r in out.items():
        cells = [f"{c['selected']}, {_f(c['precision'])}, {_f(c['recall'])}" for c in r["thresholds"]]
        print(f"| {block} | {r['docs']} | {r['gold']} | {_f(r['auc'])} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    """Print the table (or one JSON object with --json); exit 2 with an `error:` line on a bad run or range."""
    from recipes.search_metrics import doc_holds_answer

    return run_probe(argv, "python -m scripts.probes.s3_overlap_signal", __doc__.split("\n")[0],
                     lambda _, topk, trajectories, corpus: overlap_signal(trajectories, topk, doc_lookup(corpus),
                                                                         doc_holds_answer), _table)


if __name__ == "__main__":
    sys.exit(main())
