"""Search-agent methods as pure Python (no Ray, no engine): prompts, stop strings, action parsers,
observations and rewards. Find one by name with `get_recipe`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recipes.base import Recipe, RecipeConfig
from recipes.baselines import Direct, NaiveRAG
from recipes.eval_rar import EvalRAR
from recipes.r1_searcher import R1Searcher
from recipes.r_search import RSearch
from recipes.s3 import S3
from recipes.search_r1 import SearchR1

RECIPES: dict[str, type[Recipe]] = {
    cls.name: cls for cls in (S3, SearchR1, R1Searcher, RSearch, EvalRAR, NaiveRAG, Direct)
}


def get_recipe(name: str, config: RecipeConfig | Mapping[str, Any] | None = None, **overrides: Any) -> Recipe:
    """The recipe called `name` ("s3", "search_r1", "r1_searcher", "r_search", "eval_rar",
    "naive_rag", "direct"), configured with `config` and `overrides`.

    Raises:
        KeyError: unknown name (the message lists the known ones).
        pydantic.ValidationError: an unknown or invalid config field.
    """
    try:
        cls = RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}") from None
    return cls(config, **overrides)


__all__ = ["RECIPES", "Recipe", "RecipeConfig", "get_recipe"]
