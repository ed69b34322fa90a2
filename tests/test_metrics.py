"""normalize_answer and span_check (s3 §4.1) on hand-made cases."""

import pytest

from recipes.metrics import normalize_answer, span_check


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
