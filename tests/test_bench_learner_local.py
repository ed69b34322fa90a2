"""`scripts.bench_learner --local`'s settings (fast; the run itself is a slow test in test_learner.py)."""

from __future__ import annotations

import pytest

from scripts.bench_learner_local import parse_setting


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
