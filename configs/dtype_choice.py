"""Each role's dtype, chosen for the machine: `auto` resolved when a config is validated, and a warning for
bf16 where the CPU only emulates it (`configs.cpu_features`).

`auto` means: on a GPU, what the GPU configs used before `auto` existed (bf16 training and weight sync,
engines in the checkpoint's dtype, an fp32 encoder); on a CPU, bf16 where the CPU has bf16 instructions and
fp32 elsewhere. The roles and their keys: `learner.dtype` (policy, critic and reference model),
`learner.sync_dtype` (weights sent to the engines), `rollout.dtype` (the policy's engines), `frozen.dtype`
(generator, judge and verifier engines) and `encoder.precision` (passage encoding of an index build).

The resolved value replaces `auto` in the validated config, so a run's `config.yaml` records what ran and a
resumed run keeps it on another kind of CPU unless a key is overridden.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from configs.cpu_features import CpuFeatures, host_cpu, torch_capability

BF16_EMULATED_COST = ("on an AVX2-only AMD EPYC one update of the main job's shape took 446.8 s in bf16 against "
                      "15.2-16.5 s in fp32 (27x), and its main job made no step in 25 minutes")
"""What bf16 costs where it is emulated, as measured (`../shared/CPU-STACK.md`)."""

ENGINE_DTYPES: dict[str, str] = {"checkpoint": "checkpoint", "bf16": "bfloat16", "fp32": "float32"}
"""`rollout.dtype` / `frozen.dtype` value -> the engines' dtype name (`actors.engines.spec.EngineSpec.dtype`)."""

cpu_features: Callable[[], CpuFeatures] = host_cpu
"""Where the CPU's features come from (tests put mocked flags here)."""


class CpuDtypeWarning(UserWarning):
    """bf16 asked for on a CPU that emulates it: it runs, many times slower than fp32."""


def auto_dtype(on_gpu: bool, gpu_choice: str, cpu: CpuFeatures | None = None) -> str:
    """The dtype `auto` means for one role: `gpu_choice` on a GPU; on a CPU "bf16" where it is native, else "fp32"."""
    if on_gpu:
        return gpu_choice
    return "bf16" if (cpu or cpu_features()).native_bf16 else "fp32"


def engine_load_dtype(dtype: str, on_gpu: bool, cpu: CpuFeatures | None = None) -> str:
    """The dtype an engine loads its weights in, as vLLM and transformers name it, for `EngineSpec.dtype`:
    "checkpoint" -> "auto" (the weights' own, always); "auto" -> the weights' own on a GPU and on a CPU with
    bf16 instructions, "float32" on a CPU that emulates bf16 (a bf16 checkpoint there decodes several times
    slower: a dev evaluation there took 620 s against 168 s in fp32); a torch dtype name -> itself.
    Resolved where the engine starts, so each node's CPU decides for its own engines."""
    if dtype == "checkpoint":
        return "auto"
    if dtype != "auto" or on_gpu:
        return dtype
    return "auto" if (cpu or cpu_features()).native_bf16 else "float32"


def warn_if_emulated(key: str, value: str, on_gpu: bool, cpu: CpuFeatures | None = None) -> None:
    """Warn (`CpuDtypeWarning`) when `key` asks for bf16 on a CPU without bf16 instructions, naming the
    measured cost and the value to set. Nothing on a GPU or for other values."""
    cpu = cpu or cpu_features()
    if value == "bf16" and not on_gpu and not cpu.native_bf16:
        warnings.warn(f"{key}=bf16 on a CPU that emulates bf16 ({cpu.describe()}): it runs, but {BF16_EMULATED_COST}; "
                      f"set {key}=auto (fp32 on this CPU) or {key}=fp32", CpuDtypeWarning, stacklevel=2)


def asks_for_gpus(data: Any, key: str) -> bool:
    """A raw config section (dict) whose `key` (e.g. "gpus_per_rank") is a positive number; a bad value is
    left to the field's own validation."""
    value = data.get(key) if isinstance(data, dict) else None
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def resolve_key(data: Any, key: str, section: str, on_gpu: bool, gpu_choice: str) -> Any:
    """A config section's raw input with `key`'s `auto` (or absence: the default is auto) replaced by the
    machine's choice, and a warning for an emulated bf16. For `mode="before"` validators: anything but a
    dict (an already validated section) is returned as it is."""
    if not isinstance(data, dict):
        return data
    value = data.get(key, "auto")
    if value == "auto":
        value = auto_dtype(on_gpu, gpu_choice)
    else:
        warn_if_emulated(f"{section}.{key}", value, on_gpu)
    return {**data, key: value}


def role_dtypes(cfg: Any) -> dict[str, str]:
    """Each role's resolved dtype under `cfg` (`configs.Config`), by config key."""
    return {"learner.dtype": cfg.learner.dtype, "learner.sync_dtype": cfg.learner.sync_dtype,
            "rollout.dtype": cfg.rollout.dtype, "frozen.dtype": cfg.frozen.dtype,
            "encoder.precision": cfg.encoder.precision}


def machine_line(cfg: Any | None = None) -> str:
    """The line entry points print first: the CPU, torch's kernels and (with `cfg`) every role's dtype, e.g.
    "cpu: AMD EPYC: AVX2 FMA; no AVX-512; bf16 emulated (fp32 is faster here); torch kernels AVX2 | dtypes:
    learner fp32, sync fp32, rollout fp32, frozen fp32, encoder fp32"."""
    cpu = cpu_features()
    line = f"cpu: {cpu.describe()}; torch kernels {torch_capability()}"
    if cfg is None:
        return line + f" | auto dtypes on CPU: {auto_dtype(False, 'bf16', cpu)}"
    line += " | dtypes: " + ", ".join(f"{k.split('.')[0] if k != 'learner.sync_dtype' else 'sync'} {v}"
                                      for k, v in role_dtypes(cfg).items())
    return line
