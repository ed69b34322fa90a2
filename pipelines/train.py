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
6. metrics (JSONL + wandb), a dev evaluation every `eval_every` steps, a checkpoint every `save_every`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from configs.schema import Config

TRAINABLE_RECIPES = ("s3", "search_r1", "r1_searcher", "r_search", "eval_rar")


class TrainConfigError(ValueError):
    """A config that cannot train; raised before any actor starts."""


def total_steps(cfg: Config) -> int:
    """Steps of the run: the stages' sum when a staged schedule is given, else `train.total_steps`."""
    return sum(s.steps for s in cfg.train.stages) if cfg.train.stages else cfg.train.total_steps


def stage_at(cfg: Config, step: int) -> tuple[int, dict[str, Any], str]:
    """(stage index, recipe options, training QA file name) in force at `step` (0-based)."""
    options, train_file = dict(cfg.train.recipe_options), cfg.data.train
    end = 0
    for i, stage in enumerate(cfg.train.stages):
        end += stage.steps
        if step < end:
            return i, {**options, **stage.recipe_options}, stage.train or train_file
    return 0, options, train_file


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


def validate(cfg: Config) -> Config:
    """Check what the schema cannot (cross-section rules) and return the config the run uses
    (`learner.temperature` set to the rollout temperature).

    Raises:
        TrainConfigError: naming the keys and the fix.
    """
    from recipes import RECIPES

    if cfg.train.recipe not in TRAINABLE_RECIPES:
        raise TrainConfigError(f"train.recipe must be one of {TRAINABLE_RECIPES} (got {cfg.train.recipe!r}; "
                               f"{sorted(RECIPES)} are the recipes, direct/naive_rag are evaluation baselines)")
    episodes = cfg.train.questions_per_step * cfg.rollout.samples_per_prompt
    if episodes % cfg.learner.mini_batch_size:
        raise TrainConfigError(
            f"train.questions_per_step x rollout.samples_per_prompt = {episodes} episodes per step is not a "
            f"multiple of learner.mini_batch_size ({cfg.learner.mini_batch_size}); change one of them")
    if cfg.algorithm.advantage_estimator in ("grpo", "dr_grpo", "rloo", "group_mean") and cfg.rollout.samples_per_prompt < 2:
        raise TrainConfigError(f"algorithm.advantage_estimator={cfg.algorithm.advantage_estimator!r} compares samples "
                               f"of a question: set rollout.samples_per_prompt >= 2")
    if not Path(cfg.index.dir).is_dir():
        raise TrainConfigError(f"index.dir={cfg.index.dir!r} has no index; build it: "
                               f".venv/bin/python -m scripts.build_index --config <config>")
    from recipes import get_recipe

    try:
        for i in range(max(1, len(cfg.train.stages))):
            get_recipe(cfg.train.recipe, stage_at(cfg, sum(s.steps for s in cfg.train.stages[:i]))[1])
    except Exception as e:  # noqa: BLE001 - recipe option errors become config errors
        raise TrainConfigError(f"train.recipe_options / stages: {e}") from e
    learner = cfg.learner.model_copy(update={"temperature": cfg.rollout.temperature})
    return cfg.model_copy(update={"learner": learner})


def new_run_dir(cfg: Config) -> Path:
    """`<run_dir>/<recipe>-<timestamp>/` (created)."""
    path = Path(cfg.run_dir) / f"{cfg.train.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (`trainer_state.json` is written last) of a run, or None."""
    done = [p for p in (run_dir / "checkpoints").glob("step-*") if (p / "trainer_state.json").is_file()]
    return max(done, key=lambda p: int(p.name.split("-")[1]), default=None)


class Trainer:
    """Owns the actors of one run and runs its steps (use `run()`; `close()` frees everything)."""

    def __init__(self, cfg: Config, run_dir: Path, progress: bool = True):
        self.cfg, self.run_dir, self.progress = cfg, run_dir, progress
        self.workers: list[Any] = []
        self.frozen: list[Any] = []
        self.pool = self.policy = self.critic = self.reference = None
        self.tracker = None
        self._questions: dict[str, list[dict]] = {}

    # -- setup ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Create every actor (retrieval pool, frozen LLMs, learners, reference, rollout workers)."""
        from actors.learner_group import LearnerGroup, remote_reference_model
        from actors.retrieval import start_retrieval_pool
        from actors.rollout import remote_frozen_llm, remote_rollout_worker
        from cluster.roles import frozen_llm_count

        cfg = self.cfg
        self.pool = start_retrieval_pool(cfg.index.dir, cfg.retrieval)
        generator = judge = None
        n_frozen = frozen_llm_count(cfg)  # the same count the resource plan reserved CPUs/GPUs for
        if n_frozen:
            fz = cfg.frozen
            spec = {"backend": fz.backend, "model": fz.model, "max_model_len": fz.max_model_len,
                    **self._engine_memory(fz.backend, fz.num_gpus, fz.gpu_memory_utilization, fz.cpu_kv_cache_gib)}
            generator = remote_frozen_llm(fz.num_cpus, fz.num_gpus).remote(spec, chat=None,
                                                                           max_answer_tokens=fz.max_answer_tokens)
            self.frozen.append(generator)
            judge = generator
            if n_frozen == 2:
                judge = remote_frozen_llm(fz.num_cpus, fz.num_gpus).remote({**spec, "model": fz.judge_model})
                self.frozen.append(judge)
        self.policy = LearnerGroup("policy", cfg.learner, name=f"searchrl-{self.run_dir.name}")
        if cfg.algorithm.needs_critic:
            self.critic = LearnerGroup("critic", cfg.learner, name=f"searchrl-{self.run_dir.name}")
        if cfg.algorithm.kl_coef > 0:
            self.reference = remote_reference_model(cfg.learner, num_cpus=cfg.learner.cpus_per_rank,
                                                    num_gpus=cfg.learner.gpus_per_rank)
        ro = cfg.rollout
        spec = {"backend": ro.backend, "model": cfg.learner.model, "max_model_len": ro.max_model_len,
                **self._engine_memory(ro.backend, ro.gpus_per_worker, ro.gpu_memory_utilization, ro.cpu_kv_cache_gib)}
        if ro.backend == "vllm" and ro.tensor_parallel_size > 1:
            spec["tensor_parallel_size"] = ro.tensor_parallel_size
        self.workers = [remote_rollout_worker(ro.cpus_per_worker, ro.gpus_per_worker).remote(spec, self.pool, generator, judge)
                        for _ in range(ro.num_workers)]
        import ray

        ray.get([w.ready.remote() for w in self.workers] + [f.ready.remote() for f in self.frozen])

    @staticmethod
    def _engine_memory(backend: str, gpus: float, gpu_util: float, cpu_kv_gib: float | None) -> dict[str, Any]:
        """vLLM's memory options (the transformers fallback takes none)."""
        if backend != "vllm":
            return {}
        if gpus > 0:
            return {"gpu_memory_utilization": gpu_util}
        return {"cpu_kv_cache_gib": cpu_kv_gib} if cpu_kv_gib else {}

    def questions(self, file_name: str, limit: int | None) -> list[dict]:
        """Questions of a pack file as dicts (id, question, golden_answers, dataset, meta); cached."""
        from pipelines.data import iter_qa, pack_file

        key = f"{file_name}:{limit}"
        if key not in self._questions:
            rows = [asdict(q) for q in iter_qa(pack_file(file_name, self.cfg.data.dir), limit=limit)]
            if not rows:
                raise TrainConfigError(f"no questions in {file_name!r} (data.dir={self.cfg.data.dir!r})")
            self._questions[key] = rows
        return self._questions[key]

    # -- one step ---------------------------------------------------------------------------------------
    def rollout(self, examples: Sequence[dict], recipe_options: dict, n: int, temperature: float,
                seed: int) -> list[dict]:
        """Episodes of every example on the workers (examples split evenly); trajectories as dicts."""
        import ray

        ro = self.cfg.rollout
        sampling = {"temperature": temperature, "top_p": ro.top_p if temperature > 0 else 1.0, "seed": seed}
        limits = {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn,
                  "max_observation_tokens": ro.max_observation_tokens, "max_total_tokens": ro.max_total_tokens}
        parts = [list(examples[i :: len(self.workers)]) for i in range(len(self.workers))]
        futures = [w.run.remote(part, self.cfg.train.recipe, recipe_options, n, sampling, limits, ro.chat, True)
                   for w, part in zip(self.workers, parts) if part]
        return [t for result in ray.get(futures) for t in result]

    def step(self, step: int) -> dict[str, float]:
        """One training step (0-based `step`); returns its metrics."""
        import ray

        from actors.learner_batch import make_train_batch
        from algorithms import compute_advantages
        from pipelines.train_metrics import learner_metrics, rollout_metrics

        cfg, timings = self.cfg, {}
        stage, options, train_file = stage_at(cfg, step)
        pool = self.questions(train_file, cfg.train.train_limit)
        idx = batch_indices(step, cfg.train.questions_per_step, len(pool), cfg.seed, cfg.train.shuffle)
        examples = [pool[i] for i in idx]

        t = time.perf_counter()
        trajs = self.rollout(examples, options, cfg.rollout.samples_per_prompt, cfg.rollout.temperature,
                             seed=cfg.seed * 1_000_003 + step)
        timings["rollout_s"] = time.perf_counter() - t

        t = time.perf_counter()
        batch = make_train_batch(trajs, self.pad_token_id)
        logprobs, _ = self.policy.compute_logprobs(batch)
        ref = ray.get(self.reference.compute_logprobs.remote(batch)) if self.reference is not None else None
        values = self.critic.compute_values(batch) if self.critic is not None else None
        rewards = torch.tensor([float(t_["reward"] or 0.0) for t_ in trajs])
        advantages, returns = compute_advantages(cfg.algorithm, rewards, batch.loss_mask, group_ids=batch.group_ids,
                                                 values=values, logprobs=logprobs, ref_logprobs=ref)
        fields = {"old_logprobs": logprobs, "advantages": advantages, "returns": returns}
        if ref is not None:
            fields["ref_logprobs"] = ref
        if values is not None:
            fields["old_values"] = values
        batch = batch.with_fields(**fields)
        timings["prepare_s"] = time.perf_counter() - t

        t = time.perf_counter()
        critic_m = self.critic.update(batch, cfg.algorithm) if self.critic is not None else None
        policy_m = self.policy.update(batch, cfg.algorithm)
        timings["update_s"] = time.perf_counter() - t
        sync = self.policy.sync_weights(self.workers, version=step + 1)

        metrics = {"step": float(step + 1), "stage": float(stage + 1)}
        metrics.update(rollout_metrics(trajs))
        metrics.update(learner_metrics(policy_m, critic_m))
        if ref is not None:
            from algorithms import kl_estimate, masked_mean

            metrics["actor/kl_to_ref_rollout"] = float(masked_mean(kl_estimate(logprobs, ref, "k3"), batch.loss_mask))
        metrics["actor/advantage_mean"] = float((advantages * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1))
        metrics.update({f"time/{k}": v for k, v in {**timings, **{k: v for k, v in sync.items() if k.endswith("_s")}}.items()})
        metrics["time/step_s"] = sum(timings.values()) + sync["sync_s"]
        if cfg.train.save_rollouts:
            save_rollouts(self.run_dir / "rollouts" / f"step-{step + 1}.jsonl.gz", trajs)
        return metrics

    def evaluate_dev(self, step: int) -> dict[str, float]:
        """Greedy episodes (one per question) on the first `eval_questions` dev questions."""
        from pipelines.train_metrics import rollout_metrics

        n = self.cfg.train.eval_questions
        if not n:
            return {}
        t = time.perf_counter()
        examples = self.questions(self.cfg.data.dev, n)
        trajs = self.rollout(examples, stage_at(self.cfg, max(0, step - 1))[1], 1, 0.0, seed=0)
        out = rollout_metrics(trajs, prefix="dev")
        out["time/eval_s"] = time.perf_counter() - t
        return out

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        """Checkpoint after `step` completed steps: learners (weights, optimizer, scheduler, RNG), then
        `trainer_state.json` (written last: its presence marks a complete checkpoint)."""
        path = self.run_dir / "checkpoints" / f"step-{step}"
        self.policy.save_checkpoint(str(path))
        if self.critic is not None:
            self.critic.save_checkpoint(str(path))
        state = {"step": step, "wandb_id": self.tracker.wandb_id if self.tracker else None, "time": time.time()}
        (path / "trainer_state.json").write_text(json.dumps(state))
        return path

    def resume(self, checkpoint: Path) -> int:
        """Load a checkpoint into the learners, sync the policy to the workers; returns the step."""
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        self.policy.load_checkpoint(str(checkpoint))
        if self.critic is not None:
            self.critic.load_checkpoint(str(checkpoint))
        self.policy.sync_weights(self.workers, version=int(state["step"]))
        return int(state["step"])

    @property
    def pad_token_id(self) -> int:
        if not hasattr(self, "_pad"):
            from transformers import AutoTokenizer

            from actors.models import resolve_model

            tok = AutoTokenizer.from_pretrained(resolve_model(self.cfg.learner.model))
            self._pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id or 0)
        return self._pad

    def close(self) -> None:
        """Shut engines down before the actors go (vLLM and DeepSpeed leave /dev/shm files otherwise)."""
        import ray

        for handle in self.workers + self.frozen:
            try:
                ray.get(handle.shutdown.remote(), timeout=120)
            except Exception as e:  # noqa: BLE001 - keep shutting the rest down
                print(f"warning: shutdown failed: {e}")
        for group in (self.policy, self.critic):
            if group is not None:
                try:
                    group.shutdown()
                except Exception as e:  # noqa: BLE001
                    print(f"warning: learner shutdown failed: {e}")
        for handle in self.workers + self.frozen + [self.reference, self.pool]:
            if handle is not None:
                ray.kill(handle)
        from actors.shm import sweep_stale_shm

        sweep_stale_shm()  # what a killed engine or rank left in /dev/shm


def save_rollouts(path: Path, trajs: Sequence[dict]) -> None:
    """One step's trajectories (with rewards) as gzip JSONL, for inspection and `--resume` checks."""
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for t in trajs:
            f.write(json.dumps(t) + "\n")


def train(cfg: Config, resume: str | Path | None = None, progress: bool = True) -> Path:
    """Run (or resume) training; returns the run directory.

    Args:
        cfg: the run's config (validated again here; see `validate`).
        resume: a run directory to continue from its last complete checkpoint (same data order).

    Raises:
        TrainConfigError: a config that cannot train (before any actor starts).
        FileNotFoundError: `resume` has no complete checkpoint.
    """
    from cluster.ray_init import init_ray
    from pipelines.tracking import Tracker

    cfg = validate(cfg)
    start_step, checkpoint = 0, None
    if resume is not None:
        run_dir = Path(resume)
        checkpoint = last_checkpoint(run_dir)
        if checkpoint is None:
            raise FileNotFoundError(f"--resume {run_dir}: no complete checkpoint under {run_dir}/checkpoints")
    else:
        run_dir = new_run_dir(cfg)
    (run_dir / "config.yaml").write_text(cfg_to_yaml(cfg))
    started = init_ray(cfg.ray)
    trainer = Trainer(cfg, run_dir, progress)
    try:
        from cluster.roles import check_ray_cluster

        check_ray_cluster(cfg)  # a cluster too small for the plan fails here, before any actor starts
        trainer.start()
        wandb_id = None
        if checkpoint is not None:
            start_step = trainer.resume(checkpoint)
            wandb_id = json.loads((checkpoint / "trainer_state.json").read_text()).get("wandb_id")
        trainer.tracker = Tracker(run_dir, cfg, wandb_id=wandb_id, resumed=checkpoint is not None)
        run_loop(trainer, start_step)
    finally:
        trainer.close()
        if trainer.tracker is not None:
            trainer.tracker.finish()
        if started:
            import ray

            ray.shutdown()
    return run_dir


def run_loop(trainer: Trainer, start_step: int) -> None:
    """Steps `start_step` … end with metrics, evaluation and checkpoints."""
    from tqdm import tqdm

    cfg, total = trainer.cfg, total_steps(trainer.cfg)
    bar = tqdm(total=total, initial=start_step, desc=f"train {cfg.train.recipe}", disable=not trainer.progress,
               dynamic_ncols=True)
    try:
        for step in range(start_step, total):
            metrics = trainer.step(step)
            done = step + 1
            if done == total or (cfg.train.eval_every and done % cfg.train.eval_every == 0):
                metrics.update(trainer.evaluate_dev(done))
            trainer.tracker.log(metrics, step=done)
            bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}", step_s=f"{metrics['time/step_s']:.0f}")
            bar.update(1)
            if done == total or (cfg.train.save_every and done % cfg.train.save_every == 0):
                trainer.save(done)
    finally:
        bar.close()


def cfg_to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (what `--resume` and `configs.load_config` read back)."""
    import yaml

    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
