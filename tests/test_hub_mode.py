"""Hub access follows the config (`cluster.runtime_env.hub_models`): a job runs with HF_HUB_OFFLINE=1 when
every model its config names is local (packaged aliases, the MiniLM package, paths), and online when a
config names a Hugging Face Hub id. Pure Python: no Ray, no model loaded."""

from pathlib import Path

import pytest

from cluster.runtime_env import HUB_ENV, NAMED_MODEL_KEYS, hub_models, job_env_vars
from configs import load_config

REPO = Path(__file__).resolve().parents[1]
CPU_CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*_cpu.yaml"))
GPU_CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*_gpu.yaml"))


def cfg_of(name: str, *overrides: str):
    return load_config(REPO / "configs" / name, list(overrides))


@pytest.mark.parametrize("name", CPU_CONFIGS)
def test_embedded_cpu_configs_run_offline(name):
    cfg = cfg_of(name)
    assert hub_models(cfg, REPO) == []
    env = job_env_vars(cfg, environ={})
    assert all(env[k] == "1" for k in HUB_ENV), env


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_gpu_configs_naming_hub_models_run_online(name):
    cfg = cfg_of(name)
    hub = hub_models(cfg, REPO)
    assert cfg.learner.model in hub and all("/" in m for m in hub), hub
    env = job_env_vars(cfg, environ={})
    assert all(env[k] == "0" for k in HUB_ENV), env


def test_one_hub_model_is_enough_and_local_names_never_count(tmp_path):
    cfg = cfg_of("train_cpu.yaml")
    assert hub_models(cfg, REPO) == []
    (tmp_path / "my-model").mkdir()
    local = cfg_of("train_cpu.yaml", f"learner.model={tmp_path / 'my-model'}", "frozen.model=smollm2-135m-instruct",
                   "encoder.model=sentence-transformers/all-MiniLM-L6-v2")
    assert hub_models(local, REPO) == []
    relative = cfg_of("train_cpu.yaml", "learner.model=my-model")
    assert hub_models(relative, tmp_path) == []  # an existing directory relative to base
    assert hub_models(relative, REPO) == ["my-model"]  # elsewhere the same name is a Hub id
    online = cfg_of("train_cpu.yaml", "eval.judge_model=Qwen/Qwen2.5-7B-Instruct")
    assert hub_models(online, REPO) == ["Qwen/Qwen2.5-7B-Instruct"]
    assert job_env_vars(online, environ={})["HF_HUB_OFFLINE"] == "0"


def test_extra_env_still_wins():
    cfg = cfg_of("s3_gpu.yaml")
    env = job_env_vars(cfg, {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, environ={})
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"


def test_every_named_model_key_exists_in_the_schema():
    cfg = cfg_of("train_cpu.yaml")
    for key in NAMED_MODEL_KEYS:
        section, _, name = key.partition(".")
        assert name in type(getattr(cfg, section)).model_fields, key
