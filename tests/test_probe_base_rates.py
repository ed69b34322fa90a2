"""The base-rate probe's pure parts: prompt variants and the table."""

from __future__ import annotations

import pytest

from recipes import RECIPES
from scripts.probe_base_rates import COLUMNS, format_table, variant_options


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
