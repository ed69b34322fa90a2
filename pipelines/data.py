"""Streaming readers for the data pack and FlashRAG-style files.

The data pack (see its README.md; located by ``$SEARCHRL_DATA``) holds
``corpus.jsonl.gz`` with ``{id, title, text}`` rows, ``train/dev/test.jsonl.gz``
with QA rows ``{id, question, golden_answers, source, ...}`` and
``mirage.jsonl.gz`` with multiple-choice rows ``{id, dataset, question,
options, answer}``.  FlashRAG files are read too: corpus rows ``{id,
contents}`` where ``contents`` is ``"Title"\\ntext``, and QA rows ``{id,
question, golden_answers, dataset?, split?, metadata?}``.

Every reader is a generator over ``.jsonl``, ``.jsonl.gz`` or ``.parquet``
files that reads one line (or one Parquet batch) at a time, so memory stays
flat whatever the file size.  Malformed rows raise :class:`BadRowError`
naming the file and the 1-based line (JSONL) or row (Parquet).
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterator

ENV_VAR = "SEARCHRL_DATA"
"""Environment variable naming the data pack directory."""

CORPUS_FILE = "corpus.jsonl.gz"
_PARQUET_BATCH_ROWS = 1024
_CORPUS_FORM = "expected {id, title, text} or FlashRAG {id, contents}"
_QA_FORM = "expected {id, question, golden_answers: [str, ...]}"
_MIRAGE_FORM = "expected {id, dataset, question, options{A..D}, answer}"
_FIX = (
    f"Set {ENV_VAR} to a directory in the data pack's format ({CORPUS_FILE}, "
    "train/dev/test.jsonl.gz; see the pack's README.md), e.g. "
    f"`export {ENV_VAR}=../shared/data` in this project's checkout, "
    "or pass the directory explicitly (config key data.dir)."
)


class DataPackError(RuntimeError):
    """The data pack (or one of its files) cannot be found or read."""


class BadRowError(ValueError):
    """A record is malformed.

    Attributes: ``path`` (the file), ``line`` (1-based line for JSONL, 1-based
    row number for Parquet), ``reason`` (what is wrong).
    """

    def __init__(self, path: str | Path, line: int, reason: str):
        self.path = Path(path)
        self.line = line
        self.reason = reason
        unit = "row" if self.path.suffix == ".parquet" else "line"
        super().__init__(f"{self.path} {unit} {line}: {reason}")


@dataclass(frozen=True, slots=True)
class Passage:
    """One corpus passage."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """The passage in FlashRAG form: ``"Title"\\ntext``."""
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True, slots=True)
class QAExample:
    """One question with its accepted answers.

    ``dataset`` comes from the row's ``source`` (data pack) or ``dataset``
    (FlashRAG) field; ``split`` from the reader's ``split`` argument or the
    row's ``split`` field; ``meta`` holds all remaining fields.
    """

    id: str
    question: str
    golden_answers: tuple[str, ...]
    dataset: str
    split: str | None
    meta: dict = field(default_factory=dict, hash=False)


def resolve_data_dir(path: str | Path | None = None) -> Path:
    """Return the data pack directory: ``path`` if given, else ``$SEARCHRL_DATA``.

    Raises :class:`DataPackError` (saying what was looked for and how to fix
    it) when neither is set, the directory does not exist, or it has no
    ``corpus.jsonl.gz``.
    """
    if path is None or str(path) == "":
        env = os.environ.get(ENV_VAR, "")
        if not env:
            raise DataPackError(f"no data pack directory given and {ENV_VAR} is not set. {_FIX}")
        path, origin = env, f"{ENV_VAR}={env}"
    else:
        origin = f"data dir {str(path)!r}"
    d = Path(path).expanduser()
    if not d.is_dir():
        raise DataPackError(f"{origin}: {d} is not a directory. {_FIX}")
    if not (d / CORPUS_FILE).is_file():
        raise DataPackError(f"{origin}: {d} has no {CORPUS_FILE}, so it is not a data pack. {_FIX}")
    return d


def pack_file(name: str, data_dir: str | Path | None = None) -> Path:
    """Return the path of file ``name`` in the data pack (see :func:`resolve_data_dir`).

    Raises :class:`DataPackError` if the pack or the file is missing.
    """
    d = resolve_data_dir(data_dir)
    p = d / name
    if not p.is_file():
        have = ", ".join(sorted(x.name for x in d.iterdir() if x.is_file()))
        raise DataPackError(f"{p} not found in the data pack (it has: {have})")
    return p


def _kind(path: Path) -> str:
    """'jsonl', 'jsonl.gz' or 'parquet' from the file name; ValueError otherwise."""
    name = path.name.lower()
    for kind in ("jsonl.gz", "jsonl", "parquet"):
        if name.endswith("." + kind):
            return kind
    raise ValueError(f"unsupported file type {path.name!r}: expected .jsonl, .jsonl.gz or .parquet")


def iter_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_or_row_number, record)`` from a JSONL, JSONL.gz or Parquet file.

    Numbers are 1-based (lines for JSONL, counting blank lines, which are
    skipped; rows for Parquet).  Raises ValueError for an unsupported suffix,
    FileNotFoundError for a missing file, :class:`BadRowError` for a line that
    is not a JSON object, :class:`DataPackError` for a corrupt/truncated file.
    """
    path = Path(path)
    kind = _kind(path)
    if kind == "parquet":
        yield from _iter_parquet(path)
        return
    opener = gzip.open if kind == "jsonl.gz" else open
    with opener(path, "rb") as f:
        lineno = 0
        try:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise BadRowError(path, lineno, f"invalid JSON ({e})") from None
                if not isinstance(rec, dict):
                    raise BadRowError(path, lineno, f"expected a JSON object, got {type(rec).__name__}")
                yield lineno, rec
        except (OSError, EOFError) as e:
            raise DataPackError(f"{path}: cannot read after line {lineno} ({e})") from e


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(row_number, record)`` from a Parquet file, one batch at a time."""
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_PARQUET_BATCH_ROWS):
        for rec in batch.to_pylist():
            row += 1
            yield row, rec


def count_records(path: str | Path) -> int:
    """Number of records in a file (non-blank lines for JSONL; Parquet metadata), streaming."""
    path = Path(path)
    if _kind(path) == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    opener = gzip.open if _kind(path) == "jsonl.gz" else open
    with opener(path, "rb") as f:
        return sum(1 for raw in f if raw.strip())


def _limited(rows: Iterator[Any], limit: int | None) -> Iterator[Any]:
    """The first ``limit`` items of ``rows`` (None = all, 0 = none); ValueError if negative.

    Stops without reading past the last item it yields.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be an integer >= 0 or None, got {limit!r}")
    return rows if limit is None else islice(rows, limit)


def _get_id(rec: dict, path: Path, line: int, form: str) -> str:
    """Return the record's id as str (str or int accepted); BadRowError otherwise."""
    if "id" not in rec:
        raise BadRowError(path, line, f"missing field 'id' ({form})")
    rid = rec["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise BadRowError(path, line, f"field 'id' must be a non-empty string or integer, got {rid!r}")
    return str(rid)


def _get_str(rec: dict, key: str, path: Path, line: int, form: str, nonempty: bool = False) -> str:
    """Return ``rec[key]`` checked to be a (non-empty) string; BadRowError otherwise."""
    if key not in rec:
        raise BadRowError(path, line, f"missing field {key!r} ({form})")
    v = rec[key]
    if not isinstance(v, str):
        raise BadRowError(path, line, f"field {key!r} must be a string, got {type(v).__name__}")
    if nonempty and not v.strip():
        raise BadRowError(path, line, f"field {key!r} is empty")
    return v


def split_contents(contents: str) -> tuple[str, str]:
    """Split FlashRAG ``contents`` into ``(title, text)``.

    The title is the first line, with one pair of surrounding double quotes
    removed if present; the text is everything after the first newline.
    Without a newline the whole string is the text and the title is empty.
    """
    if "\n" not in contents:
        return "", contents
    title, text = contents.split("\n", 1)
    title = title.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def iter_corpus(path: str | Path, limit: int | None = None) -> Iterator[Passage]:
    """Yield the first ``limit`` (None = all) passages of a corpus file.

    Accepts data pack rows ``{id, title, text}`` and FlashRAG rows ``{id,
    contents}``.  Raises :class:`BadRowError` (file + line) for a missing or
    mistyped field, ValueError for an unsupported suffix or a negative limit.
    """
    path = Path(path)
    _kind(path)
    return _limited(_corpus_rows(path), limit)


def _corpus_rows(path: Path) -> Iterator[Passage]:
    """Generator behind :func:`iter_corpus` (no limit)."""
    for line, rec in iter_records(path):
        yield Passage(*passage_fields(rec, path, line, _CORPUS_FORM))


def passage_fields(rec: dict, path: Path, line: int, form: str = _CORPUS_FORM) -> tuple[str, str, str]:
    """`(id, title, text)` of one corpus record: `{id, title, text}` or FlashRAG's `{id, contents}`
    (contents `"Title"\ntext`, see `split_contents`).

    Raises:
        BadRowError: a missing or mistyped field, naming the file, the line and `form` (the expected shape).
    """
    pid = _get_id(rec, path, line, form)
    if "text" not in rec and "contents" in rec:
        title, text = split_contents(_get_str(rec, "contents", path, line, form))
    else:
        title, text = _get_str(rec, "title", path, line, form), _get_str(rec, "text", path, line, form)
    return pid, title, text


def _golden_answers(rec: dict, path: Path, line: int) -> tuple[str, ...]:
    """Validated ``golden_answers`` as a tuple (a bare string becomes a 1-tuple)."""
    if "golden_answers" not in rec:
        raise BadRowError(path, line, f"missing field 'golden_answers' ({_QA_FORM})")
    ans = rec["golden_answers"]
    if isinstance(ans, str):
        ans = [ans]
    if not isinstance(ans, (list, tuple)) or not ans or not all(isinstance(a, str) for a in ans):
        raise BadRowError(path, line, f"field 'golden_answers' must be a non-empty list of strings, got {ans!r}"[:300])
    return tuple(ans)


def iter_qa(path: str | Path, limit: int | None = None, split: str | None = None) -> Iterator[QAExample]:
    """Yield the first ``limit`` (None = all) QA examples of a file.

    ``split`` labels every example (default: the row's ``split`` field, else
    None).  Raises :class:`BadRowError` for a missing id, an empty or
    non-string question, or golden_answers that is not a non-empty list of
    strings; ValueError for an unsupported suffix or a negative limit.
    """
    path = Path(path)
    _kind(path)
    return _limited(_qa_rows(path, split), limit)


def _qa_rows(path: Path, split: str | None) -> Iterator[QAExample]:
    """Generator behind :func:`iter_qa` (no limit)."""
    for line, rec in iter_records(path):
        qid = _get_id(rec, path, line, _QA_FORM)
        question = _get_str(rec, "question", path, line, _QA_FORM, nonempty=True)
        answers = _golden_answers(rec, path, line)
        meta = {k: v for k, v in rec.items() if k not in ("id", "question", "golden_answers")}
        dataset = meta.pop("source", None) or meta.pop("dataset", None) or "unknown"
        row_split = meta.pop("split", None)
        yield QAExample(qid, question, answers, str(dataset), split or row_split, meta)


def iter_mirage(path: str | Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Yield the first ``limit`` (None = all) MIRAGE rows as dicts (id as str).

    Checks that the question is a non-empty string, ``options`` is a
    non-empty dict of strings and ``answer`` is one of its keys; raises
    :class:`BadRowError` otherwise; ValueError for an unsupported suffix or a
    negative limit.
    """
    path = Path(path)
    _kind(path)
    return _limited(_mirage_rows(path), limit)


def _mirage_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Generator behind :func:`iter_mirage` (no limit)."""
    for line, rec in iter_records(path):
        rec = dict(rec, id=_get_id(rec, path, line, _MIRAGE_FORM))
        _get_str(rec, "question", path, line, _MIRAGE_FORM, nonempty=True)
        opts = rec.get("options")
        if not isinstance(opts, dict) or not opts or not all(isinstance(v, str) for v in opts.values()):
            raise BadRowError(path, line, f"field 'options' must be a non-empty dict of strings ({_MIRAGE_FORM})")
        answer = rec.get("answer")
        if not isinstance(answer, str) or answer not in opts:
            raise BadRowError(path, line, f"answer {answer!r} is not one of the options {sorted(opts)}")
        yield rec


def spread_sample(rows: list[dict[str, Any]], limit: int | None, seed: int,
                  key: Callable[[dict[str, Any]], str] | None = None) -> list[dict[str, Any]]:
    """A seeded sample of `limit` rows spread over their `dataset` field (or `key(row)`), in the rows' own order.

    Each dataset's rows are taken in a seeded random order and dealt out round-robin over the datasets
    (so 64 questions of a 6-dataset split hold 10-11 of each). Pack splits are sorted by dataset, so
    their first N rows are usually one dataset. `limit` None or >= len(rows): all rows.
    """
    import random

    if limit is None or limit >= len(rows):
        return list(rows)
    rng = random.Random(seed)
    by_dataset: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        name = key(row) if key is not None else str(row.get("dataset", ""))
        by_dataset.setdefault(name, []).append(i)
    queues = [rng.sample(idx, len(idx)) for _, idx in sorted(by_dataset.items())]
    picked: list[int] = []
    while len(picked) < limit:
        for q in queues:
            if q and len(picked) < limit:
                picked.append(q.pop())
    return [rows[i] for i in sorted(picked)]
