"""Ray's bundled jemalloc is preloaded in the vLLM CPU engine's processes (`engine_preload`, around the
engine's start) and in CPU learner ranks (`rank_runtime_env`): under glibc's malloc both grew in the training soak.
The ranks also start with bounded caches of oneDNN primitives."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from actors.engines.cpu_env import engine_preload
from cluster.jemalloc import bundled_jemalloc


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("LD_PRELOAD", "SEARCHRL_ENGINE_MALLOC", "SEARCHRL_LEARNER_MALLOC", "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def _maps_of_a_spawned_process() -> str:
    return subprocess.run([sys.executable, "-c", "print(open('/proc/self/maps').read())"], capture_output=True,
                          text=True, check=True).stdout


def test_jemalloc_goes_first_while_the_engine_starts_and_is_gone_after(clean_env):
    lib = bundled_jemalloc()
    assert lib is not None and lib.endswith("libjemalloc.so"), "Ray's wheel bundles jemalloc"
    with engine_preload() as preload:
        assert preload == os.environ["LD_PRELOAD"] == lib
        assert "libjemalloc.so" in _maps_of_a_spawned_process()
    assert "LD_PRELOAD" not in os.environ  # what this process starts later keeps its own malloc
    assert "libjemalloc.so" not in _maps_of_a_spawned_process()


def test_a_preload_already_set_stays_behind_it_and_comes_back(clean_env):
    clean_env.setenv("LD_PRELOAD", "/x/libgomp.so.1")
    with engine_preload() as preload:
        assert preload == f"{bundled_jemalloc()}:/x/libgomp.so.1"
    assert os.environ["LD_PRELOAD"] == "/x/libgomp.so.1"


@pytest.mark.parametrize("preload, choice", [("/opt/libtcmalloc_minimal.so.4", ""), ("", "system")])
def test_a_malloc_the_user_chose_is_kept(clean_env, preload, choice):
    if preload:
        clean_env.setenv("LD_PRELOAD", preload)
    if choice:
        clean_env.setenv("SEARCHRL_ENGINE_MALLOC", choice)
    with engine_preload() as seen:
        assert seen == preload and os.environ.get("LD_PRELOAD", "") == preload


def test_cpu_learner_ranks_start_with_jemalloc_and_a_bounded_onednn_cache_and_gpu_ranks_do_not(clean_env):
    from actors.learner.group import LEARNER_ONEDNN_CACHE, rank_runtime_env
    from configs.schema import LearnerConfig

    cpu = rank_runtime_env(LearnerConfig(model="m"))
    assert cpu == {"runtime_env": {"env_vars": {"LD_PRELOAD": bundled_jemalloc(),
                                                "ONEDNN_PRIMITIVE_CACHE_CAPACITY": LEARNER_ONEDNN_CACHE,
                                                "LRU_CACHE_CAPACITY": LEARNER_ONEDNN_CACHE}}}
    assert 0 < int(LEARNER_ONEDNN_CACHE) < 1024  # bounded below oneDNN's default, but a cache: 0 rebuilds every matmul
    assert rank_runtime_env(LearnerConfig(model="m", gpus_per_rank=1)) == {}
    clean_env.setenv("SEARCHRL_LEARNER_MALLOC", "system")
    clean_env.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")  # the user's choice goes to the ranks as it is
    assert rank_runtime_env(LearnerConfig(model="m")) == {"runtime_env": {"env_vars": {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512", "LRU_CACHE_CAPACITY": LEARNER_ONEDNN_CACHE}}}
