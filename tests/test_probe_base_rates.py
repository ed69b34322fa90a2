"""The base-rate probe's pure parts: prompt variants and the table."""

from __future__ import annotations

import pytest

from recipes import RECIPES
from scripts.probes.base_rates import COLUMNS, format_table, variant_options


def test_variants_map_to_recipe_options():
    r1 = RECIPES["r1_searcher"]
    assert variant_options(r1, "plain") == {}
    assert variant_options(r1, "example+prefill") == {"worked_example": True, "prefill": "<|begin_of_query|>"}
    assert variant_options(RECIPES["search_r1"], "prefill") == {"prefill": "<search>"}
    with pytest.raises(ValueError, match="unknown variant 'fewshot'"):
        variant_options(r1, "fewshot")


def test_table_has_a_row_per_probe():
    row = {"model": "m", "recipe": "search_r1", "variant": "plain", "episodes": 8.0, **{k: 0.25 for k, _ in COLUMNS}}
    table = format_table([row, {**row, "variant": "example"}]).splitlines()
    assert len(table) == 4 and table[2].startswith("| m | search_r1 | plain | 8 | 0.25")


def test_selection_probe_table_has_each_subset_and_the_per_question_oracle():
    """`scripts.probes.selection`: mean metrics per subset of the top-k; the oracle takes each
    question's best subset by F1, so it is at least every subset's mean."""
    from scripts.probes.selection import subset_table

    s = lambda f1, cover: {"f1": f1, "cover_em": cover, "em": 0.0}  # noqa: E731
    rows = subset_table({(1,): [s(1.0, 1.0), s(0.0, 0.0)], (1, 2): [s(0.5, 1.0), s(0.4, 0.0)]})
    assert [r["subset"] for r in rows] == ["1", "1,2", "oracle"]
    assert rows[0]["f1"] == 0.5 and rows[1]["f1"] == 0.45
    assert rows[2] == {"subset": "oracle", "f1": 0.7, "cover_em": 0.5, "em": 0.0}
