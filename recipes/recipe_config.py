"""`RecipeConfig`: the constants every recipe has (top-k, turns, feedback, the document template, the search
switches), which each recipe's config subclasses with its paper's defaults. Pure pydantic: no Ray, no engine."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DOC_TEMPLATE = 'Doc {i}(Title: "{title}") {text}'
"""How one document is shown in an observation (Search-R1's and s3's), fields {i} {title} {text}."""


class RecipeConfig(BaseModel):
    """Constants every recipe has; each recipe subclasses it with its paper's defaults."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    topk: int = Field(3, ge=1, description="Documents retrieved per search (top-k).")
    max_turns: int = Field(
        4, ge=0, description="Environment steps (searches and invalid actions) before the last turn."
    )
    invalid_feedback: str | None = Field(
        None, description="Text appended after an invalid action; None = an invalid action ends the episode."
    )
    doc_template: str = Field(DOC_TEMPLATE, description="How one document is shown, fields {i} {title} {text}.")
    searches: bool = Field(
        True, description="Whether the policy's own searches run. False: a search it writes is not run and the episode "
        "ends there (or its answer is forced, where the recipe forces answers), as at the turn limit; invalid turns "
        "keep their retries. The evaluation's `no_search` method.")
    fresh_docs: bool = Field(
        False, description="A search returns the top-k of the documents not yet shown in the episode (the initial "
        "top-k and earlier searches' documents left out), so a repeated query finds something new. False = the "
        "papers' retrieval (Search-R1, s3), which shows a document again when a query repeats.")
