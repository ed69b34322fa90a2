"""Helpers of the rule-based experts (`Recipe.expert_turn`, the warm start's demonstrations): which shown
documents hold a gold answer, a turn's text without the prompt's forced response prefix, and the candidate
queries of an expert that searches with purpose (`search_candidates`: built from the question, the shown
documents and the row's supporting titles; the agent loop checks each against the index)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from recipes.base import Doc, Episode


def docs_holding_answer(docs: Sequence[Doc], golden_answers: Sequence[str]) -> list[tuple[int, str]]:
    """(1-based position, the first gold answer it holds) of each document whose title or text holds a gold
    answer as a token span (`recipes.metrics.span_check`, s3 Eq. 3's span check applied to a document)."""
    from recipes.metrics import span_check

    out = []
    for i, doc in enumerate(docs, 1):
        text = f"{doc.title} {doc.text}"
        gold = next((g for g in golden_answers if span_check(text, [g])), None)
        if gold is not None:
            out.append((i, gold))
    return out


def after_prefix(episode: Episode, text: str) -> str | None:
    """`text` as the policy's turn: on the first turn, without the prompt's forced response prefix (None when
    `text` does not begin with it); later turns unchanged."""
    prefix = episode.prompt.response_prefix
    if episode.turns or not prefix:
        return text
    return text[len(prefix):] if text.startswith(prefix) else None


# ----------------------------------------------------------------------------- the expert's own searches

@dataclass(frozen=True)
class ExpertQuery:
    """A search the expert may write: the query and the reasoning that says why (in the recipe's think tags)."""

    query: str
    reason: str
    checked: bool = True  # False: kept even when its documents bring no gold answer into view


MAX_EXPERT_QUERIES = 16
"""Candidates the agent loop checks against the index per expert turn, at most (each is one search call)."""
SEARCH_NEXT = "I will search for it."
"""How every reason of a searching turn ends. A reason that ended with the query itself ("I need to search for X.")
taught the policy to close its think tag with the search tag after X (the turn then ended invalid at `</search>`:
dev valid-action rate 0.58 after the warm start)."""

KEY_WORDS_FIRST = "I will search for the question's key words."
KEY_WORDS_AGAIN = "No document gives the answer yet. I will search for the question's key words again."
"""The reasons of the `key_words` expert's first and repeated search: fixed sentences, so that a reason
never ends on the query."""

CHECK_NEXT = "Let me check it with one more search."
"""How the `verify` expert's first reason ends after it named the answer the shown documents give."""

_STOP = frozenset(
    "a an the of in on at to for from by with and or is are was were be been what which who whom whose when where "
    "why how did does do that this these those it its as into there than then same both other also has have had "
    "one two first last not".split())
_CAPITALIZED = re.compile(r"[A-Z0-9][\w'\-\.]*(?:\s+(?:of|the|de|von|van|du|la|and|&)?\s*[A-Z0-9][\w'\-\.]*)*")
_QUESTION_WORDS = frozenset("what which who whom whose when where why how is are was were did does do in on the "
                            "at for from by".split())


def entity_phrases(text: str, limit: int = 12) -> list[str]:
    """Capitalized word runs of `text` (names of people, places, works: "Kill Bill", "Bank of England"), each
    once, in order; a run that is only a question word, a stopword or a number is left out; at most `limit`."""
    out: list[str] = []
    for m in _CAPITALIZED.finditer(text):
        phrase = m.group(0).strip(" .'-")
        words = phrase.split()
        while words and words[0].lower() in _QUESTION_WORDS:
            words = words[1:]
        phrase = " ".join(words)
        if not phrase or phrase.lower() in _STOP or len(phrase) < 2 or phrase.replace(" ", "").isdigit():
            continue
        if phrase not in out:
            out.append(phrase)
        if len(out) >= limit:
            break
    return out


def key_words(question: str, leave_out: Sequence[str] = ()) -> list[str]:
    """The question's content words (lowercase, no stopwords, no punctuation) without those of `leave_out`."""
    from recipes.metrics import normalize_answer

    skip = {w for p in leave_out for w in normalize_answer(p).split()}
    return [w for w in normalize_answer(question).split() if w not in _STOP and w not in skip]


def key_words_query(question: str) -> str:
    """The question's key words as one query (the question itself when it has none): the expert's check search and
    first search, which a policy can copy from the prompt."""
    return " ".join(key_words(question)) or question


def key_words_search(episode: Episode) -> ExpertQuery:
    """The `key_words` experts' next search (Search-R1 family and s3): the question's key words, unchecked,
    with `KEY_WORDS_FIRST` as its reason before the episode's first search and `KEY_WORDS_AGAIN` after."""
    reason = KEY_WORDS_AGAIN if episode.num_searches else KEY_WORDS_FIRST
    return ExpertQuery(key_words_query(episode.question), reason, checked=False)


def position_mentioning(docs: Sequence[Doc], phrase: str) -> int | None:
    """1-based position of the first document whose text holds `phrase` as a token span, else None."""
    from recipes.metrics import span_check

    return next((i for i, d in enumerate(docs, 1) if span_check(d.text, [phrase])), None)


def search_candidates(question: str, latest: Sequence[Doc], shown: Sequence[Doc],
                      supporting_titles: Sequence[str] = ()) -> list[ExpertQuery]:
    """Queries the expert may write when the documents shown so far hold no gold answer, best first; the agent
    loop keeps the first one whose results bring a gold-holding document into view (`AgentLoop(expert=True)`).

    1. Each supporting title (rows that list `supporting_titles`) not yet shown: the missing paragraph's title,
       cited as the latest documents write it when they mention it (the bridge entity).
    2. Then, shortest first: entity names of the latest documents that the question does not hold, each with
       the question's key words that its document lacks (the next hop's); the question's own entity names; the question's key words alone.
    3. The question itself (it finds something new only when no document was shown yet, or with `fresh_docs`).

    `latest`: the documents of the latest observation (the initial top-k on the first turn), which a reason may
    cite by position; `shown`: every document shown so far. At most `MAX_EXPERT_QUERIES`, each query once.
    """
    shown_titles = {d.title.strip().lower() for d in shown}
    first: list[ExpertQuery] = []
    for title in supporting_titles:
        if title.strip().lower() in shown_titles:
            continue
        at = position_mentioning(latest, title)
        why = (f"Doc {at} mentions {title}, but no document gives the answer. {SEARCH_NEXT}"
               if at else f"The documents do not give the answer about {title}. {SEARCH_NEXT}")
        first.append(ExpertQuery(title, why))
    q_entities = entity_phrases(question)
    rel = " ".join(key_words(question, q_entities)[:4])
    rest: list[ExpertQuery] = []
    for doc in latest:
        # the second hop's key words: the question's, less those the document that names the entity already has
        doc_words = set(key_words(doc.text))
        hop = " ".join([w for w in key_words(question, q_entities) if w not in doc_words][:4])
        for doc_entity in entity_phrases(doc.text, 6):
            if doc_entity.lower() in question.lower() or doc_entity.lower() in shown_titles:
                continue
            at = position_mentioning(latest, doc_entity)
            query = f"{doc_entity} {hop}".strip()
            rest.append(ExpertQuery(query, f"Doc {at} mentions {doc_entity}, but not the answer. {SEARCH_NEXT}"))
    for e in q_entities:
        query = f"{e} {rel}".strip()
        rest.append(ExpertQuery(query, f"The documents do not give the answer about {e}. {SEARCH_NEXT}"))
    words = " ".join(key_words(question))
    if words:
        rest.append(ExpertQuery(words, f"The documents do not give the answer. {SEARCH_NEXT}"))
    rest.sort(key=lambda c: len(c.query.split()))
    why = "I need to search for the answer." if not shown else "I need more documents about the question."
    out: list[ExpertQuery] = []
    for c in [*first, *rest, ExpertQuery(question, why)]:
        if c.query and c.query.lower() not in {o.query.lower() for o in out}:
            out.append(c)
    return out[:MAX_EXPERT_QUERIES]
