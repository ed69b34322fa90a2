"""The trainer's side of `train.async_mode: fully`: the run's groups in schedule order and the
`RolloutStream` that generates them on the rollout workers (`pipelines/rollout_stream.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipelines.rollout_stream import Group, RolloutStream
from pipelines.step_schedule import batch_indices, stage_at, total_steps


def run_groups(trainer: Any) -> list[Group]:
    """Every step's questions (`batch_indices`) as groups, in step order, each with its step's stage
    options and sampling seed (the same seed a synchronous run gives that step)."""
    cfg = trainer.cfg
    groups = []
    for step in range(total_steps(cfg)):
        _, options, train_file = stage_at(cfg, step)
        pool = trainer.training_questions(train_file, options)
        idx = batch_indices(step, cfg.train.questions_per_step, len(pool), cfg.seed, cfg.train.shuffle)
        groups += [Group((step, j), pool[i], options, cfg.seed * 1_000_003 + step) for j, i in enumerate(idx)]
    return groups


def start_stream(trainer: Any, step: int, committed: Sequence[Sequence[int]] = ()) -> RolloutStream:
    """A `RolloutStream` over the run's groups from learner version `step`, skipping `committed` keys.

    Each group is one `RolloutWorker.run` call of `samples_per_prompt` episodes. Its trajectories must
    hold each sample once (`check_episodes`); their `group_id` gets `#<step>` (the step the group was
    scheduled for), as one question may come back in a later epoch while an earlier copy is in flight.
    A failed call counts as a worker death (a Ray actor error) or a rerun part; the worker gets the
    current weights again (`resync_worker`, from `take`) before its next call.
    """
    from pipelines.rollout_dispatch import check_episodes

    cfg, ro = trainer.cfg, trainer.cfg.rollout
    n = ro.samples_per_prompt
    limits = {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn,
              "max_observation_tokens": ro.max_observation_tokens, "max_total_tokens": ro.max_total_tokens}

    def submit(worker: Any, group: Group) -> Any:
        sampling = {"temperature": ro.temperature, "top_p": ro.top_p if ro.temperature > 0 else 1.0,
                    "seed": group.seed}
        return worker.run.remote([group.example], cfg.train.recipe, recipe_config=group.options, n=n,
                                 sampling=sampling, limits=limits, chat=ro.chat, compute_reward=True)

    def check(group: Group, trajs: list[dict]) -> list[dict]:
        check_episodes(trajs, [group.example], n)
        for t in trajs:
            t["group_id"] = f"{t['group_id']}#{group.key[0]}"
        return trajs

    def on_failure(worker: Any, error: Exception) -> None:
        from actors.lifecycle import actor_death_errors

        trainer.faults["rollout_parts_rerun"] += 1
        if isinstance(error, actor_death_errors()):
            trainer.faults["rollout_worker_deaths"] += 1

    return RolloutStream(run_groups(trainer), submit, trainer.workers, cfg.train.questions_per_step,
                         cfg.train.max_staleness, cfg.train.in_flight_groups or cfg.train.questions_per_step,
                         learner_version=step, committed=[tuple(k) for k in committed], on_failure=on_failure,
                         check=check)


def resync_worker(trainer: Any, worker: Any) -> None:
    """Give a worker whose call failed the learner's current weights (a restarted worker loads the
    starting model); one that is still down fails its next call and comes back here."""
    try:
        trainer.policy.sync_weights([worker], version=trainer.weight_version)
    except Exception as e:  # noqa: BLE001 - still restarting
        import logging

        logging.getLogger(__name__).warning("rollout worker resync failed (%s); trying again", type(e).__name__)
