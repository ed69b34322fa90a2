"""Learning-rate warm-up in the papers' unit: a fraction of *training steps* (rollout batches).

R-Search §4.3 ("warm-up ratio 0.95", 195 steps) and s3 App. A.2 ("no warm-up for the actor and a 1%
warm-up ratio for the critic") state warm-up as a ratio of the run's training steps; their trainer
(verl, s3 App. A.2 / Eval-RAR §5.1) steps its scheduler once per training step, whatever the number of
optimizer steps (mini-batches x PPO epochs) inside one. So does this project: every optimizer step of
training step t uses `lr * warmup_factor(t, warmup_steps(ratio, total))`.
"""

from __future__ import annotations


def warmup_steps(ratio: float, total_steps: int) -> int:
    """Training steps of the linear warm-up: ``int(ratio * total_steps)`` (floor, as verl).

    Args:
        ratio: fraction of the run in [0, 1] (R-Search: 0.95; s3 critic: 0.01).
        total_steps: training steps of the whole run (all stages), > 0.

    Returns:
        int >= 0 (R-Search: 0.95 x 195 -> 185; s3 critic: 0.01 x 20 -> 0).

    Raises:
        ValueError: ratio outside [0, 1] or total_steps < 1.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"warm-up ratio must be in [0, 1] (a fraction of training steps), got {ratio}")
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    return int(ratio * total_steps + 1e-9)  # 0.95 * 20 is 18.999999999999996 in floats


def warmup_factor(step: int, warmup: int) -> float:
    """Multiplier of the learning rate at training step `step` (0-based): ``step / warmup`` while
    ``step < warmup``, then 1 (linear warm-up, then constant; the first step of a warm-up runs at 0).

    Raises:
        ValueError: a negative step or warm-up.
    """
    if step < 0 or warmup < 0:
        raise ValueError(f"step and warmup must be >= 0, got step={step}, warmup={warmup}")
    return 1.0 if step >= warmup else step / warmup
