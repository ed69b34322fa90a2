"""Answer metrics on hand-made cases and on the papers' own examples (each cites its source)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recipes.metrics import (
    cover_exact_match,
    exact_match,
    f1_score,
    gen_acc,
    judge_prompt,
    normalize_answer,
    parse_judge,
    span_check,
)


def test_normalize_answer():
    assert normalize_answer("  The Eiffel-Tower, in PARIS! ") == "eiffeltower in paris"
    assert normalize_answer("An apple a day") == "apple day"


@pytest.mark.parametrize(
    "prediction, golds, expected",
    [
        ("He was born in Paris, France.", ["paris"], True),
        ("The answer is the United States.", ["United States"], True),
        ("Born in 19901.", ["1990"], False),  # token boundary, not substring
        ("a party", ["art"], False),
        ("nothing here", ["paris", "london"], False),
        ("london calling", ["paris", "London"], True),
        ("anything", ["", "the"], False),  # empty after normalization never matches
    ],
)
def test_span_check(prediction, golds, expected):
    assert span_check(prediction, golds) is expected


def test_s3_appendix_a4_examples():
    """s3 §4.1 and Appendix A.4: success, the documented negation failure, the paraphrase failure."""
    assert span_check("The 44th President of the United States was Barack Obama.", ["Barack Obama"])
    assert exact_match("The 44th President of the United States was Barack Obama.", ["Barack Obama"]) == 0.0
    assert span_check("That statement is not true.", ["true"])  # wrong, and documented as such
    assert not span_check("He led the civil rights movement in the 1960s.", ["Martin Luther King Jr."])


def test_gen_acc_calls_the_judge_only_when_span_check_fails():
    calls = []

    def judge(response, golds):
        calls.append((response, golds))
        return True

    assert gen_acc("It was Barack Obama.", ["Barack Obama"], judge) == 1.0 and calls == []
    assert gen_acc("He led the civil rights movement.", ["Martin Luther King Jr."], judge) == 1.0 and len(calls) == 1
    assert gen_acc("He led the civil rights movement.", ["Martin Luther King Jr."], None) == 0.0
    assert gen_acc("no idea", ["x"], lambda r, g: False) == 0.0


def test_judge_prompt_is_s3_figure_13():
    p = judge_prompt("It is Paris.", ["Paris", "City of Light"])
    assert p == (
        "Please check if any of the golden answers is contained in the following response: It is Paris.\n"
        "Golden answers: ['Paris', 'City of Light']\n"
        "Please directly answer with 'yes' or 'no'."
    )
    assert parse_judge("Yes.") and parse_judge(" yes, it does") and not parse_judge("No") and not parse_judge("")


def test_exact_and_cover_exact_match():
    assert exact_match("the Paris", ["paris"]) == 1.0
    assert exact_match("Paris, France", ["paris"]) == 0.0
    assert cover_exact_match("Paris, France", ["paris"]) == 1.0
    assert cover_exact_match("Paris", ["Paris, France"]) == 0.0
    assert cover_exact_match("anything", [""]) == 0.0
    assert exact_match("the", ["a"]) == 0.0  # both normalize to nothing: not a match


def test_f1_score():
    """R1-Searcher Eq. 4: 2·IN / (PN + RN) over normalized words, max over gold answers."""
    assert f1_score("Barack Obama", ["Barack Obama"]) == 1.0
    assert f1_score("president Barack Obama", ["Barack Obama"]) == pytest.approx(2 * 2 / (3 + 2))
    assert f1_score("Obama", ["Barack Obama", "Obama"]) == 1.0
    assert f1_score("London", ["Paris"]) == 0.0
    assert f1_score("anything", []) == 0.0


def test_f1_yes_no_rule():
    """HotpotQA's official rule, which R1-Searcher's F1 follows: no partial credit around yes/no."""
    assert f1_score("yes", ["yes"]) == 1.0
    assert f1_score("no", ["yes"]) == 0.0
    assert f1_score("yes it is", ["yes"]) == 0.0
    assert f1_score("yes", ["yes it is"]) == 0.0


@given(st.text(), st.lists(st.text(), max_size=4))
def test_metrics_stay_in_range_and_never_raise(prediction, golds):
    for fn in (exact_match, cover_exact_match, f1_score):
        assert 0.0 <= fn(prediction, golds) <= 1.0
    assert isinstance(span_check(prediction, golds), bool)
    if exact_match(prediction, golds):  # EM implies cover-EM implies span_check
        assert cover_exact_match(prediction, golds) == 1.0 and span_check(prediction, golds)


@pytest.mark.parametrize("query, relevant", [
    ("Eiffel Tower country", True), ("capital France", True), ("Searching", False), ("</think>", False),
    ("what is the", False), ("", False),
])
def test_query_overlaps_question(query, relevant):
    from recipes.metrics import query_overlaps_question

    assert query_overlaps_question(query, "What is the capital of the country where the Eiffel Tower stands?") == relevant
