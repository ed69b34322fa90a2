"""`scripts.bench.learner --local`'s settings (fast; the run itself is a slow test in test_learner.py)."""

from __future__ import annotations

import pytest

from scripts.bench.learner_local import parse_setting


def test_parse_setting_reads_learner_keys_with_yaml_values():
    assert parse_setting("learner.shared_prefix=false,learner.micro_batch_size=4") == {
        "shared_prefix": False, "micro_batch_size": 4}
    assert parse_setting("learner.lora={rank: 1, alpha: 10, target_modules: [q_proj, v_proj]},learner.lr=1.0e-4") == {
        "lora": {"rank": 1, "alpha": 10, "target_modules": ["q_proj", "v_proj"]}, "lr": 1e-4}
    assert parse_setting("") == {}
    with pytest.raises(ValueError, match="learner.KEY=VALUE.*'rollout.temperature=1'"):
        parse_setting("rollout.temperature=1")
    with pytest.raises(ValueError, match="'learner.lr'"):
        parse_setting("learner.lr")


def test_random_trajectories_have_the_asked_shape_without_a_tokenizer():
    """`--shape random` (what a bare GPU machine runs): a group shares its prompt, responses differ, and half
    of each response is policy tokens in 48-token blocks; ids 0-9 (special tokens) are never drawn."""
    from actors.learner.batch import make_train_batch
    from scripts.bench.learner_local import random_trajectories

    trajs = random_trajectories(1000, questions=3, group=2, prompt_tokens=40, response_tokens=192)
    assert len(trajs) == 6 and [t["group_id"] for t in trajs] == ["q0", "q0", "q1", "q1", "q2", "q2"]
    assert trajs[0]["prompt_ids"] == trajs[1]["prompt_ids"] != trajs[2]["prompt_ids"]
    assert trajs[0]["response_ids"] != trajs[1]["response_ids"]
    assert trajs[0]["loss_mask"] == ([1] * 48 + [0] * 48) * 2
    assert all(10 <= i < 990 for t in trajs for i in t["prompt_ids"] + t["response_ids"])
    batch = make_train_batch(trajs, 0)
    assert int(batch.attention_mask.sum()) == 6 * (40 + 192) and int(batch.loss_mask.sum()) == 6 * 96
    with pytest.raises(ValueError, match="group=0"):
        random_trajectories(1000, questions=1, group=0, prompt_tokens=4, response_tokens=4)


def test_the_architecture_configs_are_the_qwen2_5_shapes():
    """`configs/architectures/*` (random-init benchmarks without the Hub): the published Qwen2.5 shapes."""
    from transformers import AutoConfig, AutoModelForCausalLM
    import torch

    from actors.learner.flops import decoder_param_count
    from scripts.bench.learner_local import model_vocab

    expected = {"qwen2.5-1.5b": 1.31e9, "qwen2.5-3b": 2.77e9, "qwen2.5-7b": 6.53e9}  # non-embedding parameters
    for name, params in expected.items():
        path = f"configs/architectures/{name}"
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
        assert abs(decoder_param_count(lm) / params - 1) < 0.01, (name, decoder_param_count(lm))
        assert model_vocab(path) in (151936, 152064)
