"""Learning-rate warm-up in the papers' unit (training steps) and the critic's own settings, without
DeepSpeed: R-Search §4.3 (warm-up ratio 0.95 over 195 steps) and s3 App. A.2 (critic: 1% warm-up,
micro-batch 10; actor: no warm-up, micro-batch 15)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from actors.learner.critic import CriticLearner
from actors.learner.policy import PolicyLearner
from algorithms.schedule import warmup_factor, warmup_steps
from configs.loader import load_config
from configs.schema import LearnerConfig
from pipelines.train import total_steps


class FakeEngine:
    """What `_apply_lr_schedule` touches of a DeepSpeed engine: the optimizer's parameter groups."""

    def __init__(self) -> None:
        self.optimizer = SimpleNamespace(param_groups=[{"lr": None}, {"lr": None}])


def lr_of_step(rank, step: int) -> float:
    rank.engine, rank.updates = FakeEngine(), step
    lr = rank._apply_lr_schedule()
    assert all(g["lr"] == lr for g in rank.engine.optimizer.param_groups)
    return lr


def test_r_search_warmup_is_95_percent_of_195_training_steps():
    assert warmup_steps(0.95, 195) == 185
    assert warmup_steps(0.01, 20) == 0  # s3's critic at 20 steps: 0.2 of a step
    assert warmup_steps(0.95, 20) == 19  # float 0.95 * 20 = 18.999...
    assert warmup_factor(0, 185) == 0.0 and warmup_factor(185, 185) == 1.0
    assert warmup_factor(93, 185) == pytest.approx(93 / 185)
    with pytest.raises(ValueError, match="fraction"):
        warmup_steps(95, 195)


def test_r_search_gpu_config_warms_up_over_training_steps_not_optimizer_steps():
    cfg = load_config("configs/r_search_gpu.yaml")
    assert cfg.learner.warmup_ratio == 0.95 and total_steps(cfg) == 195
    batch = cfg.train.questions_per_step * cfg.rollout.samples_per_prompt
    assert batch // cfg.learner.mini_batch_size == 2  # two optimizer steps per training step
    policy = PolicyLearner(cfg.learner, total_steps=total_steps(cfg))
    policy.base_lr = cfg.learner.lr
    assert policy.warmup == 185
    # The old optimizer-step warm-up (185 of them) was over at training step 93; this one is halfway there.
    assert lr_of_step(policy, 93) == pytest.approx(1e-6 * 93 / 185)
    assert lr_of_step(policy, 184) < 1e-6 == lr_of_step(policy, 185) == lr_of_step(policy, 194)


def test_s3_critic_warmup_and_micro_batch_are_its_own():
    cfg = load_config("configs/s3_gpu.yaml")
    c = cfg.learner
    assert (c.warmup_ratio, c.critic_warmup_ratio) == (0.0, 0.01)
    assert (c.micro_batch_size, c.critic_micro_batch_size, c.mini_batch_size) == (15, 10, 120)
    policy = PolicyLearner(c.model_copy(update={"num_ranks": 1}), total_steps=100)
    critic = CriticLearner(c.model_copy(update={"num_ranks": 1}), total_steps=100)
    assert (policy.micro_batch_size, policy.grad_accum_steps, policy.warmup) == (15, 8, 0)
    assert (critic.micro_batch_size, critic.grad_accum_steps, critic.warmup) == (10, 12, 1)
    critic.base_lr = c.critic_lr
    assert lr_of_step(critic, 0) == 0.0 and lr_of_step(critic, 1) == pytest.approx(1e-5)
    plain = CriticLearner(LearnerConfig(micro_batch_size=3))
    assert plain.micro_batch_size == 3 and plain.warmup == 0


def test_old_optimizer_step_warmup_key_is_refused_naming_the_fix():
    with pytest.raises(ValidationError, match=r"warmup_ratio: 0\.95"):
        LearnerConfig(warmup_steps=185)
    with pytest.raises(Exception, match="learner.*warmup_steps is gone"):
        load_config("configs/r_search_gpu.yaml", ["learner.warmup_steps=185"])
    with pytest.raises(ValueError, match="pass total_steps"):
        PolicyLearner(LearnerConfig(warmup_ratio=0.5))


def test_saved_configs_of_older_runs_still_load():
    """A run directory's config.yaml written before warmup_ratio holds `warmup_steps: 0`: it loads
    (there was no warm-up to convert), so --resume and serving of older runs keep working."""
    from configs.schema import LearnerConfig

    assert LearnerConfig(warmup_steps=0).warmup_ratio == 0.0
    with pytest.raises(ValueError, match="warmup_ratio"):
        LearnerConfig(warmup_steps=185)
