"""The LLM judge measured against the rules where they decide, before its GenAcc is read (s3 §4.1:
GenAcc = span_check, else the judge). Pure: no Ray, no engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recipes.metrics import f1_score, span_check

AGREEMENT_FLOOR = 0.9  # below it, GenAcc measures the judge more than the answers


def judge_agreement(records: Sequence[Mapping[str, Any]], verdicts: Sequence[bool | None]) -> dict[str, Any]:
    """How far the LLM judge agrees with the rules where the rules decide (s3 §4.1's GenAcc trusts
    the judge where the span check says no):

    - on answers the span check accepts (a gold answer is a token span of it), the judge should say yes;
    - on answers sharing no token with any gold answer (F1 = 0), it should say no.

    Returns:
        {"span_positive": n, "judge_yes_on_span_positive": rate, "no_overlap": n,
        "judge_no_on_no_overlap": rate, "agreement": rate over both sets, "trusted": agreement ≥
        AGREEMENT_FLOOR}; rates are None when their set is empty.
    """
    pos, neg = [], []
    for r, v in zip(records, verdicts):
        if v is None:
            continue
        if span_check(r["answer"], r["golden_answers"]):
            pos.append(v)
        elif f1_score(r["answer"], r["golden_answers"]) == 0.0:
            neg.append(not v)

    def rate(xs: list[bool]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    agreement = rate(pos + neg)
    return {"span_positive": len(pos), "judge_yes_on_span_positive": rate(pos), "no_overlap": len(neg),
            "judge_no_on_no_overlap": rate(neg), "agreement": agreement,
            "trusted": agreement is not None and agreement >= AGREEMENT_FLOOR}


def agreement_note(agreement: Mapping[str, Any], judge_model: str) -> str:
    """One line for the results: the judge's agreement and whether GenAcc can be read."""
    if agreement["agreement"] is None:
        return f"GenAcc: the judge ({judge_model}) could not be checked (no answer where the span check decides)."
    verdict = ("GenAcc can be read" if agreement["trusted"] else
               f"below {AGREEMENT_FLOOR:.0%}: this judge cannot judge; read EM, F1 and cover-EM, not GenAcc")
    parts = []
    if agreement["judge_yes_on_span_positive"] is not None:
        parts.append(f"yes on {agreement['judge_yes_on_span_positive']:.0%} of {agreement['span_positive']} answers "
                     "holding a gold span")
    if agreement["judge_no_on_no_overlap"] is not None:
        parts.append(f"no on {agreement['judge_no_on_no_overlap']:.0%} of {agreement['no_overlap']} answers "
                     "sharing no token with a gold answer")
    return (f"GenAcc judge ({judge_model}) agrees with the rules on {agreement['agreement']:.0%} of the answers "
            f"they decide ({'; '.join(parts)}): {verdict}.")
