"""LoRA policies (`learner.lora`): peft adapters injected into the Hugging Face model in place.

Only the adapters have gradients and optimizer state. The rollout engines, evaluation and serving get
ordinary Hugging Face weights: each adapted linear layer merged, W + (alpha / r) · B·A (Hu et al.
2021, Eq. 3), under its own name (`merged_state`). A checkpoint holds both: the merged model in
`policy/hf/` and the adapter alone in `policy/adapter/` (peft's `adapter_model.safetensors` +
`adapter_config.json`, loadable with `peft.PeftModel.from_pretrained` over the base model).

The model stays a plain `PreTrainedModel` (`peft.inject_adapter_in_model`, no `PeftModel` wrapper), so
`PolicyTokenStats`, the packing path and DeepSpeed see the same module tree as without adapters.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

ADAPTER = "default"  # peft's adapter name
_LORA = re.compile(r"\.lora_(A|B)\." + ADAPTER + r"\.weight$")


def peft_config(settings: Any) -> Any:
    """A `peft.LoraConfig` of `learner.lora` (`configs.schema.LoraSettings`)."""
    from peft import LoraConfig

    return LoraConfig(r=settings.rank, lora_alpha=settings.alpha, target_modules=settings.target_modules,
                      lora_dropout=settings.dropout, bias="none")


def add_lora(lm: nn.Module, settings: Any, gradient_checkpointing: bool = False) -> nn.Module:
    """Freeze `lm` and inject LoRA adapters (`settings`: rank, alpha, target_modules, dropout); returns `lm`
    with only the adapters' A and B matrices trainable (B starts at 0: the model's outputs are unchanged).

    Raises:
        ValueError: `target_modules` matches no module of the model (peft's message names them).
    """
    from peft import inject_adapter_in_model

    for p in lm.parameters():
        p.requires_grad_(False)
    lm = inject_adapter_in_model(peft_config(settings), lm, adapter_name=ADAPTER)
    for name, p in lm.named_parameters():
        p.requires_grad_(".lora_" in name)
    if gradient_checkpointing:  # checkpointed blocks need an input that requires grad to backpropagate
        lm.enable_input_require_grads()
    return lm


def has_lora(state: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict holds LoRA adapter tensors."""
    return any(_LORA.search(n) for n in state)


def merged_state(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Hugging Face weights of a LoRA-injected model's state dict: `X.base_layer.weight` + scale · B·A as
    `X.weight` (fp32 math, the base's dtype kept), `X.base_layer.bias` as `X.bias`, adapters dropped;
    other tensors as they are.

    Args:
        state: names -> tensors as `named_parameters()` of the injected model gives them.
        scale: alpha / rank.
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if _LORA.search(name):
            continue
        if ".base_layer." not in name:
            out[name] = t
            continue
        module, _, leaf = name.rpartition(".base_layer.")
        if leaf == "weight" and f"{module}.lora_A.{ADAPTER}.weight" in state:
            a, b = state[f"{module}.lora_A.{ADAPTER}.weight"], state[f"{module}.lora_B.{ADAPTER}.weight"]
            t = (t.float() + scale * (b.float() @ a.float())).to(t.dtype)
        out[f"{module}.{leaf}"] = t
    return out


def adapted_layers(state: dict[str, torch.Tensor]) -> set[str]:
    """Prefixes (`model.layers.3.`) of the decoder layers that hold adapters: the layers an update changes."""
    out = set()
    for name in state:
        if _LORA.search(name):
            m = re.match(r"(.*\.layers\.\d+\.)", name)
            out.add(m.group(1) if m else name.rsplit(".lora_", 1)[0] + ".")
    return out


def save_adapter(state: dict[str, torch.Tensor], settings: Any, directory: Path, base_model: str) -> None:
    """The adapter alone as peft writes it, for `peft.PeftModel.from_pretrained(base, directory)`:
    `adapter_model.safetensors` (names as a `PeftModel`'s state dict gives them, without the adapter
    name) and `adapter_config.json` naming `base_model`."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    adapter = {"base_model.model." + n.replace(f".{ADAPTER}.", "."): t.contiguous()
               for n, t in state.items() if _LORA.search(n)}
    save_file(adapter, str(directory / "adapter_model.safetensors"))
    config = peft_config(settings)
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(directory))
