"""The ``import_flashrag`` job: FlashRAG QA files and corpora → the data pack's gzip JSONL formats.

QA files (``{id, question, golden_answers, metadata?}``) become pack QA rows (``source`` = the
dataset name, ids prefixed ``"<dataset>:"``); corpora (``{id, contents}`` with ``contents =
"Title"\\ntext``, or ``{id, title, text}``) become pack passages ``{id, title, text}``. Inputs may
be .jsonl, .jsonl.gz or .parquet.

Public names: ``flashrag_qa_row``, ``flashrag_corpus_row`` (one record each), ``import_flashrag_qa``,
``import_flashrag_corpus`` (whole files).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.data import BadRowError, _get_id, _get_str, _golden_answers, iter_records, passage_fields
from pipelines.prepare.common import QA_FORM, PrepareError, write_jsonl_gz

_FLASHRAG_CORPUS_FORM = "expected FlashRAG {id, contents} or {id, title, text}"

def flashrag_qa_row(rec: Mapping[str, Any], dataset: str, path: str | Path, line: int,
                    prefix_ids: bool = True) -> dict[str, Any]:
    """One FlashRAG QA record → a data-pack QA row.

    ``{id, question, golden_answers, metadata?, ...}`` becomes ``{id, question, golden_answers,
    source: dataset, orig_id, ...}``: the id gets a ``"<dataset>:"`` prefix (pack ids are unique
    across datasets) unless it has one or ``prefix_ids`` is False; a bare-string golden answer
    becomes a one-item list; FlashRAG's ``dataset`` / ``split`` fields become ``orig_dataset`` /
    ``orig_split`` (and a ``source`` field ``orig_source``); other fields (``metadata`` ...) are kept.

    Raises:
        BadRowError: missing or mistyped id / question / golden_answers (file and line).
    """
    path = Path(path)
    qid = _get_id(rec, path, line, QA_FORM)
    question = _get_str(rec, "question", path, line, QA_FORM, nonempty=True)
    answers = list(_golden_answers(rec, path, line))
    new_id = qid if (not prefix_ids or qid.startswith(f"{dataset}:")) else f"{dataset}:{qid}"
    row: dict[str, Any] = {"id": new_id, "question": question, "golden_answers": answers, "source": dataset}
    if new_id != qid:
        row["orig_id"] = qid
    for k, v in rec.items():
        if k in ("id", "question", "golden_answers"):
            continue
        if k in ("dataset", "split", "source"):
            row[f"orig_{k}"] = v
        else:
            row[k] = v
    return row


def flashrag_corpus_row(rec: Mapping[str, Any], path: str | Path, line: int) -> dict[str, str]:
    """One FlashRAG corpus record (``{id, contents}``, contents ``"Title"\\ntext``, or ``{id, title,
    text}``) → a data-pack passage ``{id, title, text}`` (``pipelines.data.split_contents``).

    Raises:
        BadRowError: missing or mistyped fields (file and line).
    """
    path = Path(path)
    pid, title, text = passage_fields(rec, path, line, _FLASHRAG_CORPUS_FORM)
    return {"id": pid, "title": title, "text": text}


def _check_out_name(out: Path) -> None:
    """The output must be gzip JSONL, as the pack readers expect (``PrepareError`` otherwise)."""
    if not out.name.endswith(".jsonl.gz"):
        raise PrepareError(f"output {out}: name it *.jsonl.gz (the data pack's gzip JSONL format)")


def import_flashrag_qa(src: str | Path, out: str | Path, dataset: str, *, limit: int | None = None,
                       prefix_ids: bool = True) -> dict[str, Any]:
    """Convert a FlashRAG QA file (.jsonl, .jsonl.gz or .parquet) to a pack QA file named ``dataset``.

    Raises:
        BadRowError: a malformed row or a duplicate id (file and line; nothing is written).
        PrepareError: empty dataset name or an output not named *.jsonl.gz.
    """
    src, out = Path(src), Path(out)
    if not dataset or not dataset.strip() or ":" in dataset:
        raise PrepareError(f"dataset name must be non-empty and contain no ':', got {dataset!r} (e.g. --dataset nq)")
    _check_out_name(out)
    rows: list[dict] = []
    seen: dict[str, int] = {}
    for line, rec in iter_records(src):
        if limit is not None and len(rows) >= limit:
            break
        row = flashrag_qa_row(rec, dataset.strip(), src, line, prefix_ids)
        if row["id"] in seen:
            raise BadRowError(src, line, f"duplicate id {row['id']!r} (first on line {seen[row['id']]})")
        seen[row["id"]] = line
        rows.append(row)
    n = write_jsonl_gz(out, rows)
    return {"job": "import_flashrag", "kind": "qa", "input": str(src), "output": str(out), "dataset": dataset,
            "rows": n}


def import_flashrag_corpus(src: str | Path, out: str | Path, *, limit: int | None = None) -> dict[str, Any]:
    """Convert a FlashRAG corpus (.jsonl, .jsonl.gz or .parquet) to a pack corpus ``{id, title, text}``.

    Streams (constant memory) into a temporary file renamed at the end.

    Raises:
        BadRowError: a malformed row or a duplicate id (file and line; nothing is written).
        PrepareError: an output not named *.jsonl.gz.
    """
    src, out = Path(src), Path(out)
    _check_out_name(out)

    def rows():
        seen: set[str] = set()
        count = 0
        for line, rec in iter_records(src):
            if limit is not None and count >= limit:
                return
            row = flashrag_corpus_row(rec, src, line)
            if row["id"] in seen:
                raise BadRowError(src, line, f"duplicate passage id {row['id']!r}")
            seen.add(row["id"])
            count += 1
            yield row

    try:
        n = write_jsonl_gz(out, rows())
    except BaseException:
        out.with_name(out.name + ".tmp").unlink(missing_ok=True)
        raise
    return {"job": "import_flashrag", "kind": "corpus", "input": str(src), "output": str(out), "rows": n}
