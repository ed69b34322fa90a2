"""Recipe options checked against the recipe's typed config when a config loads."""

from __future__ import annotations

from typing import Any


def check_recipe_options(recipe: str, options: dict[str, Any]) -> None:
    """Validate recipe options against the recipe's typed config (`Recipe.config_cls`).

    Raises:
        ValueError: `topk` given (top-k is `retrieval.topk`, read by the pool and the recipe), or an
            unknown or invalid option, naming it and the recipe's known options.
    """
    from pydantic import ValidationError

    from recipes import recipe_class

    if "topk" in options:
        raise ValueError("topk: top-k is set once, by retrieval.topk (the retrieval pool and the recipe both read "
                         "it); remove it here and set retrieval.topk")
    config_cls = recipe_class(recipe).config_cls
    try:
        config_cls(**options)
    except ValidationError as e:
        known = ", ".join(f for f in config_cls.model_fields if f != "topk")
        lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ValueError(f"recipe {recipe!r}: " + "; ".join(lines) + f" (its options: {known})") from None
