"""What an episode's searches found: the measures of the search itself, the same for every recipe,
in training metrics, dev curves, evaluation tables and the finding reward term.

- `own_searches`: searches the policy wrote and the environment ran; the prompt's initial retrieval
  (`initial_search`: s3 §3.1's "begin with search", naive RAG) is not counted.
- `retrieval_hit`: some document shown in the episode (the initial top-k and every search's documents, as the
  policy read them) holds a gold answer as a token span (`recipes.metrics.span_check`): FlashRAG's retrieval
  recall, taken over the episode instead of one top-k list. The mean over questions is `retrieval_recall`.
- `initial_hit`: the initial top-k alone holds one (what the episode had before any search of its own).
- `found_by_search`: a document that a search of the policy's own returned, not among the initial documents,
  holds a gold answer (what searching added).
- `gold_paragraph_recall`: the share of the row's `context_ids` (HotpotQA-style gold paragraphs, data pack
  README) among the documents shown; None for rows that list none.
- `context_hit`: the documents a frozen generator reads (`Recipe.generator_context`: s3's selection, naive RAG's
  top-k) hold a gold answer; None where the policy answers itself. The mean is `context_recall`: what
  s3's selection kept of what its searches showed.

Pure Python: no Ray, no engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from recipes.base import Doc, Episode
from recipes.metrics import span_check


@dataclass(frozen=True)
class SearchRecord:
    """One episode's search measures (see the module docstring); `shown_doc_ids` in the order shown, each once."""

    own_searches: int
    shown_doc_ids: tuple[str, ...]
    retrieval_hit: bool
    initial_hit: bool
    found_by_search: bool
    gold_paragraph_recall: float | None
    context_hit: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the doc ids as a list)."""
        out = asdict(self)
        out["shown_doc_ids"] = list(self.shown_doc_ids)
        return out


def doc_holds_answer(doc: Doc, golden_answers: Sequence[str]) -> bool:
    """Whether the document's title or text holds a gold answer as a token span (s3 Eq. 3's span check)."""
    return span_check(f"{doc.title} {doc.text}", list(golden_answers))


def searched_docs(episode: Episode) -> list[Doc]:
    """The documents the policy's own searches returned, in order (repeats kept; skipped searches have none)."""
    return [d for t in episode.turns if t.docs is not None for d in t.docs]


def shown_docs(episode: Episode) -> list[Doc]:
    """The documents the episode showed: its initial documents, then each search's, each doc id once."""
    seen: dict[str, Doc] = {}
    for d in [*episode.initial_docs, *searched_docs(episode)]:
        seen.setdefault(d.doc_id, d)
    return list(seen.values())


def gold_paragraph_recall(shown_ids: Iterable[str], context_ids: Sequence[str] | None) -> float | None:
    """The share of `context_ids` (the row's gold paragraphs) among `shown_ids`, in [0, 1]; None when the row
    lists none."""
    gold = [str(c) for c in (context_ids or ())]
    if not gold:
        return None
    shown = set(shown_ids)
    return sum(c in shown for c in gold) / len(gold)


def search_record(episode: Episode, context: Sequence[Doc] | None = None) -> SearchRecord:
    """The episode's `SearchRecord`; `context_ids` come from `episode.meta` (the QA row's extra fields);
    `context`: the documents a frozen generator reads (`Recipe.generator_context`), None where there is none."""
    golds = list(episode.golden_answers)
    initial_ids = {d.doc_id for d in episode.initial_docs}
    initial_hit = any(doc_holds_answer(d, golds) for d in episode.initial_docs)
    new = [d for d in searched_docs(episode) if d.doc_id not in initial_ids]
    found = any(doc_holds_answer(d, golds) for d in new)
    shown = shown_docs(episode)
    return SearchRecord(
        own_searches=episode.num_searches,
        shown_doc_ids=tuple(d.doc_id for d in shown),
        retrieval_hit=initial_hit or found,
        initial_hit=initial_hit,
        found_by_search=found,
        gold_paragraph_recall=gold_paragraph_recall((d.doc_id for d in shown), episode.meta.get("context_ids")),
        context_hit=None if context is None else any(doc_holds_answer(d, golds) for d in context),
    )


def search_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Means over episodes of their search records (dicts of `SearchRecord.to_json`; a missing one is skipped):
    `own_searches` (searches per episode), `retrieval_recall`, `initial_recall`, `found_by_search_rate`, and
    `gold_paragraph_recall` over the episodes whose row lists gold paragraphs (absent when none does), and
    `context_recall` over the episodes with a generator context (absent when none has one).
    Every value 0.0 for no records."""
    recs = [r for r in records if r]
    n = max(1, len(recs))
    out = {
        "own_searches": sum(float(r["own_searches"]) for r in recs) / n,
        "retrieval_recall": sum(bool(r["retrieval_hit"]) for r in recs) / n,
        "initial_recall": sum(bool(r["initial_hit"]) for r in recs) / n,
        "found_by_search_rate": sum(bool(r["found_by_search"]) for r in recs) / n,
    }
    gold = [float(r["gold_paragraph_recall"]) for r in recs if r.get("gold_paragraph_recall") is not None]
    if gold:
        out["gold_paragraph_recall"] = sum(gold) / len(gold)
    context = [bool(r["context_hit"]) for r in recs if r.get("context_hit") is not None]
    if context:
        out["context_recall"] = sum(context) / len(context)
    return out
