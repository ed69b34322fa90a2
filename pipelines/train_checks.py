"""Checks of a training config that run before any actor starts: cross-section rules the schema cannot
express, the index (optionally) and the data files a run reads."""

from __future__ import annotations

from pathlib import Path

from configs.schema import Config


class TrainConfigError(ValueError):
    """A config that cannot train; raised before any actor starts."""


def validate(cfg: Config, need_index: bool = True) -> Config:
    """Check what the schema cannot (cross-section rules), the index (unless not `need_index`) and the
    data files (`check_data`); returns `cfg`. Recipe names and options are checked when the config
    loads (`configs.schema.TrainConfig`).

    Raises:
        TrainConfigError: naming the keys and the fix.
        DataPackError: a missing data pack or QA file.
    """
    from recipes import RECIPES, recipe_class

    if not recipe_class(cfg.train.recipe).trainable:
        trainable = sorted(name for name, cls in RECIPES.items() if cls.trainable)
        raise TrainConfigError(f"train.recipe={cfg.train.recipe!r} is an evaluation baseline, nothing to train; "
                               f"choose one of {trainable}")
    ws = cfg.train.warm_start
    if ws is not None and ws.source == "expert" and not recipe_class(cfg.train.recipe).has_expert():
        raise TrainConfigError(f"train.warm_start.source=expert: recipe {cfg.train.recipe!r} has no expert "
                               "demonstrations (Recipe.expert_turn); set train.warm_start.source: policy")
    episodes = cfg.train.questions_per_step * cfg.rollout.samples_per_prompt
    if episodes % cfg.learner.mini_batch_size:
        raise TrainConfigError(
            f"train.questions_per_step x rollout.samples_per_prompt = {episodes} episodes per step is not a "
            f"multiple of learner.mini_batch_size ({cfg.learner.mini_batch_size}); change one of them")
    if cfg.algorithm.advantage_estimator in ("grpo", "dr_grpo", "rloo", "group_mean") and cfg.rollout.samples_per_prompt < 2:
        raise TrainConfigError(f"algorithm.advantage_estimator={cfg.algorithm.advantage_estimator!r} compares samples "
                               f"of a question: set rollout.samples_per_prompt >= 2")
    if need_index and not Path(cfg.index.dir).is_dir():
        raise TrainConfigError(f"index.dir={cfg.index.dir!r} has no index; build it: "
                               f".venv/bin/python -m scripts.build_index --config <config>")
    check_data(cfg)
    return cfg


def check_data(cfg: Config) -> None:
    """The data pack and the QA files a run reads (every stage's training file, the dev file when it
    evaluates) exist, so a missing one fails before Ray starts.

    Raises:
        DataPackError: naming the missing pack or file and how to point at one.
    """
    from pipelines.data import pack_file

    names = {cfg.data.train, *(s.train for s in cfg.train.stages if s.train)}
    if cfg.train.eval_questions:
        names.add(cfg.data.dev)
    for name in sorted(names):
        pack_file(name, cfg.data.dir)
