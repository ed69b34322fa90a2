"""Answer metrics shared by every recipe and by retrieval evaluation.

SQuAD-style normalization (lowercase, strip punctuation and the articles a/an/the, collapse
whitespace), and `span_check`: a normalized gold answer occurs as a contiguous token span of the
normalized prediction (s3 §4.1 / Eq. 3; the has_answer test of DPR and Pyserini). Pure Python.
"""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop articles, collapse whitespace (SQuAD v1.1 normalization)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def span_check(prediction: str, golds: list[str]) -> bool:
    """True if some normalized gold answer is a contiguous token span of the normalized prediction.

    Token-level, so "1990" does not match inside "19901" and "art" not inside "party". Empty
    golds (after normalization) never match. Source: s3 §4.1, Eq. 3 (span_check).
    """
    tokens = normalize_answer(prediction).split()
    for gold in golds:
        g = normalize_answer(gold).split()
        if g and any(tokens[i : i + len(g)] == g for i in range(len(tokens) - len(g) + 1)):
            return True
    return False
