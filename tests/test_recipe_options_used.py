"""Every option a recipe accepts and every `train.*` option is turned by something: set by a config under configs/
(configs/experiments/ included) or named by a test. An option no config sets and no test names is a knob nobody
turns: remove it, or give it a test. Code that reads an option (a pipeline, a probe script) is not a use.

A recipe's options are the fields of its `config_cls`, the declaration `configs.recipe_options.check_recipe_options`
validates `train.recipe_options` against (`topk` left out: `retrieval.topk` sets it, the check refuses it there).
Each declaration counts on its own: s3's `found_reward` and Search-R1's are two options, so a Search-R1 config does
not keep s3's. A config uses an option when its `train.recipe` accepts that declaration and sets it in
`train.recipe_options` or a stage's `recipe_options`. A test names it when one of its statements (docstrings left
out) holds the option's name and, for an option one recipe's own config class declares, that recipe's name or class
too (a statement that only mentions `f1_yes_no_rule` beside an R1-Searcher call does not keep R-Search's).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from configs import load_config
from configs.recipe_options import check_recipe_options
from configs.schema import TrainConfig
from recipes import RECIPES
from recipes.base import Recipe, RecipeConfig
from recipes.search_r1 import SearchR1, SearchR1Config

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()


def declarations(recipes: Mapping[str, type[Recipe]]) -> dict[tuple[type, str], list[str]]:
    """(declaring config class, option) -> the names of `recipes` that accept it. The declaring class is the most
    basic one in the recipe config's MRO that annotates the field (a subclass that re-annotates it to change its
    default, as every recipe does with `max_turns`, declares nothing new)."""
    out: dict[tuple[type, str], list[str]] = {}
    for name, cls in recipes.items():
        for option in cls.config_cls.model_fields:
            if option == "topk":
                continue
            owner = next(c for c in reversed(cls.config_cls.__mro__) if option in vars(c).get("__annotations__", {}))
            out.setdefault((owner, option), []).append(name)
    return out


@cache
def config_uses() -> tuple[dict[str, frozenset[str]], frozenset[str]]:
    """Per recipe name, the recipe options some config sets (`train.recipe_options` or a stage's); and the
    `train.*` options some config sets (its own file or a `base:` it names)."""
    recipe_options: dict[str, set[str]] = {}
    train_options: set[str] = set()
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        train = load_config(path).train
        for options in train.option_sets():
            recipe_options.setdefault(train.recipe, set()).update(options)
        train_options |= train.model_fields_set
    return {k: frozenset(v) for k, v in recipe_options.items()}, frozenset(train_options)


@cache
def suite_statements() -> tuple[str, ...]:
    """The source lines of every simple statement of the tests other than this file (a compound statement's body
    is visited statement by statement; docstrings and other bare strings are left out)."""
    out = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.resolve() == THIS:
            continue
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            bare_string = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            if isinstance(node, ast.stmt) and not hasattr(node, "body") and not bare_string:
                out.append("\n".join(lines[node.lineno - 1 : node.end_lineno]))
    return tuple(out)


def unused_recipe_options(recipes: Mapping[str, type[Recipe]], config_options: Mapping[str, frozenset[str]],
                          statements: tuple[str, ...]) -> list[str]:
    """The options of `recipes` that no config sets (`config_options`: recipe name -> options set) and no test
    statement names, one "Class.option (recipes a, b)" each; empty when every one is used."""
    own_configs = {cls.config_cls for cls in recipes.values()}
    unused = []
    for (owner, option), names in declarations(recipes).items():
        if any(option in config_options.get(name, ()) for name in names):
            continue
        word = re.compile(rf"\b{re.escape(option)}\b")
        who = None
        if owner in own_configs:  # one recipe's own option: the statement must say whose
            who = re.compile("|".join([rf"[\"']{re.escape(n)}[\"']" for n in names]
                                      + [rf"\b{recipes[n].__name__}\b" for n in names] + [rf"\b{owner.__name__}\b"]))
        if not any(word.search(s) and (who is None or who.search(s)) for s in statements):
            unused.append(f"{owner.__name__}.{option} (recipes {', '.join(names)})")
    return unused


def test_every_recipe_option_is_set_by_a_config_or_named_by_a_test():
    assert len(declarations(RECIPES)) > len(RECIPES)  # the enumeration found the options
    unused = unused_recipe_options(RECIPES, config_uses()[0], suite_statements())
    assert not unused, ("recipe options no config under configs/ sets and no test names (set one in a config, test "
                        "it, or remove it with its docs): " + "; ".join(unused))


def test_every_train_option_is_set_by_a_config_or_named_by_a_test():
    set_by_configs = config_uses()[1]
    unused = [f for f in TrainConfig.model_fields
              if f not in set_by_configs and not any(re.search(rf"\b{f}\b", s) for s in suite_statements())]
    assert not unused, f"train options no config under configs/ sets and no test names: {unused}"


class _SpareConfig(SearchR1Config):
    """Search-R1's config with one option nothing sets, and one re-annotated to a new default."""

    spare_knob: Literal["a", "b"] = Field("a", description="Set by nothing.")
    found_reward: float = Field(0.25, ge=0, description="Search-R1's own option, another default.")


class _Spare(SearchR1):
    name = "spare_search_r1"
    config_cls = _SpareConfig


def test_the_check_finds_an_option_nothing_sets():
    recipes = {**RECIPES, _Spare.name: _Spare}
    statements = suite_statements()
    assert unused_recipe_options(recipes, config_uses()[0], statements) == [
        "_SpareConfig.spare_knob (recipes spare_search_r1)"]
    # A config of the recipe that sets it, or a test statement that names it with the recipe, keeps it.
    assert unused_recipe_options(recipes, {**config_uses()[0], _Spare.name: frozenset({"spare_knob"})}, statements) == []
    assert unused_recipe_options(recipes, config_uses()[0],
                                 (*statements, 'get_recipe("spare_search_r1", spare_knob="b")')) == []
    # The name alone, beside another recipe, does not: the option is this recipe's own.
    assert unused_recipe_options(recipes, config_uses()[0], (*statements, 'get_recipe("s3", spare_knob="b")'))
    # A re-annotated default is the declaring class's option, shared with the recipes it declares it for.
    assert declarations(recipes)[(SearchR1Config, "found_reward")] == ["search_r1", "spare_search_r1"]
    assert (RecipeConfig, "max_turns") in declarations(recipes)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_an_unknown_option_fails_naming_it_and_the_recipes_options(name):
    known = [f for f in RECIPES[name].config_cls.model_fields if f != "topk"]
    with pytest.raises(ValueError, match=rf"recipe '{name}': no_such_option: .*\(its options: {known[0]},") as e:
        check_recipe_options(name, {"no_such_option": 1})
    assert all(f in str(e.value) for f in known)
