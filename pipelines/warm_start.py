"""Supervised fine-tuning before RL (`train.warm_start`): rejection sampling (STaR, Zelikman et al. 2022;
RFT, Yuan et al. 2023) applied to a search agent, recipe-independent, or the recipe's expert demonstrations.

`source: expert`: the recipe's rule-based expert (`Recipe.expert_turn`, knowing the gold answers) writes one
episode per question through the rollout workers' own agent loop (`AgentLoop(expert=True)`): the recipe's
prompt, tags, tokenization and loss mask, real retrieval, the recipe's reward. The episodes it could
demonstrate (`demonstrations`) are the supervised data; the rest of the pass is the same as below.

Before step 1 of a fresh run the untrained policy rolls out `warm_start.samples` episodes of
`warm_start.questions` training questions (a seeded sample, at the training temperature, scored by the
recipe's own reward). The episodes whose reward is above `warm_start.min_reward` (s3: an F1 gain over
naive RAG) are kept, and the policy takes one supervised pass over their policy tokens (loss mask: the
observations stay out), `warm_start.epochs` times. The pass is the policy learner's own update with the
supervised loss (`algorithm.policy_loss: nll`, the token-mean negative log-likelihood) and no KL or entropy
term; an earlier version used the PPO surrogate with advantage 1, whose clip stopped every token once its
probability had risen by 1 + clip_eps, so a warm start could barely move the policy. Then the workers get the new weights and the RL steps start from them. The
warm start counts as one learner update (the learning-rate warm-up moves on by one).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Sequence

from pipelines.checkpoints import WARM_START_NAME

log = logging.getLogger(__name__)

WARM_START_DIR = f"checkpoints/{WARM_START_NAME}"
"""Where a run keeps its warm-started policy (`<run>/checkpoints/warm-start/policy/hf`), beside `step-<n>`."""


def kept_episodes(trajectories: Sequence[dict], min_reward: float) -> list[dict]:
    """The trajectories (dicts, `Trajectory.to_json()`) whose `reward` is above `min_reward` and that hold at
    least one policy token (`loss_mask`)."""
    return [t for t in trajectories
            if t.get("reward") is not None and float(t["reward"]) > min_reward and any(t["loss_mask"])]


def demonstrations(trajectories: Sequence[dict]) -> list[dict]:
    """The expert trajectories (dicts) that demonstrate something: ended by the recipe's own answer or
    completion (not `NO_DEMONSTRATION` or a limit) and holding at least one policy token."""
    return [t for t in trajectories if t.get("finish_reason") in ("answer", "complete") and any(t["loss_mask"])]


def kept_questions(trajectories: Sequence[dict]) -> int:
    """How many questions `trajectories` (dicts) cover: distinct `group_id`s (a question's samples share one);
    the warm start's share of `train/question_visits`, which counts a group of samples as one visit."""
    return len({t["group_id"] for t in trajectories})


def supervised_batch(trajectories: Sequence[dict], mini_batch_size: int, pad_token_id: int, epochs: int = 1):
    """A `TrainBatch` of `trajectories` repeated `epochs` times and cycled up to a multiple of
    `mini_batch_size` rows (the learner's update takes whole mini-batches), with `advantages` 1.0 on every
    policy token (`[B, R]` float32, equal to `loss_mask`) and `old_logprobs` still to compute.

    Raises:
        ValueError: no trajectories, or `mini_batch_size` / `epochs` below 1.
    """
    from actors.learner.batch import make_train_batch

    if not trajectories:
        raise ValueError("supervised_batch: no trajectories to train on")
    if mini_batch_size < 1 or epochs < 1:
        raise ValueError(f"supervised_batch: mini_batch_size ({mini_batch_size}) and epochs ({epochs}) must be >= 1")
    rows = list(trajectories) * epochs
    total = -(-len(rows) // mini_batch_size) * mini_batch_size
    rows += [rows[i % len(rows)] for i in range(total - len(rows))]
    batch = make_train_batch(rows, pad_token_id)
    return batch.with_fields(advantages=batch.loss_mask.clone())


def supervised_algorithm(algorithm: Any) -> Any:
    """`algorithm` (an `AlgorithmConfig`) for the supervised pass: the negative log-likelihood loss
    (`policy_loss: nll`; a PPO clip would stop each token once its probability rose by 1 + clip_eps over the
    pre-warm-start policy), no KL or entropy term, no off-policy weights, every row kept."""
    return algorithm.model_copy(update={"policy_loss": "nll", "kl_coef": 0.0, "entropy_coef": 0.0,
                                        "skip_zero_advantage": False, "off_policy_correction": "none"})


def warm_start_questions(pool: Sequence[dict], count: int, seed: int) -> list[dict]:
    """`count` questions of `pool` (all when it has fewer), a sample seeded by `seed`."""
    return random.Random(seed * 7919 + 1).sample(list(pool), min(count, len(pool)))


def warm_start(trainer: Any) -> dict[str, float]:
    """Run the warm start on a `pipelines.train.Trainer` whose actors are up (see the module docstring).

    Returns:
        `warm_start/*` metrics: episodes, kept (episodes), kept_questions (questions with a kept episode),
        turn_over_limit (expert episodes dropped for a turn longer than the limits allow), reward_mean (all
        episodes), kept_reward_mean, and the update's policy_loss (the NLL), token_prob_mean,
        lr, optimizer_steps and update_s (absent when nothing was kept). Sets `trainer.warm_questions` to
        kept_questions once the update ran (the questions it trained on count in `train/question_visits`).
    Raises:
        As `Trainer.rollout` and `LearnerGroup.update`.
    """
    from actors.rollout.agent_loop import EXPERT_TURN_OVER_LIMIT
    from pipelines.step_schedule import stage_at

    cfg = trainer.cfg
    ws = cfg.train.warm_start
    _, options, train_file = stage_at(cfg, 0)
    # the whole training pool, not the learnable questions (train.select_questions): those are chosen after the warm
    # start, by the warm-started policy's samples, and an untrained policy's choice left it a dozen questions
    examples = warm_start_questions(trainer.questions(train_file), ws.questions, cfg.seed)
    expert = ws.source == "expert"
    if expert:  # one demonstration per question: the expert is deterministic
        trajs = trainer.rollout(examples, options, 1, 0.0, seed=cfg.seed * 1_000_003 - 1, expert=True)
        kept = demonstrations(trajs)
    else:
        trajs = trainer.rollout(examples, options, ws.samples, cfg.rollout.temperature, seed=cfg.seed * 1_000_003 - 1)
        kept = kept_episodes(trajs, ws.min_reward)
    rewards = [float(t["reward"] or 0.0) for t in trajs]
    over = sum(t.get("finish_reason") == EXPERT_TURN_OVER_LIMIT for t in trajs) if expert else 0
    if over:  # silent, this looked like questions the expert could not answer
        log.warning("warm start: %d of %d expert demonstrations were dropped: a turn was longer than "
                    "rollout.max_new_tokens_per_turn (%d) or what rollout.max_total_tokens (%d) left; raise them",
                    over, len(trajs), cfg.rollout.max_new_tokens_per_turn, cfg.rollout.max_total_tokens)
    out = {"warm_start/episodes": float(len(trajs)), "warm_start/kept": float(len(kept)),
           **({"warm_start/turn_over_limit": float(over)} if expert else {}),
           "warm_start/kept_questions": float(kept_questions(kept)),
           "warm_start/reward_mean": sum(rewards) / max(len(rewards), 1),
           "warm_start/kept_reward_mean": sum(float(t["reward"] or 0.0) for t in kept) / max(len(kept), 1)}
    if not kept:
        why = ("the expert found a gold answer in no question's documents" if expert
               else f"none of {len(trajs)} episodes has a reward above {ws.min_reward:g}")
        log.warning("warm start: %s; RL starts from the untrained policy", why)
        return out
    batch = supervised_batch(kept, cfg.learner.mini_batch_size, trainer.pad_token_id, ws.epochs)
    # One learner call (its step counter drives the RL warm-up), so this line stands for its progress.
    log.info("warm start (%s): supervised pass over %d rows (%d episodes x %d epochs) in mini-batches of %d ...",
             ws.source, batch.size, len(kept), ws.epochs, cfg.learner.mini_batch_size)
    m = trainer.policy.update(batch, supervised_algorithm(cfg.algorithm), lr=ws.lr)  # NLL: no old log-probs needed
    trainer.policy.sync_weights(trainer.workers, version=trainer.weight_version)
    trainer.warm_questions = out["warm_start/kept_questions"]  # trained on: the visits count these, not ws.questions
    # The warm-started policy alone, kept for evaluation as its own row ("warm start only":
    # `scripts.evaluate --checkpoint runs/<run> --methods warm_start,...`); no optimizer state, not resumable.
    trainer.policy.save_hf(str(trainer.run_dir / WARM_START_DIR))
    if trainer.reference is not None and cfg.learner.reference_model is None:
        trainer.start_reference()  # the KL term's anchor: the warm-started policy (a restart reloads it too)
        log.info("warm start: the reference model is now the warm-started policy")
    out.update({f"warm_start/{k}": float(m[k]) for k in ("policy_loss", "token_prob_mean", "lr", "optimizer_steps", "update_s")
                if k in m})
    log.info("warm start (%s): kept %d of %d episodes (%s), %d optimizer steps in %.0f s", ws.source, len(kept),
             len(trajs), "expert demonstrations" if expert else f"reward > {ws.min_reward:g}",
             int(m.get("optimizer_steps", 0)), float(m.get("update_s", 0.0)))
    return out
