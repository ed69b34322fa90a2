"""LoRA policies (`learner.lora`): only the adapters train, the merged weights are the adapted
model's, and the saved adapter loads with peft over the base model."""

from __future__ import annotations

import pytest
import torch

from actors.learner.lora import add_lora, adapted_layers, has_lora, merged_state, save_adapter
from configs.schema import LearnerConfig, LoraSettings


def _tiny():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float().eval()


def _trained_lora(settings: LoraSettings):
    lm = add_lora(_tiny(), settings)
    torch.manual_seed(1)
    with torch.no_grad():  # B starts at 0 (no change); a trained adapter has moved it
        for name, p in lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return lm


def test_only_the_adapters_train():
    lm = add_lora(_tiny(), LoraSettings(rank=4, alpha=8))
    trainable = [n for n, p in lm.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # all-linear: every projection of both layers, not the LM head
    assert sum(".lora_A." in n for n in trainable) == 2 * 7 and not any("lm_head" in n for n in trainable)
    assert has_lora(dict(lm.named_parameters())) and adapted_layers(dict(lm.named_parameters())) == {
        "model.layers.0.", "model.layers.1."}


def test_merged_weights_give_the_adapted_model_s_outputs(tmp_path):
    from transformers import Qwen2ForCausalLM

    settings = LoraSettings(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    lm = _trained_lora(settings)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = lm(input_ids=ids).logits
    state = {n: p.detach() for n, p in lm.named_parameters()}
    merged = merged_state(state, settings.alpha / settings.rank)
    assert not has_lora(merged) and not any("base_layer" in n for n in merged)
    plain = _tiny()
    assert set(merged) == {n for n, _ in plain.named_parameters()}
    plain.load_state_dict(merged, strict=False)
    with torch.no_grad():
        got = plain(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, _tiny()(input_ids=ids).logits, atol=1e-3)

    # The adapter alone, as peft writes it, over the base model gives the same outputs.
    from peft import PeftModel

    base_dir = tmp_path / "base"
    _tiny().save_pretrained(str(base_dir))
    save_adapter(state, settings, tmp_path / "adapter", str(base_dir))
    loaded = PeftModel.from_pretrained(Qwen2ForCausalLM.from_pretrained(str(base_dir)).eval(), str(tmp_path / "adapter"))
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, want, atol=1e-5)


def test_lora_settings_are_checked():
    assert LearnerConfig().lora is None
    assert LearnerConfig(lora={"rank": 1, "alpha": 2}).lora.target_modules == "all-linear"
    with pytest.raises(Exception, match="rank"):
        LearnerConfig(lora={"rank": 0})
    with pytest.raises(Exception, match="extra|rnak"):
        LearnerConfig(lora={"rnak": 4})
