"""The vLLM CPU engine's processes start with jemalloc preloaded (`set_cpu_env_defaults`): under
glibc's malloc the served engine's heap grew for as long as it ran (issue 29's serve soak)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from actors.engines.vllm_engine import engine_malloc, set_cpu_env_defaults


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("LD_PRELOAD", "SEARCHRL_ENGINE_MALLOC", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_jemalloc_goes_first_in_ld_preload_and_a_spawned_process_loads_it(clean_env):
    lib = engine_malloc()
    assert lib is not None and lib.endswith("libjemalloc.so"), "Ray's wheel bundles jemalloc"
    clean_env.setenv("LD_PRELOAD", "/x/libgomp.so.1")
    done = set_cpu_env_defaults()
    assert os.environ["LD_PRELOAD"] == f"{lib}:/x/libgomp.so.1" == done["LD_PRELOAD"]
    os.environ["LD_PRELOAD"] = lib  # (the made-up libgomp would only make the loader complain)
    maps = subprocess.run([sys.executable, "-c", "print(open('/proc/self/maps').read())"], capture_output=True,
                          text=True, check=True).stdout
    assert "libjemalloc.so" in maps


@pytest.mark.parametrize("preload, choice", [("/opt/libtcmalloc_minimal.so.4", ""), ("", "system")])
def test_a_malloc_the_user_chose_is_kept(clean_env, preload, choice):
    if preload:
        clean_env.setenv("LD_PRELOAD", preload)
    if choice:
        clean_env.setenv("SEARCHRL_ENGINE_MALLOC", choice)
    done = set_cpu_env_defaults()
    assert "LD_PRELOAD" not in done and os.environ.get("LD_PRELOAD", "") == preload
