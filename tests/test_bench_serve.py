"""`scripts.bench.serve`: its checks come before anything starts, and its plain-loop baseline runs the
endpoint's episode (evaluation's recipe options and the endpoint's token limits)."""

from __future__ import annotations

import pytest

from configs import load_config
from scripts.bench import serve as bench_serve


def test_a_missing_generator_fails_before_anything_starts(capsys, monkeypatch):
    import cluster.ray_init

    # refused before Ray, the endpoint or any request (a session-wide Ray from an earlier test may be up)
    monkeypatch.setattr(cluster.ray_init, "init_ray", lambda *a, **k: pytest.fail("Ray must not start"))
    with pytest.raises(SystemExit) as e:
        bench_serve.main(["--checkpoint", "gemma3-270m", "--config", "configs/s3_main_cpu.yaml", "--questions", "2",
                          "frozen.model=./no-such-generator"])
    assert e.value.code == 2
    assert "error: frozen.model='./no-such-generator'" in capsys.readouterr().err


def test_the_baseline_applies_the_endpoint_total_token_limit(tiny_gemma_dir, monkeypatch):
    """A prompt already over `rollout.max_total_tokens` ends the episode with "max_total_tokens" and no
    generation, as `AgentLoop` ends it, instead of generating a whole turn past the endpoint's limit."""
    import httpx

    real_client = httpx.Client

    def no_search(request):  # the episode must end before any search
        raise AssertionError(f"unexpected request {request.url}")

    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(no_search), **kw))
    cfg = load_config("configs/search_r1_learn_cpu.yaml", ["rollout.max_total_tokens=50"])
    assert cfg.searcher_limits()["max_total_tokens"] == 50
    out = bench_serve.baseline_run(cfg, tiny_gemma_dir, "http://test", ["who wrote hamlet?", "what is the capital of peru?"])
    assert out["finish_reasons"] == ["max_total_tokens", "max_total_tokens"]
