"""Which questions and recipe options a training step uses: the stage schedule and the seeded
question order (a resumed run sees the same order)."""

from __future__ import annotations

from typing import Any

import torch

from configs.schema import Config


def total_steps(cfg: Config) -> int:
    """Steps of the run: the stages' sum when a staged schedule is given, else `train.total_steps`."""
    return sum(s.steps for s in cfg.train.stages) if cfg.train.stages else cfg.train.total_steps


def stage_at(cfg: Config, step: int) -> tuple[int, dict[str, Any], str]:
    """(stage index, recipe config, training QA file name) in force at `step` (0-based); the recipe
    config is `Config.recipe_config` of the stage's options (top-k from `retrieval.topk`)."""
    end = 0
    for i, stage in enumerate(cfg.train.stages):
        end += stage.steps
        if step < end:
            return i, cfg.recipe_config(stage.recipe_options), stage.train or cfg.data.train
    return 0, cfg.recipe_config(), cfg.data.train


def batch_indices(step: int, per_step: int, num_questions: int, seed: int, shuffle: bool) -> list[int]:
    """Question indices of `step`: positions step*per_step … in an endless sequence of epochs, each a
    permutation seeded by (seed, epoch), so the order depends only on the step (resumable)."""
    out = []
    for i in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(i, num_questions)
        if shuffle:
            perm = torch.randperm(num_questions, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
            out.append(int(perm[pos]))
        else:
            out.append(pos)
    return out
