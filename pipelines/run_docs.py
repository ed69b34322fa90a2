"""The documents of a run's episodes, for the run viewer: a lazy id → passage store over the
corpus, the documents a frozen generator read (parsed back from an evaluation line's `context`), and
which of them hold a gold answer.

A run keeps document ids, not passages: `predictions.jsonl` and `rollouts/step-<n>.jsonl.gz` record each
search turn's `doc_ids` (and a rollout its `final.selected_doc_ids`); no retriever score is recorded, so
documents from ids carry `score` None. The passages come from the corpus the run's config names
(`data.corpus` in the data pack, `SEARCHRL_DATA`). Pure Python, no Ray.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from recipes.base import DOC_TEMPLATE, Doc
from recipes.expert import docs_holding_answer


class CorpusDocs:
    """Passages by id from corpus files (`pipelines.data.iter_corpus`: the data pack's `{id, title, text}` or
    FlashRAG rows, or an index's `docs.parquet` shards), read once on first use (the main job's 51,983
    passages: a few seconds and ~60 MB), then kept.

    Args:
        paths: the corpus file(s); empty when none could be found.
        problem: why passages are missing (shown on the page), when `paths` is empty.
    """

    def __init__(self, paths: Sequence[Path] = (), problem: str | None = None):
        self.paths, self.problem = [Path(p) for p in paths], problem
        self._by_id: dict[str, tuple[str, str]] | None = None
        self._lock = threading.Lock()

    @property
    def source(self) -> str | None:
        """The corpus file(s) as one string, or None."""
        return ", ".join(map(str, self.paths)) or None

    def _load(self) -> dict[str, tuple[str, str]]:
        with self._lock:
            if self._by_id is None:
                from pipelines.data import BadRowError, DataPackError, iter_corpus

                self._by_id = {}
                try:
                    for path in self.paths:
                        self._by_id.update((p.id, (p.title, p.text)) for p in iter_corpus(path))
                except (BadRowError, DataPackError, OSError, ValueError) as e:  # shown on the page, not a 500
                    self.problem = f"document passages unavailable: {e}"
            return self._by_id

    def docs(self, ids: Iterable[str]) -> list[dict[str, Any]]:
        """`{id, title, text, score: None, found}` per id, in order; an id the corpus lacks (or no corpus,
        or one that cannot be read: `problem` says why) has empty title and text and `found` False."""
        by_id = self._load() if self.paths else {}
        out = []
        for i in ids:
            title, text = by_id.get(str(i), ("", ""))
            out.append({"id": str(i), "title": title, "text": text, "score": None, "found": str(i) in by_id})
        return out


def corpus_for(cfg: Any) -> CorpusDocs:
    """The passages of `cfg` (`configs.Config`): `data.corpus` in the data pack (`data.dir` or
    `SEARCHRL_DATA`), else the `docs.parquet` shards of the index `index.dir` (relative to the working
    directory, as the run wrote it), else a store with only `problem` set."""
    from pipelines.data import DataPackError, pack_file

    try:
        return CorpusDocs([pack_file(cfg.data.corpus, cfg.data.dir)])
    except DataPackError as e:
        shards = sorted(Path(cfg.index.dir).glob("shard-*/docs.parquet"))
        if shards:
            return CorpusDocs(shards)
        return CorpusDocs((), f"document passages unavailable (titles and passages of searched documents show as "
                              f"ids; nor is there an index at {cfg.index.dir}): {e}")


def _template_regex(template: str) -> re.Pattern:
    """A doc template (`Doc {i}(Title: "{title}") {text}`) as a regex with groups i, title, text."""
    parts = re.split(r"(\{i\}|\{title\}|\{text\})", template)
    groups = {"{i}": r"(?P<i>\d+)", "{title}": r"(?P<title>.*?)", "{text}": r"(?P<text>.*)"}
    return re.compile("".join(groups.get(p, re.escape(p)) for p in parts) + r"\Z", re.S)


def parse_context(context: str | None, templates: Sequence[str] = (DOC_TEMPLATE,)) -> list[dict[str, Any]] | None:
    """The documents of a generator's context (`Recipe.format_docs`: one line per document, numbered from
    1) as `{id: None, title, text, score: None, found: True}`, or None for no context. A line no template
    matches continues the previous document's text (a passage with a newline) or, first, is a document
    without a title."""
    if context is None:
        return None
    patterns = [_template_regex(t) for t in dict.fromkeys([*templates, DOC_TEMPLATE])]
    docs: list[dict[str, Any]] = []
    for line in context.split("\n"):
        m = next((m for p in patterns if (m := p.match(line))), None)
        if m is not None:
            docs.append({"id": None, "title": m["title"], "text": m["text"], "score": None, "found": True})
        elif docs:
            docs[-1]["text"] += "\n" + line
        elif line.strip():
            docs.append({"id": None, "title": "", "text": line, "score": None, "found": True})
    return docs


def mark_gold(docs: list[dict[str, Any]] | None, golden_answers: Sequence[str]) -> list[dict[str, Any]] | None:
    """`docs` with `gold` set on each: the first gold answer the document's title or text holds as a token
    span (`recipes.base.docs_holding_answer`, the check of s3's expert and reward), else None. In place."""
    if docs is None:
        return None
    held = dict(docs_holding_answer([Doc(str(d.get("id")), d["title"], d["text"]) for d in docs], golden_answers))
    for i, d in enumerate(docs, 1):
        d["gold"] = held.get(i)
    return docs
