"""Evaluation's result table (pure: no Ray, no engine): one record per method × question, scored
by EM, F1, cover-EM, span_check and GenAcc, pooled per dataset and per method; the pooled rows'
bootstrap intervals and paired differences (`add_intervals`, statistics in `pipelines.eval_stats`);
and the lines of `predictions.jsonl` (`prediction_line`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.eval_stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    bootstrap_ci,
    paired_by_question,
    paired_difference,
)
from recipes.metrics import cover_exact_match, exact_match, f1_score, span_check

ALL = "all"
"""The `dataset` of the row that pools every question of a method (MIRAGE's apart)."""

MIRAGE = "mirage/"
"""Prefix of the MIRAGE datasets (`mirage/medqa`, ...); `mirage/all` pools them."""


def is_mirage(dataset: str) -> bool:
    """Whether a record's dataset is one of MIRAGE's (scored by the judge alone)."""
    return dataset.startswith(MIRAGE)


MULTI_HOP = "multi-hop"
"""The `dataset` of the row that pools a method's multi-hop questions (`MULTI_HOP_DATASETS`), after `all`."""

MULTI_HOP_DATASETS = ("2wikimultihopqa", "hotpotqa", "musique")
"""The data pack's multi-hop datasets (its rows' `type`: "multi-hop"; ../shared/data/README.md)."""

METRICS = ("em", "f1", "cover_em", "span_check", "gen_acc")



# ----------------------------------------------------------------------------- rows (pure)


@dataclass(frozen=True)
class QARecord:
    """One question answered by one method.

    `answer`: the scored answer (None = the episode gave none; scores 0). `searches`: retrieval
    calls made for the question (count; the initial top-k of s3 / naive RAG counts as one).
    `gen_acc`: GenAcc = span_check ∨ judge_check, decided by the caller (the judge is an LLM).
    `acc_l`: R1-Searcher's ACC_L verdict (§3.1), None when not asked. `qid`: the question's id
    in its dataset (pairs methods question by question in `add_intervals`).
    The search itself (`recipes.search_metrics`; None for a method that retrieves nothing): `own_searches`
    (count: the searches the policy wrote, the initial top-k not counted), `retrieval_hit` (a document shown
    in the episode holds a gold answer), `gold_recall` (the share of the row's gold paragraphs shown; None
    for rows that list none), `context_hit` (the documents the frozen generator read hold a gold answer: s3's
    selection, naive RAG's top-k; None where the policy answers itself).
    """

    method: str
    dataset: str
    answer: str | None
    golden_answers: tuple[str, ...]
    searches: int
    gen_acc: bool
    acc_l: bool | None = None
    qid: str = ""
    own_searches: int | None = None
    retrieval_hit: bool | None = None
    gold_recall: float | None = None
    context_hit: bool | None = None


def search_fields(search: Mapping[str, Any] | None) -> dict[str, Any]:
    """`QARecord`'s search fields from an evaluation record's `search` dict (`SearchRecord.to_json`; None =
    the method retrieves nothing)."""
    if not search:
        return {}
    return {"own_searches": int(search["own_searches"]), "retrieval_hit": bool(search["retrieval_hit"]),
            "gold_recall": search.get("gold_paragraph_recall"), "context_hit": search.get("context_hit")}


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
    searched = [r for r, _ in scored if r.retrieval_hit is not None]
    if searched:  # the search itself: over the records that carry it (a method that retrieves)
        row["own_searches_per_question"] = sum(int(r.own_searches or 0) for r in searched) / len(searched)
        row["retrieval_recall"] = sum(bool(r.retrieval_hit) for r in searched) / len(searched)
    gold = [float(r.gold_recall) for r, _ in scored if r.gold_recall is not None]
    if gold:
        row["gold_paragraph_recall"] = sum(gold) / len(gold)
    context = [bool(r.context_hit) for r, _ in scored if r.context_hit is not None]
    if context:
        row["context_recall"] = sum(context) / len(context)
    if all(r.acc_l is not None for r, _ in scored):
        row["acc_l"] = sum(bool(r.acc_l) for r, _ in scored) / n
    return row


def compute_rows(records: Iterable[QARecord]) -> list[dict[str, Any]]:
    """The result table: one row per method × dataset, then the method's `all` row.

    Each row is `{method, dataset, n, em, f1, cover_em, span_check, gen_acc, searches_per_question}`:
    `n` questions; the five metrics are means over those questions, in [0, 1] (EM, F1, cover-EM
    and span_check from `recipes.metrics` on the answer, a missing answer counting as ""; gen_acc
    is the records' flag); `searches_per_question` is the mean retrieval calls per question; `acc_l`
    (R1-Searcher's ACC_L) is there when every record of the row has a verdict. The search itself, where
    the records carry it: `own_searches_per_question` (searches the policy wrote), `retrieval_recall` (share
    of questions whose shown documents hold a gold answer) and `gold_paragraph_recall` (mean share of gold
    paragraphs shown, over the questions that list them), and `context_recall` (share of questions whose
    generator context, s3's selection or naive RAG's top-k, holds a gold answer).

    The `all` row is the mean over ALL the method's questions (micro average), not the mean of
    the dataset rows: a dataset with more questions weighs more. A `multi-hop` row follows it, pooling the
    method's `MULTI_HOP_DATASETS` questions, when it has any. Methods keep the order in which
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
            multi = [d for d in names if d in MULTI_HOP_DATASETS]
            if multi and not medical:
                rows.append(_row(method, MULTI_HOP, [x for d in multi for x in datasets[d]]))
    return rows


_COLUMNS = (
    ("method", "method", "{}"), ("dataset", "dataset", "{}"), ("n", "n", "{}"), ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"), ("cover_em", "cover-EM", "{:.3f}"), ("span_check", "span_check", "{:.3f}"),
    ("gen_acc", "GenAcc", "{:.3f}"), ("acc_l", "ACC_L", "{:.3f}"), ("searches_per_question", "searches/q", "{:.2f}"),
    ("own_searches_per_question", "own searches/q", "{:.2f}"), ("retrieval_recall", "retrieval recall", "{:.3f}"),
    ("gold_paragraph_recall", "gold-paragraph recall", "{:.3f}"), ("context_recall", "context recall", "{:.3f}"),
)
_OPTIONAL_COLUMNS = ("acc_l", "own_searches_per_question", "retrieval_recall", "gold_paragraph_recall", "context_recall")
"""Columns shown only when some row has them ("-" in the rows without)."""


def format_markdown(rows: Sequence[Mapping[str, Any]], title: str | None = None) -> str:
    """`rows` (as `compute_rows` returns them) as a Markdown table, metrics with 3 decimals,
    searches per question with 2; pooled rows (`all`, `multi-hop`) in bold; the ACC_L and search columns
    (`_OPTIONAL_COLUMNS`) only when a row has them ("-" in rows without). `title` becomes a `#` heading above it."""
    columns = [c for c in _COLUMNS if c[0] not in _OPTIONAL_COLUMNS or any(c[0] in r for r in rows)]
    lines = [f"# {title}", ""] if title else []
    lines.append("| " + " | ".join(head for _, head, _ in columns) + " |")
    lines.append("| " + " | ".join("---" if key in ("method", "dataset") else "---:" for key, _, _ in columns) + " |")
    for row in rows:
        cells = [fmt.format(row[key]) if key in row else "-" for key, _, fmt in columns]
        if row["dataset"] in (ALL, MULTI_HOP, MIRAGE + ALL):
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def qa_record(method: str, record: Mapping[str, Any], *, gen_acc: bool, acc_l: bool | None) -> QARecord:
    """The `QARecord` of one evaluation record (a `predictions.jsonl` line has the same fields): its dataset,
    answer, golden_answers, searches, id and `search` dict (`search_fields`).

    Raises:
        KeyError: the record lacks dataset, answer, golden_answers or searches.
    """
    return QARecord(method, record["dataset"], record["answer"], tuple(record["golden_answers"]),
                    int(record["searches"]), gen_acc, acc_l, qid=str(record.get("id", "")),
                    **search_fields(record.get("search")))


def records_from_predictions(lines: Iterable[Mapping[str, Any]], method: str, *, as_method: str | None = None,
                             source: str = "predictions.jsonl") -> list[QARecord]:
    """The `QARecord`s of one method from `predictions.jsonl` lines (`prediction_line`'s dicts), renamed to
    `as_method` (default: `method`), so that two evaluations' files can be paired question by question
    (`add_intervals`) without evaluating either again.

    Raises:
        ValueError: no line has `method` (the message names the methods `source` holds), or a line of it
            lacks a field `QARecord` needs (dataset, answer, golden_answers, searches).
    """
    lines = list(lines)
    mine = [r for r in lines if r.get("method") == method]
    if not mine:
        have = sorted({str(r.get("method")) for r in lines})
        raise ValueError(f"{source} has no method {method!r}; it holds {have}: name one of them")
    out = []
    for i, r in enumerate(mine):
        try:
            out.append(qa_record(as_method or method, r, gen_acc=bool(r.get("gen_acc")), acc_l=r.get("acc_l")))
        except KeyError as e:
            raise ValueError(f"{source}: {method} line {i} lacks the field {e.args[0]!r}; pass a predictions.jsonl "
                             "that scripts.evaluate wrote") from None
    return out


# ----------------------------------------------------------------------------- intervals (pure)

CI_METRICS = ("em", "f1", "cover_em")
"""Metrics that get bootstrap intervals and paired differences (the rule metrics; GenAcc rests on a judge)."""

PAIRS = (("policy", "untrained"), ("policy", "warm_start"), ("policy", "naive_rag"), ("policy", "no_search"),
         ("warm_start", "untrained"), ("expert", "naive_rag"))
"""Paired comparisons `a − b` written when both methods were evaluated: what training changed, the trained
searcher against retrieval without a searcher, and against itself with its own searches switched off (what
searching added); the expert's ceiling against retrieval without a searcher."""

_CI_HEADS = {"em": "EM", "f1": "F1", "cover_em": "cover-EM"}


def _pools(dataset: str) -> tuple[str, ...]:
    """The pooled rows a dataset's questions count in: `all` (and `multi-hop` for a multi-hop dataset), or
    `mirage/all` for MIRAGE's."""
    if is_mirage(dataset):
        return (MIRAGE + ALL,)
    return (ALL, MULTI_HOP) if dataset in MULTI_HOP_DATASETS else (ALL,)


def _keyed_scores(records: Iterable[QARecord]) -> dict[tuple[str, str], dict[tuple[str, str, int], dict[str, float]]]:
    """Per (method, pool), each record's scores keyed by `(dataset, qid, k)`: k counts earlier records of
    the same method with that dataset and id, so a question repeated in the file pairs its k-th record
    in each method (every method answers the same question list) instead of colliding."""
    out: dict[tuple[str, str], dict[tuple[str, str, int], dict[str, float]]] = {}
    seen: dict[tuple[str, str, str], int] = {}
    for r in records:
        k = seen.get((r.method, r.dataset, r.qid), 0)
        seen[(r.method, r.dataset, r.qid)] = k + 1
        scores = _scores(r)
        for pool in _pools(r.dataset):
            out.setdefault((r.method, pool), {})[(r.dataset, r.qid, k)] = scores
    return out


def _rounded(xs: Sequence[float]) -> list[float]:
    return [round(float(x), 6) + 0.0 for x in xs]  # JSON: no 17-digit noise; + 0.0 turns -0.0 into 0.0


def add_intervals(
    rows: Sequence[Mapping[str, Any]],
    records: Iterable[QARecord],
    pairs: Sequence[tuple[str, str]] = PAIRS,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> list[dict[str, Any]]:
    """`rows` (from `compute_rows(records)`) with bootstrap intervals on the pooled rows.

    Every pooled row (`all`, `multi-hop`, `mirage/all`) gets `ci`: `{metric: [lo, hi]}` for the `CI_METRICS`, the
    percentile bootstrap interval of the row's mean over its questions (`eval_stats.bootstrap_ci`).
    For each `(a, b)` of `pairs` with both methods in `records`, a's pooled row gets
    `paired[b]`: `{"n": questions paired, metric: [mean(a − b), lo, hi]}` over the questions both
    methods have a record for, matched by `(dataset, qid)`, never by position
    (`eval_stats.paired_difference`). Values are rounded to 6 decimals; units are the metrics'.

    Returns:
        New row dicts, in `rows`' order (the input is not modified); other rows are copied as they are.
    Raises:
        ValueError: bad `resamples` / `confidence` (`eval_stats`).
    """
    scores = _keyed_scores(records)
    out = [dict(r) for r in rows]
    pooled = {(r["method"], r["dataset"]): r for r in out if (r["method"], r["dataset"]) in scores}
    for key, row in pooled.items():
        by_q = scores[key]
        row["ci"] = {m: _rounded(bootstrap_ci([s[m] for s in by_q.values()], resamples=resamples,
                                              confidence=confidence, seed=seed)[1:]) for m in CI_METRICS}
    for a, b in pairs:
        for pool in (ALL, MULTI_HOP, MIRAGE + ALL):
            mine, other = scores.get((a, pool)), scores.get((b, pool))
            if (a, pool) not in pooled or other is None or not any(k in other for k in mine):
                continue  # a method not evaluated, or no question both answered
            paired: dict[str, Any] = {}
            for m in CI_METRICS:
                keys, xa, xb = paired_by_question({k: s[m] for k, s in mine.items()},
                                                  {k: s[m] for k, s in other.items()})
                paired["n"] = len(keys)
                paired[m] = _rounded(paired_difference(xa, xb, resamples=resamples, confidence=confidence, seed=seed))
            pooled[(a, pool)].setdefault("paired", {})[b] = paired
    return out


def _interval(mean: float, lo: float, hi: float) -> str:
    return f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


def format_intervals_markdown(rows: Sequence[Mapping[str, Any]], *, resamples: int = DEFAULT_RESAMPLES,
                              confidence: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_SEED) -> str:
    """The intervals of `add_intervals`' rows as Markdown: a table of the pooled rows' means with
    their intervals (`0.147 [0.110, 0.185]`), then one table per paired comparison
    (`| metric | policy − untrained | 95% CI |`). `resamples` / `confidence` / `seed` only label the
    heading (pass what `add_intervals` used). Returns "" when no row has intervals."""
    with_ci = [r for r in rows if "ci" in r]
    if not with_ci:
        return ""
    pct = f"{confidence * 100:g}%"
    lines = [f"## {pct} bootstrap intervals (percentile, {resamples} resamples over questions, seed {seed})", "",
             "| method | dataset | n | " + " | ".join(_CI_HEADS[m] for m in CI_METRICS) + " |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in CI_METRICS) + " |"]
    for r in with_ci:
        cells = [_interval(r[m], *r["ci"][m]) for m in CI_METRICS]
        lines.append(f"| {r['method']} | {r['dataset']} | {r['n']} | " + " | ".join(cells) + " |")
    for r in with_ci:
        for other, p in r.get("paired", {}).items():
            name = f"{r['method']} − {other}"
            lines += ["", f"Paired over the same questions ({r['dataset']}: {p['n']} questions both answered):", "",
                      f"| metric | {name} | {pct} CI |", "| --- | ---: | --- |"]
            lines += [f"| {_CI_HEADS[m]} | {p[m][0]:.3f} | [{p[m][1]:.3f}, {p[m][2]:.3f}] |" for m in CI_METRICS]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- predictions (pure)

TURN_FIELDS = ("text", "action", "query", "doc_ids", "finish_reason")
"""What `predictions.jsonl` keeps of each turn (`actors.rollout.trajectory.TurnRecord`): the generated
text, the action type, the search query (None when not a search), the retrieved document ids and the
engine's stop reason for the turn ("length" = cut at the turn's token budget)."""


def prediction_turns(turns: Iterable[Any]) -> list[dict[str, Any]]:
    """Each turn (a `TurnRecord` or its dict, as `Trajectory.to_json` writes it) reduced to `TURN_FIELDS`;
    a field the turn lacks is None (doc_ids: [])."""
    return [{k: _turn_field(t, k) for k in TURN_FIELDS} for t in turns]


def _turn_field(turn: Any, key: str) -> Any:
    value = turn.get(key) if isinstance(turn, Mapping) else getattr(turn, key, None)
    return list(value or []) if key == "doc_ids" else value


def prediction_line(method: str, recipe: str, record: Mapping[str, Any], *, gen_acc: bool, judge: bool | None,
                    acc_l: bool | None, searcher: bool = True) -> dict[str, Any]:
    """One `predictions.jsonl` line: method, recipe, the evaluation record (id, dataset, question,
    golden_answers, answer, finish_reason, ...), GenAcc, the judge's verdict and ACC_L.

    A searcher's episode (`searcher`, and a record with `turns`, or a `trajectory` dict as
    `Trajectory.to_json` gives it) also gets `turns` (`prediction_turns`) and `answer_forced` (the
    record's, else the trajectory's or its `final`'s; None when none says). A full trajectory is
    never copied (token ids); a baseline's line (`searcher` False: direct, naive_rag) keeps its
    record without turns.
    """
    line: dict[str, Any] = {"method": method, "recipe": recipe, **record}
    traj = line.pop("trajectory", None) or {}
    turns = line.pop("turns", traj.get("turns"))
    if searcher and turns is not None:
        line["turns"] = prediction_turns(turns)
        final = traj.get("final") or {}
        line["answer_forced"] = record.get("answer_forced", traj.get("answer_forced", final.get("answer_forced")))
        line.setdefault("finish_reason", traj.get("finish_reason"))
    line.update(gen_acc=gen_acc, judge=judge, acc_l=acc_l)
    return line
