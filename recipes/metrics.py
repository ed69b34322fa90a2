"""Answer metrics shared by every recipe, by evaluation and by retrieval recall.

All take a prediction string and a list of gold answer strings. Normalization is SQuAD's
(lowercase, strip punctuation and the articles a/an/the, collapse whitespace). Pure Python.

- `exact_match` (EM) and `cover_exact_match` (cover-EM / SubEM: a normalized gold answer is a
  *character* substring of the normalized prediction, so gold "2" matches "2022" and "art" matches
  "party"; `token_level=True` asks for a whole-token span instead, which is `span_check`). Character
  cover-EM is FlashRAG's and the default where the papers say "contains": Eval-RAR's R_eval (option
  `eval_match="token"`), R1-Searcher's difficulty buckets (`--metric span_check` for tokens) and the
  evaluation table's cover-EM column;
- `f1_score`: token-overlap F1, max over gold answers (R1-Searcher Eq. 4, R-Search Eq. 3).
  `yes_no_rule=True` (default, FlashRAG / HotpotQA's official F1, used by evaluation) scores
  "yes"/"no"/"noanswer" only when prediction and gold agree exactly; the papers' equations have no
  such rule, and their rewards use `yes_no_rule=False` (R1-Searcher's recipe option `f1_yes_no_rule`
  turns it on);
- `span_check`: a normalized gold answer occurs as a contiguous token span of the normalized
  prediction (s3 §4.1, Eq. 3; the has_answer test of DPR/Pyserini);
- `gen_acc` = span_check ∨ judge_check (s3 Eq. 3), the judge asked with the s3 Fig. 13 prompt
  only when the span check fails (s3 Appendix A.4);
- ACC_L (R1-Searcher §3.1, LLM-as-Judge): a judge model asked with `acc_l_prompt` whether the
  prediction "fully aligns with the meaning and key information" of the gold answer, read by
  `parse_true_false` (GPT-4o-mini in the paper; the evaluation's frozen judge here).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_YES_NO = {"yes", "no", "noanswer"}

# s3 Fig. 13 / Appendix A.4: golden answers are shown as Python's str() of the list.
JUDGE_PROMPT = (
    "Please check if any of the golden answers is contained in the following response: {response}\n"
    "Golden answers: {golden_answers}\n"
    "Please directly answer with 'yes' or 'no'."
)

# R1-Searcher §3.1, "Judge Prompt" of ACC_L; the paper leaves the three fields' layout open: each
# label is followed by its value on the same line.
ACC_L_PROMPT = (
    "Given a Question and its Golden Answer, verify whether the Predicted Answer is correct. The prediction is "
    "correct if it fully aligns with the meaning and key information of the Golden Answer. Respond with True if "
    "the prediction is correct and False otherwise.\n\n"
    "Question: {question}\n"
    "Golden Answer: {golden_answer}\n"
    "Predicted Answer: {prediction}"
)


def acc_l_prompt(question: str, golds: list[str], prediction: str) -> str:
    """The ACC_L judge prompt (R1-Searcher §3.1) for one prediction; several gold answers (aliases)
    are joined with " | " (the paper's datasets give one)."""
    return ACC_L_PROMPT.format(question=question, golden_answer=" | ".join(golds), prediction=prediction)


def parse_true_false(reply: str) -> bool:
    """An ACC_L judge reply means correct when its first word (normalized) is "true"; anything else is not."""
    words = normalize_answer(reply).split()
    return bool(words) and words[0] == "true"


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop articles, collapse whitespace (SQuAD v1.1 normalization)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: list[str]) -> float:
    """1.0 if the normalized prediction equals a normalized gold answer, else 0.0 (golds that
    normalize to nothing never match)."""
    pred = normalize_answer(prediction)
    return float(any((g := normalize_answer(gold)) and pred == g for gold in golds))


def cover_exact_match(prediction: str, golds: list[str], token_level: bool = False) -> float:
    """1.0 if a normalized (non-empty) gold answer is contained in the normalized prediction (cover-EM):
    as a character substring (default, FlashRAG's), or with `token_level=True` as a whole-token span
    (`span_check`: gold "2" no longer matches "2022")."""
    if token_level:
        return float(span_check(prediction, golds))
    pred = normalize_answer(prediction)
    return float(any((g := normalize_answer(gold)) and g in pred for gold in golds))


def _f1(pred: str, gold: str, yes_no_rule: bool = True) -> float:
    if yes_no_rule and (pred in _YES_NO or gold in _YES_NO) and pred != gold:
        return 0.0  # HotpotQA's official rule (FlashRAG): yes/no answers get no partial credit
    p, g = pred.split(), gold.split()
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    return 2 * common / (len(p) + len(g))  # = 2PR/(P+R) = 2·IN/(PN+RN), R1-Searcher Eq. 4


def f1_score(prediction: str, golds: list[str], yes_no_rule: bool = True) -> float:
    """Token-level F1 between normalized prediction and gold, max over golds, in [0, 1] (R1-Searcher Eq. 4,
    R-Search Eq. 3). `yes_no_rule`: HotpotQA's official rule (FlashRAG's F1): when either side is
    "yes"/"no"/"noanswer" and they differ, 0 (plain F1 gives "no" against "no way" 2/3)."""
    pred = normalize_answer(prediction)
    return max((_f1(pred, normalize_answer(g), yes_no_rule) for g in golds), default=0.0)


def span_check(prediction: str, golds: list[str]) -> bool:
    """True if some normalized gold answer is a contiguous token span of the normalized prediction.

    Token-level, so "1990" does not match inside "19901" and "art" not inside "party"; golds that
    normalize to nothing never match. Known failure (s3 Appendix A.4): "not true" matches "true",
    which is why s3 drops yes/no questions from training. Source: s3 §4.1, Eq. 3.
    """
    tokens = normalize_answer(prediction).split()
    for gold in golds:
        g = normalize_answer(gold).split()
        if g and any(tokens[i : i + len(g)] == g for i in range(len(tokens) - len(g) + 1)):
            return True
    return False


def judge_prompt(response: str, golds: list[str]) -> str:
    """The judge_check prompt of s3 Fig. 13 for a response and its gold answers."""
    return JUDGE_PROMPT.format(response=response, golden_answers=str(list(golds)))


def parse_judge(reply: str) -> bool:
    """A judge reply means yes when its first word (normalized) is "yes"; anything else is no."""
    words = normalize_answer(reply).split()
    return bool(words) and words[0] == "yes"


def gen_acc(prediction: str, golds: list[str], judge: Callable[[str, list[str]], bool] | None = None) -> float:
    """Generation Accuracy = span_check ∨ judge_check, in {0.0, 1.0} (s3 Eq. 3).

    Args:
        judge: `judge(response, golds) -> bool`, e.g. a frozen LLM answering `judge_prompt`; called
            only when the span check fails. None = span_check alone.
    """
    if span_check(prediction, golds):
        return 1.0
    return float(bool(judge and judge(prediction, golds)))


# Function words a query shares with any question; they say nothing about the query's relevance.
_QUERY_STOPWORDS = frozenset(
    "what which who whom whose when where why how is are was were be been the of in on at to for from by with "
    "and or did does do that this these those there it its into as an".split()
)


def query_overlaps_question(query: str, question: str) -> bool:
    """True when a search query shares a content word with the question (normalized tokens, function
    words and 1-letter tokens left out). A rollout diagnostic, not a paper metric: it tells a query
    about the question from tag fragments and junk ("Searching", "</think>"), which a reward paying
    for any query invites (../shared/CPU-STACK.md, learning probes)."""
    words = {w for w in normalize_answer(question).split() if len(w) > 1 and w not in _QUERY_STOPWORDS}
    return any(w in words for w in normalize_answer(query).split())
