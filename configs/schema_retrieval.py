"""The retrieval side of the config schema: data pack, encoder, index, online retrieval and serving
sections, and `StrictModel`, the base of every section (re-exported by `configs.schema`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from configs.dtype_choice import resolve_key


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
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Precision of passage encoding (index build); 'bf16' autocasts (2.4x faster on CPUs "
        "with AVX512-BF16, cosine to fp32 vectors >= 0.9999). Queries are always encoded in fp32 and "
        "vectors are stored as float32. auto = bf16 on a CPU with bf16 instructions, fp32 on other CPUs "
        "and on a GPU device (configs.dtype_choice).",
    )
    backend: Literal["torch", "openvino"] = Field(
        "torch",
        description="Runtime of the transformer: 'torch', or 'openvino' (an IR exported once from the same "
        "weights into the model cache; needs the `openvino` package, in the CPU requirements). Recorded in "
        "the index manifest: queries are encoded with the index's backend, and resuming a build with "
        "another backend is an error.",
    )

    @model_validator(mode="before")
    @classmethod
    def _machine_precision(cls, data: Any) -> Any:
        on_gpu = isinstance(data, dict) and not str(data.get("device", "cpu")).startswith("cpu")
        return resolve_key(data, "precision", "encoder", on_gpu, "fp32")

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
    shard_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs per shard actor (fractions allowed, e.g. 0.25 = four shards per GPU). > 0 moves each "
        "shard's FAISS index to the GPU (flat indexes in float16, needs the faiss-gpu wheel and max_topk <= 2048); "
        "HNSW and BM25 shards stay on CPU.",
    )
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

    @model_validator(mode="after")
    def _gpu_shard_topk(self) -> RetrievalConfig:
        """GPU shards answer at most k = 2048 hits per query (faiss's GPU k-selection limit)."""
        if self.shard_gpus > 0 and self.max_topk > 2048:
            raise ValueError(
                f"retrieval.max_topk ({self.max_topk}) must be <= 2048 when retrieval.shard_gpus > 0 "
                f"({self.shard_gpus:g}): faiss GPU indexes return at most 2048 hits per query; lower "
                "retrieval.max_topk or set retrieval.shard_gpus=0 to search shards on CPU"
            )
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
