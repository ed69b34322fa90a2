"""Does `learner.liger` compute what eager PyTorch computes? Per-token log-probs and their gradients of one
model, eager and with Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU patched in (`actors.learner.liger`), on the
same random token ids, through the learner's own `PolicyTokenStats`. Needs a CUDA GPU and `liger_kernel`.

    python -m scripts.probes.liger_agreement configs/architectures/qwen2.5-1.5b [--layers 4] [--dtype bf16]

A model directory's `config.json` is enough (random init, seed 0; `--layers` cuts the depth to keep it quick).
Prints one JSON line: max |Δ| of the log-probs (nats), the cosine of the two flattened gradients, and the
eager log-probs' own scale.
"""

from __future__ import annotations

import argparse
import json

import torch


def agreement(model_dir: str, device: str = "cuda", dtype: torch.dtype = torch.float32, layers: int | None = None,
              batch: int = 2, seq: int = 64, seed: int = 0) -> dict[str, float]:
    """Eager against Liger on one random-init model.

    Args:
        model_dir: a Hugging Face model directory (its `config.json` is read; weights are not).
        device: where both run ("cuda": Liger's kernels are Triton GPU kernels).
        dtype: the models' parameter dtype.
        layers: decoder layers kept (None = the config's).
        batch, seq: rows and tokens per row of the random ids (the last half of each row is the response).

    Returns:
        {"max_abs_logprob_diff": nats, "grad_cosine": cosine of the flattened gradients of sum(log-probs),
         "mean_abs_logprob": the eager log-probs' mean |value|, "model_type": str}.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from actors.learner.liger import apply_liger
    from actors.learner.token_stats import PolicyTokenStats

    config = AutoConfig.from_pretrained(model_dir)
    text = config.get_text_config()
    if layers:
        text.num_hidden_layers = layers
        if getattr(text, "layer_types", None):
            text.layer_types = text.layer_types[:layers]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, text.vocab_size, (batch, seq), generator=gen).to(device)
    mask = torch.ones_like(ids)
    prompt = seq // 2
    loss_mask = torch.ones(batch, seq - prompt, device=device)
    out = {}
    for liger in (False, True):
        torch.manual_seed(seed)
        lm = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
        if liger:
            out["model_type"] = apply_liger(lm)
        lp, _ = PolicyTokenStats(lm, 512, 1.0)(ids, mask, loss_mask, prompt)
        lp.sum().backward()
        grad = torch.cat([p.grad.float().flatten() for p in lm.parameters() if p.grad is not None])
        out[liger] = (lp.detach().float(), grad)
    (eager_lp, eager_grad), (liger_lp, liger_grad) = out.pop(False), out.pop(True)
    return {"max_abs_logprob_diff": float((eager_lp - liger_lp).abs().max()),
            "grad_cosine": float(torch.nn.functional.cosine_similarity(eager_grad, liger_grad, dim=0)),
            "mean_abs_logprob": float(eager_lp.abs().mean()), **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", help="a model directory (config.json)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers kept (0 = all)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    print(json.dumps({"model": args.model_dir, "dtype": args.dtype,
                      **agreement(args.model_dir, dtype=dtype, layers=args.layers or None)}))


if __name__ == "__main__":
    main()
