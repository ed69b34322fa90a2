"""What the preparation jobs share: errors, QA rows, atomic file writing, the result cache, the
recipe config and the Ray / actor session.

Public names: ``PrepareError``, ``Progress``, ``QA_FORM``, ``row_dataset``, ``read_qa_rows``,
``write_jsonl_gz``, ``write_json``, ``stem``, ``check_writable``, ``settings_fingerprint``,
``ResultCache``, ``recipe_config``, ``index_identity``, ``actor_session``, ``retrieval_pool``.

Import-light: Ray, pydantic, recipes and the actors are imported where used.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines.data import BadRowError, _get_id, _get_str, _golden_answers, iter_records

Progress = Callable[[str], None]
"""A sink for progress lines (default in the drivers: their module logger's ``info``)."""

QA_FORM = "expected {id, question, golden_answers: [str, ...]}"


class PrepareError(ValueError):
    """A preparation argument or input is unusable; the message names it and the fix."""


# ============================================================================ rows and files


def row_dataset(row: Mapping[str, Any]) -> str:
    """The dataset of a QA row: ``source`` (data pack), else ``dataset`` (FlashRAG), else "unknown"."""
    return str(row.get("source") or row.get("dataset") or "unknown")


def read_qa_rows(path: str | Path, limit: int | None = None, sample_seed: int | None = None) -> list[dict]:
    """Read QA rows keeping every field (ids as str, golden_answers as a list): the first `limit` (None =
    all), or with `sample_seed` a seeded sample of `limit` spread over the datasets (``row_dataset``;
    ``pipelines.data.spread_sample``), in file order. Pack splits are sorted by dataset, so their first N
    rows are usually one dataset.

    Checks each row as ``pipelines.data.iter_qa`` does (id, non-empty question, non-empty list of
    string answers) and that ids are unique (caches are keyed by id).

    Raises:
        BadRowError: a malformed row or a duplicate id (file and line).
        FileNotFoundError: no such file. ValueError: unsupported suffix.
    """
    path = Path(path)
    rows: list[dict] = []
    seen: dict[str, int] = {}
    for line, rec in iter_records(path):
        if limit is not None and sample_seed is None and len(rows) >= limit:
            break
        qid = _get_id(rec, path, line, QA_FORM)
        _get_str(rec, "question", path, line, QA_FORM, nonempty=True)
        answers = _golden_answers(rec, path, line)
        if qid in seen:
            raise BadRowError(path, line, f"duplicate id {qid!r} (first on line {seen[qid]}); ids must be unique")
        seen[qid] = line
        rows.append({**rec, "id": qid, "golden_answers": list(answers)})
    if sample_seed is not None:
        from pipelines.data import spread_sample

        return spread_sample(rows, limit, sample_seed, key=row_dataset)
    return rows


def write_jsonl_gz(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """Write rows as gzip JSONL atomically (temporary file, then rename); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def write_json(path: str | Path, obj: Any) -> None:
    """Write a JSON report (indented) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def stem(path: Path) -> Path:
    """``dir/name`` of ``dir/name.jsonl.gz`` (or ``.jsonl`` / any single suffix)."""
    name = path.name
    for suffix in (".jsonl.gz", ".jsonl", ".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)])
    return path


def check_writable(path: Path, what: str) -> None:
    """Fail early (before any actor starts) when ``path``'s folder cannot be created or written.

    Raises:
        PrepareError: naming ``what`` (e.g. "output") and the folder.
    """
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PrepareError(f"{what} {path}: cannot create folder {parent} ({e}); choose another path") from e
    if not os.access(parent, os.W_OK):
        raise PrepareError(f"{what} {path}: folder {parent} is not writable; choose another path")


# ============================================================================ result cache


def settings_fingerprint(settings: Mapping[str, Any]) -> str:
    """A short stable hash of the settings a cached result depends on (model, prompt, top-k, ...)."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:16]


class ResultCache:
    """Append-only JSONL cache of per-question results: ``{"id", "question", "settings", ...}``.

    An entry counts only if its ``settings`` fingerprint and question text match the current run
    (a changed model, prompt or index recomputes). Lines are appended and flushed one at a time
    (thread-safe), so an interrupted run keeps everything finished; a torn last line (crash while
    writing) is ignored, a malformed line elsewhere raises ``BadRowError``.
    """

    def __init__(self, path: str | Path, fingerprint: str):
        self.path = Path(path)
        self.fingerprint = fingerprint
        self._lock = threading.Lock()
        self.stale = 0  # entries ignored by the last load (other settings or question text)

    def load(self, questions: Mapping[str, str] | None = None) -> dict[str, dict]:
        """Valid entries by id (the last one wins). ``questions``: id → question text to match."""
        out: dict[str, dict] = {}
        self.stale = 0
        if not self.path.is_file():
            return out
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for i, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                if not isinstance(entry, dict) or "id" not in entry:
                    raise ValueError("not an object with an id")
            except ValueError as e:
                if i == len(lines):  # torn last line of an interrupted run
                    continue
                raise BadRowError(self.path, i,
                                  f"unreadable cache entry ({e}); delete the cache file to recompute") from None
            qid = str(entry["id"])
            fresh = entry.get("settings") == self.fingerprint
            if fresh and questions is not None and qid in questions:
                fresh = entry.get("question") == questions[qid]
            if fresh:
                out[qid] = entry
            else:
                self.stale += 1
        return out

    def append(self, entry: Mapping[str, Any]) -> None:
        """Add one entry (``settings`` is set to this cache's fingerprint)."""
        line = json.dumps({**entry, "settings": self.fingerprint}, ensure_ascii=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            needs_newline = self.path.is_file() and self.path.stat().st_size > 0 and not self._ends_with_newline()
            with open(self.path, "a", encoding="utf-8") as f:
                if needs_newline:  # after a torn last line, start a fresh one
                    f.write("\n")
                f.write(line)
                f.flush()

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"


# ============================================================================ config and actors


def recipe_config(cfg, recipe: str, **forced: Any):
    """The validated config of ``recipe``: ``cfg.recipe_config(forced)`` (``train.recipe_options``,
    then ``forced``, ``topk`` from ``retrieval.topk``) when ``train.recipe`` is ``recipe``, else
    only ``forced`` and ``topk``.

    Raises:
        ConfigError: a bad option, named ``train.recipe_options.<field>``.
    """
    from pydantic import ValidationError

    from configs import ConfigError
    from recipes import recipe_class

    # train.recipe_options belong to train.recipe: another recipe's options may not fit this one.
    options = cfg.recipe_config(forced) if cfg.train.recipe == recipe else {**forced, "topk": cfg.retrieval.topk}
    try:
        return recipe_class(recipe).config_cls(**options)
    except ValidationError as e:
        problems = [f"train.recipe_options.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ConfigError(problems, f"recipe {recipe!r} options") from None


def index_identity(cfg) -> dict[str, Any]:
    """Which index a cached result came from (folder, size, type, encoder).

    Raises:
        IndexFormatError: no finished index at ``cfg.index.dir``.
    """
    from actors.retrieval.index_store import Manifest

    manifest = Manifest.load(cfg.index.dir)
    return {"dir": str(Path(cfg.index.dir).resolve()), "num_docs": manifest.num_docs, "type": manifest.index_type,
            "encoder": (manifest.encoder or {}).get("model")}


@contextmanager
def actor_session(cfg) -> Iterator[Any]:
    """An ``actors.lifecycle.ActorSet`` on the Ray cluster already initialised in this process, else
    on ``cfg.ray``'s. On exit every actor the set started or adopted is shut down (engines free
    their memory) and killed, and Ray is shut down if it was started here."""
    import ray

    from actors.lifecycle import ActorSet
    from cluster.ray_init import init_ray

    own_ray = init_ray(cfg.ray)
    actors = ActorSet()
    try:
        yield actors
    finally:
        actors.stop()
        if own_ray:
            ray.shutdown()


def retrieval_pool(actors, cfg, pool: Any = None) -> Any:
    """``pool`` if given (the caller owns it), else a RetrievalPool over ``cfg.index.dir`` started
    from ``cfg.retrieval``, ready and owned by ``actors``."""
    if pool is not None:
        return pool
    from actors.retrieval.pool import start_retrieval_pool

    return actors.adopt(start_retrieval_pool(cfg.index.dir, cfg.retrieval))
