"""Learner options of issue 40: `gradient_checkpointing: auto` (recompute only where the activations
would not fit) and fused AdamW on CUDA."""

from __future__ import annotations

import torch

from actors.learner.batch import make_train_batch
from actors.learner.checkpointing import activation_bytes, needs_checkpointing, set_checkpointing


def test_the_estimate_for_a_1_5b_policy_on_an_h100():
    """Qwen2.5-1.5B (hidden 1536, 28 layers), bf16: 16 sequences of 1,024 tokens store ~24 GB of activations
    (34 bytes per token, hidden unit and layer), more than half of ~40 GB left after weights and AdamW
    state: recompute. 4 sequences (6 GB) fit."""
    assert activation_bytes(16 * 1024, 1536, 28, 2) == 34 * 16 * 1024 * 1536 * 28
    assert needs_checkpointing(16 * 1024, 1536, 28, 2, free=40 * 2**30)
    assert not needs_checkpointing(4 * 1024, 1536, 28, 2, free=40 * 2**30)
    assert activation_bytes(1024, 1536, 28, 4) == 2 * activation_bytes(1024, 1536, 28, 2)  # fp32 activations


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
