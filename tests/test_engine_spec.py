"""`engine_spec`: the one place a config becomes an engine, for every role; and the recipes'
declarations that pipelines and the resource plan read instead of lists of recipe names."""

from __future__ import annotations

import pydantic
import pytest

from actors.engines.spec import EngineSpec, engine_spec
from configs import load_config
from recipes import RECIPES, get_recipe


def _cfg(*overrides: str):
    return load_config("configs/s3_cpu.yaml", ["seed=7", *overrides])


def test_policy_spec_reads_the_rollout_engine_settings():
    cfg = _cfg("rollout.max_model_len=3000", "rollout.cpu_kv_cache_gib=0.75", "rollout.tensor_parallel_size=2")
    spec = engine_spec(cfg, "policy")
    assert (spec.backend, spec.model, spec.max_model_len, spec.seed) == ("vllm", "gemma3-270m", 3000, 7)
    assert (spec.cpu_kv_cache_gib, spec.tensor_parallel_size) == (0.75, 2)
    assert engine_spec(cfg, "policy", "/ckpt/policy/hf").model == "/ckpt/policy/hf"


@pytest.mark.parametrize("role, model", [("generator", "gen"), ("verifier", "gen"), ("judge", "jud")])
def test_frozen_roles_share_the_frozen_settings(role, model):
    cfg = _cfg("frozen.model=gen", "frozen.judge_model=jud", "frozen.max_model_len=1024", "frozen.backend=hf")
    spec = engine_spec(cfg, role)
    assert (spec.backend, spec.model, spec.max_model_len, spec.seed) == ("hf", model, 1024, 7)
    assert spec.tensor_parallel_size == 1


def test_judge_defaults_to_the_generator_model():
    assert engine_spec(_cfg("frozen.model=gen"), "judge").model == "gen"


def test_bad_role_and_bad_spec_fields_are_errors():
    with pytest.raises(ValueError, match="engine role must be one of"):
        engine_spec(_cfg(), "critic")
    with pytest.raises(pydantic.ValidationError, match="max_len"):
        EngineSpec.of({"backend": "hf", "model": "m", "max_len": 3})
    with pytest.raises(pydantic.ValidationError, match="backend"):
        EngineSpec(backend="tgi", model="m")


def test_backend_options_follow_the_backend():
    hf = EngineSpec(backend="hf", model="m", cpu_kv_cache_gib=1.0).backend_options()
    assert set(hf) == {"max_model_len", "seed", "dtype"}
    vllm = EngineSpec(backend="vllm", model="m", cpu_kv_cache_gib=1.0).backend_options()
    assert vllm["cpu_kv_cache_gib"] == 1.0 and vllm["tensor_parallel_size"] == 1


def test_recipes_declare_what_pipelines_ask():
    assert {n for n, c in RECIPES.items() if c.trainable} == {"s3", "search_r1", "r1_searcher", "r_search", "eval_rar",
                                                                   "naive_rag"}
    assert {n for n, c in RECIPES.items() if c.generator_answers} == {"s3"}
    assert {n for n, c in RECIPES.items() if not c.retrieves} == {"direct"}
    assert get_recipe("s3").frozen_roles() == ("generator", "judge")
    assert get_recipe("s3", use_judge=False).frozen_roles() == ("generator",)
    assert get_recipe("r_search").frozen_roles() == ("verifier",)
    assert get_recipe("r_search", evidence_reward=False).frozen_roles() == ()
    assert get_recipe("search_r1").frozen_roles() == ()
