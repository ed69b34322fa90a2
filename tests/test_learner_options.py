"""Learner options for memory and speed: `gradient_checkpointing: auto` (recompute only where the activations
would not fit), fused AdamW on CUDA and compiled decoder layers (`learner.compile_layers`)."""

from __future__ import annotations

import pytest
import torch

from actors.learner.batch import make_train_batch
from actors.learner import checkpointing as ckpt
from actors.learner.checkpointing import activation_bytes, needs_checkpointing, set_checkpointing

GIB = 2**30


def test_the_estimate_for_a_1_5b_policy_on_an_80_gb_gpu():
    """Qwen2.5-1.5B (hidden 1536, gated MLP 8960, 28 layers), bf16, measured on an H200 (2026-11-28): without
    recomputation 8 sequences of 1,024 tokens peaked at 52.8 GiB, 16 at 77.5 GiB, and 16 ran out of memory
    under a 78 GiB cap, so ~29 GiB of weights and AdamW state leave ~49 GiB. The estimate (17h + 8I bytes a
    token and layer) recomputes at 16 and not at 8; Korthikanti's 34h, which ignores the gated MLP's width,
    said 16 fit, and that setting ran out of memory."""
    free = 49 * GIB
    assert activation_bytes(8192, 1536, 28, 2, intermediate=8960) == (17 * 1536 + 8 * 8960) * 8192 * 28
    assert needs_checkpointing(16 * 1024, 1536, 28, 2, free=free, intermediate=8960)
    assert not needs_checkpointing(8 * 1024, 1536, 28, 2, free=free, intermediate=8960)
    assert not needs_checkpointing(16 * 1024, 1536, 28, 2, free=free)  # the old estimate: no recompute, then OOM
    # Within 20% of what was measured: (77.5 - 52.8) GiB for the 8,192 tokens between the two.
    assert 0.8 < activation_bytes(8192, 1536, 28, 2, intermediate=8960) / (24.65 * GIB) < 1.0
    assert activation_bytes(1024, 1536, 28, 4, 8960) == 2 * activation_bytes(1024, 1536, 28, 2, 8960)  # fp32


def test_free_memory_stays_inside_the_per_process_cap(monkeypatch):
    """`torch.cuda.set_per_process_memory_fraction` caps what the allocator reserves, but the driver still
    reports the whole device free: on a 140 GiB GPU capped at 78 GiB, `auto` saw ~110 GiB free and ran out
    of memory (2026-11-28). The free memory counts only what the cap leaves."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (110 * GIB, 140 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 30 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 29 * GIB)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 78 / 140, raising=False)
    assert ckpt.free_bytes(torch.device("cuda")) == 78 * GIB - 30 * GIB + 1 * GIB
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 1.0)
    assert ckpt.free_bytes(torch.device("cuda")) == 110 * GIB + 1 * GIB


def test_auto_switches_recomputation_per_micro_batch(tiny_gemma_dir, monkeypatch):
    """The learner turns recomputation on for a micro-batch that would not fit and off for one that
    would; the gradients are the same either way."""
    from transformers import AutoModelForCausalLM

    from actors.learner import checkpointing
    from actors.learner.policy import PolicyLearner

    lm = AutoModelForCausalLM.from_pretrained(tiny_gemma_dir, dtype=torch.float32)
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    learner = PolicyLearner({"gradient_checkpointing": "auto", "dtype": "fp32"})
    learner._decoder = lm
    trajs = [{"prompt_ids": [2, 5, 6, 7], "response_ids": [8, 9, 10], "loss_mask": [1, 1, 1],
              "logprobs": [0.0] * 3, "group_id": "q0"} for _ in range(2)]
    batch = make_train_batch(trajs, 0)
    rows = torch.arange(2)
    layers = [m for m in lm.modules() if hasattr(m, "gradient_checkpointing") and m is not lm]
    monkeypatch.setattr(checkpointing, "free_bytes", lambda device: 1)  # nothing left: recompute
    assert learner._auto_checkpointing(rows, batch) and all(m.gradient_checkpointing for m in layers)
    monkeypatch.setattr(checkpointing, "free_bytes", lambda device: 2**40)
    assert not learner._auto_checkpointing(rows, batch) and not any(m.gradient_checkpointing for m in layers)

    lm.train()
    grads = []
    for on in (True, False):
        set_checkpointing(lm, on)
        lm.zero_grad()
        lm(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float().pow(2).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in lm.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    assert PolicyLearner({"gradient_checkpointing": True})._auto_checkpointing(rows, batch)  # fixed settings stay


def test_adamw_is_fused_on_cuda_only():
    from actors.learner.rank import adamw_options

    assert adamw_options(torch.device("cuda", 0)) == {"fused": True}
    assert adamw_options(torch.device("cpu")) == {}
    p = torch.nn.Parameter(torch.ones(3))
    torch.optim.AdamW([p], **adamw_options(torch.device("cpu"))).step()  # the CPU path takes the options


def test_compile_layers_finds_the_decoder_layers_or_names_the_fix(tiny_gemma_dir):
    """`learner.compile_layers`: the repeated layers of a Hugging Face decoder; a model without them is
    refused with the setting that turns it off."""
    from transformers import AutoModelForCausalLM

    from actors.learner.compiled import decoder_layers

    lm = AutoModelForCausalLM.from_pretrained(tiny_gemma_dir, dtype=torch.float32)
    assert len(decoder_layers(lm)) == lm.config.get_text_config().num_hidden_layers
    with pytest.raises(ValueError, match="compile_layers=false"):
        decoder_layers(torch.nn.Linear(2, 2))


@pytest.mark.slow
def test_compiled_layers_give_the_eager_logprobs_and_gradients(tiny_gemma_dir):
    """Compiled decoder layers (Inductor) compute the same log-probs and gradients as eager ones."""
    from transformers import AutoModelForCausalLM

    from actors.learner.compiled import compile_layers
    from actors.learner.token_stats import PolicyTokenStats

    trajs = [{"prompt_ids": [2, 5, 6, 7, 11], "response_ids": [8, 9, 10, 12], "loss_mask": [1, 1, 0, 1],
              "logprobs": [0.0] * 4, "group_id": f"q{i}"} for i in range(2)]
    batch = make_train_batch(trajs, 0)
    results = []
    for compiled in (False, True):
        lm = AutoModelForCausalLM.from_pretrained(tiny_gemma_dir, dtype=torch.float32)
        if compiled:
            assert compile_layers(lm) == lm.config.get_text_config().num_hidden_layers
        lp, _ = PolicyTokenStats(lm, 8, 1.0)(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_len)
        lp.sum().backward()
        results.append((lp.detach(), torch.cat([p.grad.flatten() for p in lm.parameters() if p.grad is not None])))
    (eager_lp, eager_grad), (comp_lp, comp_grad) = results
    assert torch.allclose(eager_lp, comp_lp, atol=1e-5) and eager_lp.abs().sum() > 0
    assert torch.allclose(eager_grad, comp_grad, atol=1e-5, rtol=1e-3)


def test_liger_is_refused_on_a_cpu_learner_before_any_actor_starts():
    """`learner.liger`: Liger's kernels are Triton GPU kernels, so a CPU learner's config fails at
    validation, naming the key; on GPUs the option validates."""
    from configs.schema import Config, LearnerConfig

    with pytest.raises(ValueError, match="learner.liger needs GPUs.*learner.liger: false"):
        LearnerConfig(liger=True)
    with pytest.raises(ValueError, match="learner.liger"):
        Config(learner={"liger": True, "gpus_per_rank": 0})
    assert LearnerConfig(liger=True, gpus_per_rank=1).liger and not LearnerConfig().liger
    with pytest.raises(ValueError, match="learner.liger and learner.compile_layers.*set one of them to false"):
        LearnerConfig(liger=True, compile_layers=True, gpus_per_rank=1)
    assert LearnerConfig(compile_layers=True, gpus_per_rank=1).compile_layers


def test_apply_liger_names_the_package_or_the_model_and_keeps_the_chunked_head(tiny_gemma_dir, monkeypatch):
    """Without `liger_kernel` the error names the package and the key; Liger's patch does nothing for a model type
    it does not know, so that is refused by name; a known one is patched with the norm, RoPE and MLP kernels and
    none of the loss-replacing ones (the learner's chunked LM head computes every log-prob)."""
    import sys
    import types

    from transformers import AutoModelForCausalLM

    from actors.learner.liger import apply_liger

    lm = AutoModelForCausalLM.from_pretrained(tiny_gemma_dir, dtype=torch.float32)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # as on a machine without it
    with pytest.raises(ImportError, match="pip install liger-kernel.*learner.liger=false"):
        apply_liger(lm)

    calls = []
    patch = types.ModuleType("liger_kernel.transformers.monkey_patch")
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"qwen2": None, "llama": None}
    patch._apply_liger_kernel_to_instance = lambda model, **kernels: calls.append((model, kernels))
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", types.ModuleType("liger_kernel.transformers"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", patch)
    with pytest.raises(ValueError, match=f"no kernels for model type '{lm.config.model_type}'.*learner.liger=false"):
        apply_liger(lm)
    assert not calls
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN[lm.config.model_type] = None
    assert apply_liger(lm) == lm.config.model_type
    [(model, kernels)] = calls
    assert model is lm
    assert kernels["rms_norm"] and kernels["rope"] and kernels["swiglu"] and kernels["geglu"]
    assert not kernels["cross_entropy"] and not kernels["fused_linear_cross_entropy"]


def _liger_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


@pytest.mark.skipif(not torch.cuda.is_available() or not _liger_importable(), reason="needs a CUDA GPU and liger_kernel")
def test_liger_gives_the_eager_logprobs_and_gradients_on_a_gpu():
    """On a GPU: Liger's kernels change the summation order, not the model (the Qwen2.5-1.5B architecture, 4 layers,
    fp32, random init)."""
    from scripts.probes.liger_agreement import agreement

    result = agreement("configs/architectures/qwen2.5-1.5b", layers=4)
    assert result["max_abs_logprob_diff"] < 1e-3 * max(1.0, result["mean_abs_logprob"])
    assert result["grad_cosine"] > 0.999


def test_a_limited_cpu_capability_gets_its_own_inductor_cache(monkeypatch):
    """Inductor's cache does not key CPU kernels by ATEN_CPU_CAPABILITY: AVX-512 kernels reused under avx2 gave
    NaN log-probs. A limited capability gets a folder of its own; a folder the user chose is kept."""
    import os

    from actors.learner.compiled import cache_per_cpu_capability

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert cache_per_cpu_capability() is None and not os.environ.get("TORCHINDUCTOR_CACHE_DIR", "").endswith("-avx2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    folder = cache_per_cpu_capability()
    assert folder.endswith("-avx2") and os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", folder.removesuffix("-avx2"))  # torch's default, set by torch
    assert cache_per_cpu_capability() == folder
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/chosen")
    assert cache_per_cpu_capability() is None and os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/chosen"
