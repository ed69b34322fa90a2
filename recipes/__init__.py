"""Search-agent methods as pure Python (no Ray, no engine): prompts, stop strings, action parsers,
observations and rewards. Find one by name with `get_recipe`; a user's own recipe is named by its
import path, "package.module:ClassName" (a `Recipe` subclass importable on every node)."""

from __future__ import annotations

import importlib
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


def recipe_class(name: str) -> type[Recipe]:
    """The recipe class called `name`: a registered name ("s3", "search_r1", "r1_searcher",
    "r_search", "eval_rar", "naive_rag", "direct") or an import path "package.module:ClassName".

    Raises:
        KeyError: an unknown name, an import path that does not import, or a class that is not a
            `Recipe` (the message lists the registered names).
    """
    if name in RECIPES:
        return RECIPES[name]
    hint = f"choose one of {sorted(RECIPES)} or give a Recipe subclass as 'package.module:ClassName'"
    module_name, _, attr = name.partition(":")
    if not (module_name and attr):
        raise KeyError(f"unknown recipe {name!r}; {hint}")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise KeyError(f"recipe {name!r} does not import ({type(e).__name__}: {e}); {hint}") from None
    if not (isinstance(cls, type) and issubclass(cls, Recipe)):
        raise KeyError(f"recipe {name!r} is {cls!r}, not a Recipe subclass; {hint}")
    return cls


def get_recipe(name: str, config: RecipeConfig | Mapping[str, Any] | None = None, **overrides: Any) -> Recipe:
    """The recipe called `name` (see `recipe_class`), configured with `config` and `overrides`.

    Raises:
        KeyError: unknown name (the message lists the known ones).
        pydantic.ValidationError: an unknown or invalid config field.
    """
    return recipe_class(name)(config, **overrides)


__all__ = ["RECIPES", "Recipe", "RecipeConfig", "get_recipe", "recipe_class"]
