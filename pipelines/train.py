"""The training loop: rollouts → rewards → reference log-probs / values → advantages → update →
weight sync → metrics → evaluation → checkpoint (DESIGN.md "one training step").

Actors hold the resources (retrieval pool, rollout workers, frozen LLMs, learners); this module only
orders the work. One step:
1. the step's questions (a seeded permutation per epoch, so a resumed run sees the same order);
2. RolloutWorkers run `samples_per_prompt` episodes per question; rewards are computed as each
   episode ends (rule rewards in the worker, frozen-LLM rewards through the generator/judge actors);
3. the policy group recomputes the sampling log-probs in training precision, the reference model
   and the critic (PPO) add theirs;
4. `algorithms.compute_advantages` (GAE, GRPO, Reinforce++, RLOO, group mean);
5. critic and policy updates (DeepSpeed), then the new weights go to every RolloutWorker;
6. metrics (JSONL + wandb), a dev evaluation every `eval_every` steps (also before step 1 and after
   the last; `pipelines.run_loop.dev_eval_steps`), a checkpoint every `save_every`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from configs.schema import Config
from pipelines.checkpoints import STATE_FILE, last_checkpoint, save_rollouts
from pipelines.graceful_stop import SHUTDOWN_TIMEOUT_S, GracefulStop, StopRequested, TrainingStopped, stop_request
from pipelines.run_dir import cfg_to_yaml, new_run_dir, resume_checkpoint  # noqa: F401 - public here too
from pipelines.rollout_ahead import RolloutAhead, staleness_metrics
from pipelines.run_loop import run_loop
from pipelines.train_checks import TrainConfigError, check_data, validate  # noqa: F401 - public here too
from pipelines.train_metrics import fault_metrics, recipe_searches
from pipelines.step_schedule import batch_indices, stage_at, total_steps  # noqa: F401 - public here too

VISITS = "train/question_visits"  # questions trained on so far (a group of samples is one visit)
log = logging.getLogger(__name__)


def question_visits(cfg: Config, steps: int, warm_questions: float = 0.0) -> float:
    """Training questions visited after `steps` completed steps (a group of samples is one visit):
    `steps × train.questions_per_step`, plus `warm_questions` once the warm start ran (it runs before step 1
    of a fresh run; 0 before any step). `warm_questions`: the questions the warm start trained on
    (`Trainer.warm_questions`: those with a kept episode), not the `train.warm_start.questions` it tried."""
    return float(steps * cfg.train.questions_per_step + (warm_questions if steps > 0 else 0.0))


class Trainer:
    """Owns the actors of one run and runs its steps (use `run()`; `close()` frees everything)."""

    def __init__(self, cfg: Config, run_dir: Path, progress: bool = True):
        from actors.lifecycle import ActorSet

        self.cfg, self.run_dir, self.progress = cfg, run_dir, progress
        self.actors = ActorSet()  # retrieval pool, frozen LLMs, reference model, rollout workers
        self.workers: list[Any] = []
        self.pool = self.policy = self.critic = self.reference = None
        self.tracker = None
        self._questions: dict[str, list[dict]] = {}
        self.on_phase: Any = lambda phase: None  # called with "rollout", "prepare", ... as a step moves on
        self.weight_version = 0  # the policy version the rollout workers hold
        self.warm_questions = 0.0  # questions the warm start trained on (saved in checkpoints for --resume)
        self.dev_f1: dict[int, float] = {}  # dev answer F1 by step: which checkpoint is the best one
        self.faults: Counter = Counter()  # failures and recoveries since the last step's metrics
        self.learner_restarts = self.pool_retries = 0
        self.snapshot = None  # pipelines.learner_recovery.LearnerSnapshot with train.learner_recovery: snapshot
        self.ahead = RolloutAhead() if cfg.train.async_mode == "one_step" else None
        self.stream = None  # fully: pipelines.rollout_stream.RolloutStream, started at the first step
        self.stream_committed: list = []  # fully, on --resume: the groups the checkpoint's steps trained
        self.searches = recipe_searches(cfg)  # False: a select-only recipe; the step line shows its own numbers
        if cfg.train.learner_recovery == "snapshot":
            from pipelines.learner_recovery import LearnerSnapshot

            self.snapshot = LearnerSnapshot(cfg.train.snapshot_dir, run_dir.name)

    # -- setup ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Create every actor (retrieval pool, frozen LLMs, learners, reference, rollout workers)."""
        from actors.frozen.worker import start_frozen_llm
        from actors.retrieval.pool import start_retrieval_pool
        from actors.rollout.worker import start_rollout_workers
        from cluster.roles import frozen_llm_count

        cfg, actors = self.cfg, self.actors
        self.pool = actors.adopt(start_retrieval_pool(cfg.index.dir, cfg.retrieval))
        n_frozen = frozen_llm_count(cfg)  # the same count the resource plan reserved CPUs/GPUs for
        frozen = [start_frozen_llm(actors, cfg, role) for role in ("generator", "judge")[:n_frozen]]
        generator, judge = (frozen + frozen)[:2] if frozen else (None, None)  # one actor judges too
        self.start_learners()
        if cfg.algorithm.kl_coef > 0:  # frozen and stateless: a restart reloads it
            self.start_reference()
        self.workers = start_rollout_workers(actors, cfg, self.pool, generator, judge)
        actors.wait_ready(self.workers + frozen, timeout_s=1800, what="rollout workers and frozen LLMs")

    def start_reference(self) -> None:
        """(Re)start the reference model actor: `learner.reference_model`, else the run's warm-started policy
        when it has one (the KL then anchors RL to the warm start, not to the base model; a resumed run finds
        it in its folder), else the policy's starting model. A running one is stopped first."""
        from actors.learner.reference import ReferenceModel
        from pipelines.warm_start import WARM_START_DIR

        cfg, learner = self.cfg, self.cfg.learner
        warm = self.run_dir / WARM_START_DIR / "policy" / "hf"
        if learner.reference_model is None and (warm / "config.json").is_file():
            learner = learner.model_copy(update={"reference_model": str(warm)})
        if self.reference is not None:
            self.actors.stop([self.reference])
        self.reference = self.actors.start(
            ReferenceModel, learner, temperature=cfg.rollout.temperature, max_concurrency=None,
            num_cpus=learner.cpus_per_rank, num_gpus=learner.gpus_per_rank, options={"max_restarts": cfg.ray.max_restarts})

    def start_learners(self) -> None:
        """Create the policy group (and the critic's for PPO) on fresh placement groups."""
        from actors.learner.group import LearnerGroup

        cfg, name = self.cfg, f"searchrl-{self.run_dir.name}"
        name += f"-r{self.learner_restarts}" if self.learner_restarts else ""  # placement group names stay unique
        common = {"name": name, "total_steps": total_steps(cfg), "call_timeout_s": cfg.ray.call_timeout_s}
        self.policy = LearnerGroup("policy", cfg.learner, temperature=cfg.rollout.temperature, **common)
        if cfg.algorithm.needs_critic:
            self.critic = LearnerGroup("critic", cfg.learner, **common)

    def recover_learners(self, error: Exception, step: int) -> int:
        """After a learner rank died during `step`: rebuild the learners from the newest snapshot or
        checkpoint (`pipelines.learner_recovery.recover_learners`); returns the step to go on from."""
        from pipelines.learner_recovery import recover_learners

        return recover_learners(self, error, step)

    def snapshot_learners(self, step: int) -> None:
        """With `train.learner_recovery: snapshot`, keep the learners' state after `step` completed steps."""
        if self.snapshot is not None:
            seconds = self.snapshot.save(step, [g for g in (self.policy, self.critic) if g is not None])
            log.debug("learner snapshot of step %d: %.1f s", step, seconds)

    def questions(self, file_name: str) -> list[dict]:
        """Questions of a pack file as dicts (id, question, golden_answers, dataset, meta); cached. Raises
        TrainConfigError when the file holds no questions."""
        from pipelines.data import iter_qa, pack_file

        key = f"file:{file_name}"
        if key not in self._questions:
            rows = [asdict(q) for q in iter_qa(pack_file(file_name, self.cfg.data.dir))]
            if not rows:
                raise TrainConfigError(f"no questions in {file_name!r} (data.dir={self.cfg.data.dir!r})")
            self._questions[key] = rows
        return self._questions[key]

    def training_questions(self, file_name: str, recipe_options: dict) -> list[dict]:
        """The questions a step draws from: the pack file's, or with `train.select_questions` the learnable ones
        among them (`pipelines.prepare.learnable`: rolled out once by the policy as it is now, or its cache)."""
        rows = self.questions(file_name)
        if not self.cfg.train.select_questions:
            return rows
        key = f"learnable:{file_name}:{json.dumps(recipe_options, sort_keys=True)}"
        if key not in self._questions:
            from pipelines.prepare.learnable import select_learnable

            self.on_phase("selecting learnable questions")
            try:
                self._questions[key], _ = select_learnable(
                    self.cfg, rows, recipe_options,
                    lambda examples, n: self.rollout(examples, recipe_options, n, self.cfg.rollout.temperature,
                                                     seed=self.cfg.seed),
                    report_to=self.run_dir / "learnable_questions.json")
            except ValueError as e:
                raise TrainConfigError(str(e)) from None
        return self._questions[key]

    # -- one step ---------------------------------------------------------------------------------------
    def rollout(self, examples: Sequence[dict], recipe_options: dict, n: int, temperature: float,
                seed: int, expert: bool = False) -> list[dict]:
        """Episodes of every example on the workers (examples split evenly); trajectories as dicts.
        A dead worker's part is re-run (`pipelines.rollout_dispatch`): each (question, sample) once.
        `expert`: the recipe's expert writes the turns (warm-start demonstrations, `AgentLoop`).

        Raises:
            RemoteTimeoutError: the workers did not finish within `ray.call_timeout_s`.
            EpisodeSetError: (question, sample) pairs lost or duplicated.
        """
        from pipelines.rollout_dispatch import check_episodes, run_parts

        ro = self.cfg.rollout
        sampling = {"temperature": temperature, "top_p": ro.top_p if temperature > 0 else 1.0, "seed": seed}
        limits = {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn,
                  "max_observation_tokens": ro.max_observation_tokens, "max_total_tokens": ro.max_total_tokens}
        parts = [p for p in (list(examples[i :: len(self.workers)]) for i in range(len(self.workers))) if p]

        def submit(worker: Any, part: list[dict]) -> Any:
            return worker.run.remote(part, self.cfg.train.recipe, recipe_config=recipe_options, n=n, sampling=sampling,
                                     limits=limits, chat=ro.chat, compute_reward=True, expert=expert)

        def resync(worker: Any) -> None:  # run_parts waits until Ray has restarted the worker
            self.policy.sync_weights([worker], version=self.weight_version)

        results, faults = run_parts(self.workers, parts, submit, self.cfg.ray.call_timeout_s,
                                    f"rollout workers: {len(examples) * n} episodes", resync,
                                    stale=lambda r: any(t["weight_version"] != self.weight_version for t in r))
        self.faults.update(faults)
        trajs = [t for result in results for t in result]
        check_episodes(trajs, examples, n)
        return trajs

    def take_faults(self) -> dict[str, float]:
        """`faults/*` counts since the last call (`pipelines.train_metrics.fault_metrics`)."""
        import ray

        # rollout workers that died in any weight sync (a step's, a resync's), restarted and sent the weights again
        self.faults["rollout_worker_deaths"] += self.policy.take_worker_restarts()
        try:  # shard calls the pool retried through a shard's restart (a running total there)
            retries = int(ray.get(self.pool.get_stats.remote(), timeout=60).get("retries", 0))
            self.faults["shard_retries"] += max(0, retries - self.pool_retries)
            self.pool_retries = retries
        except Exception as e:  # noqa: BLE001 - a restarted pool starts counting again; nothing to add
            log.warning("retrieval pool stats unavailable: %s", type(e).__name__)
        for worker in self.workers:
            try:
                self.faults.update(ray.get(worker.take_faults.remote(), timeout=60))
            except Exception as e:  # noqa: BLE001 - a dead worker's counts are lost; its death was counted
                log.warning("fault counts of a rollout worker unavailable: %s", type(e).__name__)
        out = fault_metrics(self.faults)
        self.faults.clear()
        return out

    def step(self, step: int) -> dict[str, float]:
        """One training step (0-based `step`); returns its metrics."""
        from actors.learner.batch import make_train_batch, scatter_rows, trained_rows
        from actors.learner.policy import single_step
        from actors.lifecycle import get_within
        from algorithms import compute_advantages
        from pipelines.train_metrics import learner_metrics, rollout_metrics

        cfg, timings, t_step = self.cfg, {}, time.perf_counter()
        stage = stage_at(cfg, step)[0]
        t = time.perf_counter()
        self.on_phase("rollout+score")
        trajs = self.ahead.take(step) if self.ahead is not None else None  # one_step: started during the last update
        if cfg.train.async_mode == "fully":
            trajs = self.stream_take(step)
        trajs = trajs if trajs is not None else self.step_rollout(step)
        timings["rollout_s"] = time.perf_counter() - t

        t = time.perf_counter()
        self.on_phase("logprobs+advantages")
        batch = make_train_batch(trajs, self.pad_token_id)
        values = self.critic.compute_values(batch) if self.critic is not None else None
        rewards = torch.tensor([float(t_["reward"] or 0.0) for t_ in trajs])
        algo = cfg.algorithm
        kl_reward = algo.kl_in_reward and algo.kl_coef > 0  # the advantages read both log-probs of every row
        rows = torch.arange(batch.size)
        if not kl_reward:  # advantages first: the log-prob passes then run over the rows the update trains
            advantages, returns = compute_advantages(algo, rewards, batch.loss_mask, group_ids=batch.group_ids,
                                                     values=values)
            rows = trained_rows(algo, advantages, batch)
        part = batch if len(rows) == batch.size else batch.select(rows)
        ref = None
        if self.reference is not None:  # zeros on rows the update skips (all of them: no pass)
            ref = torch.zeros(batch.loss_mask.shape)
            if len(rows):
                ref = scatter_rows(get_within(self.reference.compute_logprobs.remote(part), cfg.ray.call_timeout_s,
                                              "reference model: log-probs"), rows, batch.size, batch.response_len)
        logprobs = None  # a one-step update reads them from its own forward pass (`single_step`)
        if len(rows) and (kl_reward or not single_step(cfg.learner, batch.size)):
            logprobs = scatter_rows(self.policy.compute_logprobs(part)[0], rows, batch.size, batch.response_len)
        if kl_reward:
            advantages, returns = compute_advantages(algo, rewards, batch.loss_mask, group_ids=batch.group_ids,
                                                     values=values, logprobs=logprobs, ref_logprobs=ref)
        fields = {"old_logprobs": logprobs, "advantages": advantages, "returns": returns}
        if ref is not None:
            fields["ref_logprobs"] = ref
        if values is not None:
            fields["old_values"] = values
        batch = batch.with_fields(**fields)
        timings["prepare_s"] = time.perf_counter() - t

        t = time.perf_counter()
        self.on_phase("update")
        if self.ahead is not None and step + 1 < total_steps(cfg):  # on the weights this step sampled with
            self.ahead.start(step + 1, lambda: self.step_rollout(step + 1))
        try:
            critic_m = self.critic.update(batch, cfg.algorithm) if self.critic is not None else None
            policy_m = self.policy.update(batch, cfg.algorithm)
        except BaseException:
            if self.stream is not None:  # not trained: the groups go back (a rebuild rewinds further)
                self.stream.put_back(step)
            raise
        if self.stream is not None:
            self.stream.commit(step)
        timings["update_s"] = time.perf_counter() - t
        if self.ahead is not None:  # the workers take new weights between rollouts
            self.on_phase("waiting for the next rollout")
            timings["learner_idle_s"] = self.ahead.wait()
        self.on_phase("weight sync")
        sync = self.policy.sync_weights(self.workers, version=step + 1)  # fully: in flight, groups keep running
        self.weight_version = step + 1
        if self.stream is not None:
            self.stream.set_version(step + 1)

        metrics = {"step": float(step + 1), "stage": float(stage + 1),
                   VISITS: question_visits(cfg, step + 1, self.warm_questions)}
        if self.ahead is not None:
            metrics.update(staleness_metrics(trajs, step))  # the learner held version `step` while it trained
            metrics["async/learner_idle_s"] = timings.pop("learner_idle_s")
            metrics["async/rollout_idle_s"] = max(0.0, time.perf_counter() - t_step - self.ahead.last_run_s)
        if self.stream is not None:
            metrics.update(staleness_metrics(trajs, step))
            metrics.update(self.stream.take_stats())
        metrics.update(rollout_metrics(trajs))
        metrics.update(learner_metrics(policy_m, critic_m))
        metrics.update(self.take_faults())
        if ref is not None and logprobs is not None:  # else the learner's actor/kl: the same, on the trained rows
            from algorithms import kl_estimate, masked_mean

            mask = batch.loss_mask[rows]
            metrics["actor/kl_to_ref_rollout"] = float(masked_mean(kl_estimate(logprobs[rows], ref[rows], "k3"), mask))
        metrics["actor/advantage_mean"] = float((advantages * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))
        metrics.update({f"time/{k}": v for k, v in {**timings, **{k: v for k, v in sync.items() if k.endswith("_s")}}.items()})
        # one_step, fully: the phases overlap, so the step's wall time
        overlap = cfg.train.async_mode != "off"
        metrics["time/step_s"] = time.perf_counter() - t_step if overlap else sum(timings.values()) + sync["sync_s"]
        if cfg.train.save_rollouts:
            save_rollouts(self.run_dir / "rollouts" / f"step-{step + 1}.jsonl.gz", trajs)
        return metrics

    def stream_take(self, step: int) -> list[dict]:
        """fully: the episodes of 0-based `step` from the rollout stream (started here at the first step,
        from the checkpoint's groups on --resume), resyncing workers whose calls failed while it waits."""
        from pipelines.stream_setup import resync_worker, start_stream

        if self.stream is None:
            self.stream = start_stream(self, step, self.stream_committed)
        return self.stream.take(step, timeout_s=self.cfg.ray.call_timeout_s,
                                resync=lambda worker: resync_worker(self, worker))

    def step_rollout(self, step: int) -> list[dict]:
        """The episodes of 0-based `step`: its questions (`batch_indices`) under its stage's options,
        `samples_per_prompt` each at the training temperature, seeded by the step."""
        cfg = self.cfg
        _, options, train_file = stage_at(cfg, step)
        pool = self.training_questions(train_file, options)
        idx = batch_indices(step, cfg.train.questions_per_step, len(pool), cfg.seed, cfg.train.shuffle)
        return self.rollout([pool[i] for i in idx], options, cfg.rollout.samples_per_prompt, cfg.rollout.temperature,
                            seed=cfg.seed * 1_000_003 + step)

    def evaluate_dev(self, step: int, warm_started: bool = False) -> dict[str, float]:
        """Greedy episodes (one per question) on `eval_questions` dev questions (a fixed sample spread over
        the datasets, `pipelines.data.spread_sample`) after `step`
        completed steps (0: the untrained policy, under the first stage's recipe options; with `warm_started`,
        the policy right after the warm start, at the visits of the questions it trained on); returns
        `dev/...` metrics (`rollout_metrics`: reward, answer EM/F1/cover-EM, ...) and `time/eval_s`
        (s), {} when `eval_questions` is 0. Logs one line (`dev_summary`)."""
        from pipelines.train_metrics import dev_summary, rollout_metrics

        n = self.cfg.train.eval_questions
        if not n:
            return {}
        t = time.perf_counter()
        from pipelines.data import spread_sample

        # spread over the datasets (the pack's splits are sorted by dataset); the same questions every time
        examples = spread_sample(self.questions(self.cfg.data.dev), n, seed=0)
        trajs = self.rollout(examples, stage_at(self.cfg, max(0, step - 1))[1], 1, 0.0, seed=0)
        out = rollout_metrics(trajs, prefix="dev")
        out["time/eval_s"] = time.perf_counter() - t
        out[VISITS] = (float(self.warm_questions) if warm_started
                       else question_visits(self.cfg, step, self.warm_questions))  # the x of the dev curve
        if "dev/answer_f1" in out and not warm_started:
            self.dev_f1[step] = float(out["dev/answer_f1"])
        log.info("%s%s", "warm start: " if warm_started else "", dev_summary(step, out))
        return out

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        """Checkpoint after `step` completed steps (`pipelines.trainer_checkpoint.save_checkpoint`)."""
        from pipelines.trainer_checkpoint import save_checkpoint

        return save_checkpoint(self, step)

    def resume(self, checkpoint: Path) -> int:
        """Load a checkpoint, sync the workers; returns its step (`pipelines.trainer_checkpoint.load_checkpoint`)."""
        from pipelines.trainer_checkpoint import load_checkpoint

        return load_checkpoint(self, checkpoint)

    def warm_start(self) -> dict[str, float]:
        """`train.warm_start`: rejection-sampling fine-tuning before step 1 (`pipelines.warm_start`)."""
        from pipelines.warm_start import warm_start

        self.on_phase("warm start")
        return warm_start(self)

    @property
    def pad_token_id(self) -> int:
        """The policy tokenizer's pad id (its EOS id when it has none, else 0); loaded once, then cached."""
        if not hasattr(self, "_pad"):
            from transformers import AutoTokenizer

            from actors.engines.models import resolve_model

            tok = AutoTokenizer.from_pretrained(resolve_model(self.cfg.learner.model))
            self._pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id or 0)
        return self._pad

    def close(self, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Stop every actor of the run: learners, then the rest newest first (engines shut down before
        their actors go: vLLM and DeepSpeed leave /dev/shm files otherwise); then every node sweeps
        what killed engines and ranks left in its /dev/shm (`cluster.node_cleanup`). An actor whose
        shutdown has not returned after `shutdown_timeout_s` seconds (busy: its shutdown waits behind
        the call in flight) is killed."""
        from cluster.shm import STOP_SWEEP_MIN_AGE_S, sweep_stale_shm

        if self.ahead is not None:
            self.ahead.close()
        if self.stream is not None:
            self.stream.close()
        for group in (self.policy, self.critic):
            if group is not None:
                try:
                    group.shutdown(shutdown_timeout_s)
                except Exception as e:  # noqa: BLE001 - keep shutting the rest down
                    log.warning("learner shutdown failed: %s: %s", type(e).__name__, e)
        self.actors.stop(timeout_s=shutdown_timeout_s)
        if self.snapshot is not None:
            self.snapshot.remove()
        import ray

        from cluster.node_cleanup import sweep_every_node

        if ray.is_initialized():
            sweep_every_node(STOP_SWEEP_MIN_AGE_S)  # what a killed engine or rank left in each node's /dev/shm
        sweep_stale_shm(STOP_SWEEP_MIN_AGE_S)  # and the driver's own node, even when it is not one of the cluster's


def train(cfg: Config, resume: str | Path | None = None, progress: bool = True) -> Path:
    """Run (or resume) training; returns the run directory.

    Args:
        cfg: the run's config (validated again here; see `validate`).
        resume: a run directory to continue from its last complete checkpoint (same data order).

    Raises:
        TrainConfigError: a config that cannot train (before any actor starts).
        DataPackError: a missing data pack or QA file (before any actor starts).
        FileNotFoundError: `resume` has no complete checkpoint.
        ConfigError: `cfg` changes what the resumed run is (`configs.resume.resume_changes`).
        TrainingStopped: SIGTERM/SIGINT stopped the run (`pipelines.graceful_stop`); the actors are
            stopped and the last completed step is checkpointed when it could be.
    """
    from cluster.logs import add_run_log, remove_run_log
    from cluster.ray_init import init_ray
    from pipelines.tracking import Tracker

    cfg = validate(cfg, need_index=False)  # a missing index is built below, once Ray is up
    start_step, checkpoint = 0, None
    if resume is not None:
        run_dir, checkpoint = Path(resume), resume_checkpoint(Path(resume), cfg)
    else:
        run_dir = new_run_dir(cfg)
        (run_dir / "config.yaml").write_text(cfg_to_yaml(cfg))
    log.info("run directory %s (log: %s)", run_dir, add_run_log(run_dir))
    started = init_ray(cfg.ray)
    trainer, stop = Trainer(cfg, run_dir, progress), GracefulStop()
    try:
        from cluster.roles import check_ray_cluster
        from pipelines.build_index import ensure_index

        ensure_index(cfg, progress)  # a fresh clone: the index the config names, built (resuming) when missing

        check_ray_cluster(cfg)  # a cluster too small for the plan fails here, before any actor starts
        with stop.installed():
            try:
                trainer.start()
                wandb_id = None
                if checkpoint is not None:
                    start_step = trainer.resume(checkpoint)
                    wandb_id = json.loads((checkpoint / STATE_FILE).read_text()).get("wandb_id")
                trainer.tracker = Tracker(run_dir, cfg, wandb_id=wandb_id, resumed_at=start_step if checkpoint else None)
            except (StopRequested, SystemError) as raised:  # while the actors were starting: nothing new to save
                e = stop_request(raised)  # (a SystemError: raised from inside Ray's core, see stop_request)
                if e is None:
                    raise
                raise TrainingStopped(e.signum, run_dir, start_step, last_checkpoint(run_dir)) from None
            run_loop(trainer, start_step, stop)
    finally:
        trainer.close(stop.shutdown_timeout_s)
        if trainer.tracker is not None:
            trainer.tracker.finish()
        if started:
            import ray

            ray.shutdown()
        remove_run_log(run_dir)
        from cluster.exit_deadline import disarm

        disarm()  # a stop signal's cleanup is done: the caller (a notebook, a test) may go on
    return run_dir
