"""`AnswerStore`: a frozen LLM's greedy answers on disk, shared by every method, run and restart on a node.

The s3 reward, naive RAG and direct inference ask the frozen generator the same prompts again and again: every
evaluation asks naive RAG and direct inference the same 1,000+ test prompts, and every training run asks the
naive-RAG prompt of each of its questions (s3's released code precomputes that answer once per training set,
`scripts/precompute.sh`). The store keeps each answer under a key of everything that decides a greedy answer:
the prompt's exact token ids after rendering (template, chat template and truncation included), the model's
weight files (name, size and modification time), the engine backend and dtype, and the sampling settings. A
changed setting is a different key, so it misses; nothing is ever invalidated in place.

It is one SQLite file (WAL journal: several frozen LLM actors of one node read and write it at once). Greedy
decoding is deterministic up to the engine's batch composition (vLLM's batched kernels may break a near-tie the
other way), so a stored answer is the one an earlier call gave, as the in-memory LRU's is.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

STORE_VERSION = 1  # part of every key: a change to how answers are made or read bumps it

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def store_path(setting: str | None) -> Path | None:
    """The file of `frozen.answer_cache`: None -> none; "auto" -> `$SEARCHRL_ANSWER_CACHE` ("off": none), else
    `~/.cache/searchrl/frozen-answers.sqlite` (beside the converted models); anything else is a path."""
    if setting is None:
        return None
    if setting != "auto":
        return Path(setting).expanduser()
    env = os.environ.get("SEARCHRL_ANSWER_CACHE")
    if env == "off":
        return None
    return Path(env).expanduser() if env else Path.home() / ".cache" / "searchrl" / "frozen-answers.sqlite"


def model_fingerprint(model: str) -> str:
    """What identifies a model's weights: for a local directory, the name, size (bytes) and modification time
    (ns) of its config and weight files, hashed (a re-converted or retrained folder at the same path is a new
    model); otherwise (a hub name) the name itself."""
    path = Path(model)
    if not path.is_dir():
        return str(model)
    parts = []
    for f in sorted(path.iterdir()):
        if f.name == "config.json" or f.suffix in _WEIGHT_SUFFIXES:
            st = f.stat()
            parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return f"{path.resolve()}#" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def answer_key(identity: Mapping[str, Any], prompt_ids: Sequence[int]) -> str:
    """The store key (hex sha256) of a prompt's token ids under `identity` (model, engine and sampling
    settings, JSON-serializable)."""
    blob = json.dumps({"v": STORE_VERSION, **identity}, sort_keys=True) + "|" + ",".join(map(str, prompt_ids))
    return hashlib.sha256(blob.encode()).hexdigest()


class AnswerStore:
    """Answers by key, in the SQLite file `path` (created with its folder if missing).

    Raises:
        sqlite3.Error: the file is not a database or cannot be created (the message names it).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS answers "
                             "(key TEXT PRIMARY KEY, answer TEXT NOT NULL, created REAL NOT NULL)")
        except sqlite3.Error as e:
            raise sqlite3.Error(f"frozen.answer_cache: cannot use {self.path} as an answer store ({e}); point "
                                "frozen.answer_cache at a writable file, or set it to null to turn it off") from e

    def get(self, key: str) -> str | None:
        """The stored answer of `key`, or None."""
        with self._lock:
            row = self._db.execute("SELECT answer FROM answers WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, answer: str) -> None:
        """Store `answer` under `key` (the first answer stored for a key stays)."""
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO answers (key, answer, created) VALUES (?, ?, ?)",
                             (key, answer, time.time()))

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0])

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()
