"""Typed configuration schema for searchrl.

Every model forbids unknown keys, so a typo in a YAML file or a command-line
override fails loudly instead of being silently ignored.  All sections have
defaults: ``Config()`` is a valid configuration.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from algorithms.config import AlgorithmConfig
from configs.recipe_options import check_recipe_options


class StrictModel(BaseModel):
    """Base for all config sections.

    Unknown keys are rejected; validation is strict (no coercion: ``"3"`` or
    ``true`` is not an ``int``; an ``int`` is accepted where a ``float`` is
    expected); assignments are validated too.
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


class DataConfig(StrictModel):
    """Where the data pack lives and which of its files to read."""

    dir: str | None = Field(
        None, description="Data pack directory; None means the SEARCHRL_DATA environment variable."
    )
    corpus: str = Field("corpus.jsonl.gz", description="Corpus file name inside `dir`.")
    train: str = Field("train.jsonl.gz", description="Training QA file name inside `dir`.")
    dev: str = Field("dev.jsonl.gz", description="Validation QA file name inside `dir`.")
    test: str = Field("test.jsonl.gz", description="Evaluation QA file name inside `dir`.")
    mirage: str = Field("mirage.jsonl.gz", description="MIRAGE multiple-choice file name inside `dir` (eval.mirage_questions).")
    corpus_limit: int | None = Field(
        None, gt=0, description="Use only the first N passages (count); None = the whole corpus."
    )


class EncoderConfig(StrictModel):
    """Dense text encoder used to embed queries and passages."""

    model: str = Field(
        "all-MiniLM-L6-v2", description="sentence-transformers model name or local path."
    )
    query_prefix: str = Field("", description="Text prepended to every query before encoding.")
    passage_prefix: str = Field("", description="Text prepended to every passage before encoding.")
    pooling: Literal["model", "mean", "cls"] = Field(
        "model",
        description="Token pooling; 'model' = what the model's own sentence-transformers config says.",
    )
    normalize: bool = Field(True, description="L2-normalize embeddings (cosine = inner product).")
    max_seq_length: int | None = Field(
        256, gt=0, description="Truncate inputs to this many tokens; None = the model's default."
    )
    batch_size: int = Field(64, gt=0, description="Passages per encoder forward pass (index build).")
    device: str = Field("cpu", description="Torch device, e.g. 'cpu' or 'cuda:0'.")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Precision of passage encoding (index build); 'bf16' autocasts (2.4x faster on CPUs "
        "with AVX512-BF16, cosine to fp32 vectors >= 0.9999). Queries are always encoded in fp32 and "
        "vectors are stored as float32.",
    )
    backend: Literal["torch", "openvino"] = Field(
        "torch",
        description="Runtime of the transformer: 'torch', or 'openvino' (an IR exported once from the same "
        "weights into the model cache; needs the `openvino` package, in the CPU requirements). Recorded in "
        "the index manifest: queries are encoded with the index's backend, and resuming a build with "
        "another backend is an error.",
    )

    @classmethod
    def e5(cls, model: str = "intfloat/e5-base-v2", **kwargs) -> EncoderConfig:
        """Preset for E5 models: 'query: '/'passage: ' prefixes, mean pooling, normalized."""
        params = dict(
            model=model, query_prefix="query: ", passage_prefix="passage: ", pooling="mean", normalize=True
        )
        params.update(kwargs)
        return cls(**params)


class IndexConfig(StrictModel):
    """Sharded vector (or BM25) index: where it is stored and how it is built."""

    dir: str = Field("indexes/minilm-flat", description="Index directory (one sub-folder per shard).")
    num_shards: int = Field(4, ge=1, description="Number of index shards (one retrieval actor each).")
    type: Literal["flat", "hnsw", "ivf_pq", "bm25"] = Field("flat", description="Index kind.")
    fp16: bool = Field(False, description="Store vectors as float16 (halves memory).")
    hnsw_m: int = Field(32, gt=0, description="HNSW: neighbours per node.")
    hnsw_ef_construction: int = Field(200, gt=0, description="HNSW: candidate list size while building.")
    hnsw_ef_search: int = Field(128, gt=0, description="HNSW: candidate list size while searching.")
    ivf_nlist: int = Field(1024, gt=0, description="IVF: number of coarse clusters.")
    ivf_nprobe: int = Field(32, gt=0, description="IVF: clusters visited per query.")
    pq_m: int = Field(48, gt=0, description="PQ: sub-quantizers per vector.")
    pq_nbits: int = Field(8, gt=0, description="PQ: bits per sub-quantizer code.")
    docs_row_group_size: int = Field(
        256, gt=0, description="Rows per Parquet row group in the stored passage table."
    )
    encode_actors: int = Field(1, ge=1, description="Ray Data encoder actor count.")
    encode_cpus: float = Field(
        1.0,
        gt=0,
        description="CPUs Ray reserves per encoder actor. Keep it below the node's CPU count: Ray Data's "
        "read tasks need a CPU too (on a 2-CPU node, 2.0 deadlocks). Torch threads are set separately "
        "(node cores / encode_actors).",
    )


class RetrievalConfig(StrictModel):
    """Online retrieval service: request limits, micro-batching and fault tolerance."""

    max_topk: int = Field(100, gt=0, description="Largest topk a request may ask for (passages).")
    topk: int = Field(3, gt=0, validate_default=True, description="Passages returned per query by default (<= max_topk).")
    max_queries_per_request: int = Field(1024, gt=0, description="Queries accepted in one request.")
    batch_wait_ms: float = Field(2.0, ge=0, description="Micro-batching window in milliseconds.")
    max_batch_size: int = Field(256, gt=0, description="Queries per micro-batch (upper bound).")
    pool_cpus: float = Field(
        0.25, ge=0, description="CPUs reserved by the pool actor (it batches and merges; encoders and shards do the work)."
    )
    shard_cpus: float = Field(0.25, ge=0, description="CPUs reserved per shard actor.")
    query_encoders: int = Field(
        2, ge=1, description="Query encoder actors; a micro-batch is split across them (data parallel)."
    )
    encoder_cpus: float = Field(0.25, ge=0, description="CPUs reserved per query encoder actor.")
    encoder_gpus: float = Field(0.0, ge=0, description="GPUs per query encoder actor (set encoder_device too).")
    encoder_device: str = Field("cpu", description="Torch device of the query encoders, e.g. 'cuda'.")
    query_batch_size: int = Field(
        16, gt=0, description="Queries per encoder forward pass; small chunks of length-sorted queries pad less."
    )
    encoder_threads: int | None = Field(
        None,
        gt=0,
        description="Torch threads per query encoder; None = node cores / query_encoders. Processes beat "
        "threads here: 2 encoders x 1 thread encode 282 queries/s, 1 x 2 threads 225 (2 cores).",
    )
    query_cache_size: int = Field(
        10000,
        ge=0,
        description="Query vectors kept by the pool (LRU, keyed by query text; 0 = off). RL rollouts repeat "
        "queries (n samples per question); 10,000 MiniLM vectors take 15 MB.",
    )
    max_inflight_batches: int = Field(
        2, ge=1, description="Micro-batches in flight at once (encoding one while another searches)."
    )
    max_restarts: int = Field(3, ge=-1, description="Ray actor restarts on failure (-1 = unlimited).")
    max_retries: int = Field(3, ge=0, description="Times the pool retries a shard call after the shard failed.")
    retry_backoff_s: float = Field(0.5, ge=0, description="Delay between retries in seconds.")
    request_timeout_s: float = Field(
        60.0, gt=0, description="Per-request timeout in seconds: a search slower than this answers HTTP 504, an HTTP "
        "request body not fully received within it 408."
    )
    max_body_bytes: int = Field(
        1048576, gt=0, description="Largest HTTP request body (bytes) the /retrieve route reads; a larger one answers "
        "413, unparsed (1 MiB: about 1 KB for each of the default 1024 max_queries_per_request)."
    )

    @field_validator("topk")
    @classmethod
    def _topk_le_max(cls, v: int, info: ValidationInfo) -> int:
        """Reject topk larger than max_topk (reported at ``retrieval.topk``)."""
        max_topk = info.data.get("max_topk")
        if max_topk is not None and v > max_topk:
            raise ValueError(f"topk ({v}) must be <= max_topk ({max_topk})")
        return v

    @model_validator(mode="after")
    def _topk_within_max(self) -> RetrievalConfig:
        """Same check after assignment to either field."""
        if self.topk > self.max_topk:
            raise ValueError(f"topk ({self.topk}) must be <= max_topk ({self.max_topk})")
        return self


class ServeConfig(StrictModel):
    """HTTP endpoints on Ray Serve: the retrieval route (`scripts.serve_retrieval`) and the served
    searcher (`scripts.serve`, `serving/`)."""

    host: str = Field("127.0.0.1", description="Interface to bind; 0.0.0.0 exposes it to the network (set SEARCHRL_API_TOKEN then).")
    port: int = Field(8000, ge=1, le=65535, description="TCP port.")
    route_prefix: str = Field("/", description="URL prefix of the application's routes.")
    model_name: str | None = Field(None, description="Model id in /v1/models and responses; None = derived from the checkpoint.")
    replicas: int = Field(1, ge=1, description="Searcher replicas (one policy engine each); ignored with autoscaling_config.")
    max_ongoing_requests: int = Field(
        16, ge=1, description="Episodes one searcher replica runs at once (its engine batches them)."
    )
    max_queued_requests: int = Field(
        64, ge=1, description="Requests waiting for a searcher replica beyond those running; more answer 503 with Retry-After."
    )
    autoscaling_config: dict[str, Any] | None = Field(
        None, description="Ray Serve autoscaling of the searcher (min_replicas, max_replicas, target_ongoing_requests, ...)."
    )
    max_body_bytes: int = Field(65536, gt=0, description="Largest request body (bytes) of the searcher routes; larger answers 413.")
    max_question_tokens: int = Field(256, gt=0, description="Longest question (policy tokens); longer answers 422.")
    max_turns: int = Field(8, ge=0, description="Largest max_turns a request may ask for (searches per episode).")
    request_timeout_s: float = Field(
        300.0, gt=0, description="Default and largest per-request deadline (seconds); past it a request answers 504."
    )
    retry_after_s: int = Field(2, ge=1, description="Retry-After (seconds) sent with a 503 for a full queue.")


class RayConfig(StrictModel):
    """How to connect to (or start) a Ray cluster."""

    address: str | None = Field(
        None, description="Cluster address; None = start a local cluster, 'auto' = join a running one."
    )
    num_cpus: int | None = Field(
        None, gt=0, description="CPUs for a locally started cluster; None = all of the machine's."
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


class LearnerConfig(StrictModel):
    """DeepSpeed learners: policy, critic (PPO) and the frozen reference model.

    Batch sizes are in sequences (trajectories): an optimizer step sees `mini_batch_size` of them
    (over all ranks), each rank runs forward passes of `micro_batch_size`.
    """

    model: str = Field("gemma3-270m", description="Policy: a Hugging Face name, a local directory, or 'gemma3-270m'.")
    critic_model: str | None = Field(None, description="Critic starting weights; None = the policy model.")
    reference_model: str | None = Field(None, description="Reference policy; None = the policy's starting model.")
    dtype: Literal["fp32", "bf16"] = Field("bf16", description="Training precision (bf16 keeps fp32 master weights).")
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage (0-3).")
    offload_optimizer: bool = Field(False, description="ZeRO optimizer states on CPU (DeepSpeedCPUAdam).")
    gradient_checkpointing: bool = Field(True, description="Recompute decoder activations in backward.")
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
    critic_micro_batch_size: int | None = Field(
        None, gt=0, description="The critic's micro-batch (s3 App. A.2: 10, the actor's 15); None = micro_batch_size.",
    )
    ppo_epochs: int = Field(1, gt=0, description="Passes over each rollout batch.")
    shuffle: bool = Field(True, description="Shuffle sequences into mini-batches (seeded, same on every rank).")
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
    sync_dtype: Literal["bf16", "fp32", "model"] = Field(
        "bf16", description="dtype of the weights sent to rollout engines ('model' = as trained)."
    )

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


class FrozenLLMConfig(StrictModel):
    """Frozen generator / judge / verifier actors (s3 Fig. 12-13, R-Search Table 5)."""

    model: str = Field("gemma3-270m", description="Generator (s3) and verifier (R-Search) model.")
    judge_model: str | None = Field(None, description="Judge for GenAcc; None = the generator model.")
    backend: Literal["vllm", "hf"] = Field("vllm", description="Engine backend.")
    max_model_len: int = Field(4096, gt=1, description="Context length (tokens).")
    max_answer_tokens: int = Field(64, gt=0, description="Answer tokens at most.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per frozen LLM actor.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per frozen LLM actor.")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="GPU only: vLLM's memory fraction.")
    cpu_kv_cache_gib: float | None = Field(None, gt=0, description="CPU only: vLLM KV cache (GiB).")


class EvalConfig(StrictModel):
    """How a trained searcher is evaluated (`pipelines/evaluate.py`, and what serving may read): the papers
    evaluate with settings of their own (R-Search §4.3: top-5 for every method; A.3: temperature 0.1).
    None keeps the training value."""

    topk: int | None = Field(
        None, gt=0, description="Passages per search, for every method (R-Search §4.3: 5); None = retrieval.topk.",
    )
    temperature: float = Field(
        0.0, ge=0, description="Decoding temperature of every method; 0 = greedy (R-Search A.3: 0.1).",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling when temperature > 0.")
    max_turns: int | None = Field(
        None, ge=0, description="Searches per episode of the searcher; None = its training max_turns.",
    )
    judge_model: str | None = Field(
        None, description="GenAcc judge at evaluation; None = frozen.judge_model, else frozen.model.",
    )
    mirage_questions: int = Field(
        0, ge=0, description="MIRAGE questions evaluated beside the QA file (a seeded sample spread over its five "
        "sets; more than the file holds = all of it), scored by the judge alone (s3 A.4); 0 = none.",
    )
    acc_l: bool = Field(
        False, description="Add R1-Searcher's ACC_L column (§3.1 LLM-as-Judge with the paper's Judge Prompt; the "
        "evaluation's judge model stands in for GPT-4o-mini).",
    )


class PrepareConfig(StrictModel):
    """Data-preparation jobs (`scripts.prepare_data`) that run a model of their own."""

    r1_selection_model: str | None = Field(
        None, description="Policy whose rollouts bucket questions by difficulty (R1-Searcher §2.1: "
        "Qwen/Qwen2.5-7B-Instruct); None = learner.model.",
    )
    r1_selection_chat: bool | None = Field(
        None, description="Chat template for it; None = rollout.chat (and that None = when the tokenizer has one).",
    )


class StageConfig(StrictModel):
    """One stage of a staged schedule (R1-Searcher: stage 1 retrieval+format rewards, stage 2 F1)."""

    steps: int = Field(..., gt=0, description="Training steps of this stage.")
    recipe_options: dict[str, Any] = Field(default_factory=dict, description="Recipe config overrides, e.g. {stage: 2}.")
    train: str | None = Field(None, description="Training QA file of this stage; None = data.train.")


class WandbConfig(StrictModel):
    """Weights & Biases logging (offline unless configured: `wandb sync` uploads later)."""

    mode: Literal["offline", "online", "disabled"] = Field("offline", description="wandb mode.")
    project: str = Field("searchrl", description="wandb project.")
    entity: str | None = Field(None, description="wandb entity (team or user).")
    tags: list[str] = Field(default_factory=list, description="Run tags.")


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
    train_limit: int | None = Field(None, gt=0, description="Use the first N training questions; None = all.")
    shuffle: bool = Field(True, description="Shuffle training questions each epoch (seeded).")
    eval_every: int = Field(0, ge=0, description="Dev-split evaluation every N steps; 0 = only at the end.")
    eval_questions: int = Field(32, ge=0, description="Dev questions per evaluation; 0 = no evaluation.")
    save_every: int = Field(10, ge=0, description="Checkpoint every N steps (and at the end); 0 = only at the end.")
    keep_checkpoints: int = Field(
        1, ge=1, description="Newest checkpoints that keep their DeepSpeed state (optimizer, scheduler) for --resume; "
        "older saved steps keep only their Hugging Face weights.",
    )
    save_rollouts: bool = Field(True, description="Write each step's trajectories to rollouts/step-<n>.jsonl.gz.")
    max_learner_restarts: int = Field(
        2, ge=0, description="Times a run rebuilds its learners after a rank died (0 = fail the run): from the last "
        "checkpoint (save_every; the steps since are redone in the same data order) or, with none yet, from the "
        "starting model at step 0.",
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="wandb logging.")

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

    def recipe_config(self, stage_options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The recipe's config fields: `train.recipe_options`, then `stage_options`, with `topk` from
        `retrieval.topk` (the one top-k setting)."""
        return {**self.train.recipe_options, **(stage_options or {}), "topk": self.retrieval.topk}

    @property
    def eval_topk(self) -> int:
        """Passages per search at evaluation: `eval.topk`, else `retrieval.topk`."""
        return self.eval.topk or self.retrieval.topk

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
