"""The paper-scale configs hold the papers' settings (their own numbers, section by section)."""

from __future__ import annotations

from actors.engines.spec import engine_spec
from configs.loader import load_config
from recipes import get_recipe


def test_r_search_verifier_is_llama_3_2_3b_instruct():
    # R-Search §4.2: "we use a different family open-source model, Llama-3.2-3B-Instruct" for Eq. 4.
    cfg = load_config("configs/r_search_gpu.yaml")
    recipe = get_recipe("r_search", **cfg.recipe_config())
    assert recipe.frozen_roles() == ("verifier",)
    assert engine_spec(cfg, "verifier").model == "meta-llama/Llama-3.2-3B-Instruct"
    assert cfg.learner.model == "Qwen/Qwen2.5-7B-Instruct"
