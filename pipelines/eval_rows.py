"""Evaluation's result table (pure: no Ray, no engine): one record per method × question, scored
by EM, F1, cover-EM, span_check and GenAcc, pooled per dataset and per method."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recipes.metrics import cover_exact_match, exact_match, f1_score, span_check

ALL = "all"
"""The `dataset` of the row that pools every question of a method (MIRAGE's apart)."""

MIRAGE = "mirage/"
"""Prefix of the MIRAGE datasets (`mirage/medqa`, ...); `mirage/all` pools them."""


def is_mirage(dataset: str) -> bool:
    """Whether a record's dataset is one of MIRAGE's (scored by the judge alone)."""
    return dataset.startswith(MIRAGE)

METRICS = ("em", "f1", "cover_em", "span_check", "gen_acc")



# ----------------------------------------------------------------------------- rows (pure)


@dataclass(frozen=True)
class QARecord:
    """One question answered by one method.

    `answer`: the scored answer (None = the episode gave none; scores 0). `searches`: retrieval
    calls made for the question (count; the initial top-k of s3 / naive RAG counts as one).
    `gen_acc`: GenAcc = span_check ∨ judge_check, decided by the caller (the judge is an LLM).
    `acc_l`: R1-Searcher's ACC_L verdict (§3.1), None when not asked.
    """

    method: str
    dataset: str
    answer: str | None
    golden_answers: tuple[str, ...]
    searches: int
    gen_acc: bool
    acc_l: bool | None = None


def _scores(record: QARecord) -> dict[str, float]:
    pred, golds = record.answer or "", list(record.golden_answers)
    return {
        "em": exact_match(pred, golds),
        "f1": f1_score(pred, golds),
        "cover_em": cover_exact_match(pred, golds),
        "span_check": float(span_check(pred, golds)),
        "gen_acc": float(record.gen_acc),
    }


def _row(method: str, dataset: str, scored: list[tuple[QARecord, dict[str, float]]]) -> dict[str, Any]:
    n = len(scored)
    row: dict[str, Any] = {"method": method, "dataset": dataset, "n": n}
    for m in METRICS:
        row[m] = sum(s[m] for _, s in scored) / n
    row["searches_per_question"] = sum(r.searches for r, _ in scored) / n
    if all(r.acc_l is not None for r, _ in scored):
        row["acc_l"] = sum(bool(r.acc_l) for r, _ in scored) / n
    return row


def compute_rows(records: Iterable[QARecord]) -> list[dict[str, Any]]:
    """The result table: one row per method × dataset, then the method's `all` row.

    Each row is `{method, dataset, n, em, f1, cover_em, span_check, gen_acc, searches_per_question}`:
    `n` questions; the five metrics are means over those questions, in [0, 1] (EM, F1, cover-EM
    and span_check from `recipes.metrics` on the answer, a missing answer counting as ""; gen_acc
    is the records' flag); `searches_per_question` is the mean retrieval calls per question; `acc_l`
    (R1-Searcher's ACC_L) is there when every record of the row has a verdict.

    The `all` row is the mean over ALL the method's questions (micro average), not the mean of
    the dataset rows: a dataset with more questions weighs more. Methods keep the order in which
    they first appear in `records`; datasets are sorted by name within a method. MIRAGE datasets
    (`mirage/...`) come after the `all` row, which leaves them out, then their own `mirage/all`.
    """
    by_method: dict[str, dict[str, list[tuple[QARecord, dict[str, float]]]]] = {}
    for r in records:
        by_method.setdefault(r.method, {}).setdefault(r.dataset, []).append((r, _scores(r)))
    rows = []
    for method, datasets in by_method.items():
        for medical in (False, True):
            names = sorted(d for d in datasets if is_mirage(d) == medical)
            for dataset in names:
                rows.append(_row(method, dataset, datasets[dataset]))
            if names:
                rows.append(_row(method, MIRAGE + ALL if medical else ALL, [x for d in names for x in datasets[d]]))
    return rows


_COLUMNS = (
    ("method", "method", "{}"), ("dataset", "dataset", "{}"), ("n", "n", "{}"), ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"), ("cover_em", "cover-EM", "{:.3f}"), ("span_check", "span_check", "{:.3f}"),
    ("gen_acc", "GenAcc", "{:.3f}"), ("acc_l", "ACC_L", "{:.3f}"), ("searches_per_question", "searches/q", "{:.2f}"),
)


def format_markdown(rows: Sequence[Mapping[str, Any]], title: str | None = None) -> str:
    """`rows` (as `compute_rows` returns them) as a Markdown table, metrics with 3 decimals,
    searches per question with 2; `all` rows in bold; the ACC_L column only when a row has it ("-"
    in rows without). `title` becomes a `#` heading above it."""
    columns = [c for c in _COLUMNS if c[0] != "acc_l" or any("acc_l" in r for r in rows)]
    lines = [f"# {title}", ""] if title else []
    lines.append("| " + " | ".join(head for _, head, _ in columns) + " |")
    lines.append("| " + " | ".join("---" if key in ("method", "dataset") else "---:" for key, _, _ in columns) + " |")
    for row in rows:
        cells = [fmt.format(row[key]) if key in row else "-" for key, _, fmt in columns]
        if row["dataset"] in (ALL, MIRAGE + ALL):
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
