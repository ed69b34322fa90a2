"""What this machine's CPU computes natively: the one place that reads the CPU's instruction sets.

bf16 matmuls are fast only where the CPU has bf16 dot-product instructions (AVX512-BF16, or AMX-BF16 on
x86; the `bf16` feature on Arm). Elsewhere torch and vLLM emulate them: on an AMD EPYC with AVX2 alone a
1024 x 1024 matmul ran at 0.8 GFLOP/s in bf16 against 53.7 in fp32, and one update of the main job's
shape took 446.8 s in bf16 against 15.2-16.5 s in fp32 (27x; `../shared/CPU-STACK.md`).
`configs.dtype_choice` turns this into each role's dtype.

Two environment variables limit the kernels torch picks, and are honoured here, so an AVX-512 host can be
made to behave like an AVX2 one (`AVX2_LIMITED_ENV`): oneDNN's `ONEDNN_MAX_CPU_ISA` (below
AVX512_CORE_BF16 oneDNN has no bf16 kernels) and ATen's `ATEN_CPU_CAPABILITY` (`avx2` or `default`).
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

AVX2_LIMITED_ENV: dict[str, str] = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
"""The environment that makes an AVX-512(-bf16) host run torch's kernels as an AVX2-only host does."""

_ISA_FLAGS: tuple[tuple[str, str], ...] = (
    ("avx2", "AVX2"), ("fma", "FMA"), ("avx512f", "AVX-512"), ("avx512_vnni", "AVX-512-VNNI"),
    ("avx512_bf16", "AVX-512-BF16"), ("amx_bf16", "AMX-BF16"),
)
"""/proc/cpuinfo flag -> the name printed for it, in the order printed."""

_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # "bf16": Arm's BFloat16 feature (aarch64 Features line)
_ONEDNN_BF16_ISAS = frozenset({
    "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512",
    "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL", "DEFAULT",
})
"""`ONEDNN_MAX_CPU_ISA` values at which oneDNN still has bf16 dot-product kernels (oneDNN's dnnl_cpu_isa_t names)."""


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's model name, its instruction-set flags and the limits set in the environment.

    `flags`: lower-case /proc/cpuinfo flags (x86 "flags", Arm "Features"). `onednn_max_isa` and
    `aten_capability`: the values of `ONEDNN_MAX_CPU_ISA` and `ATEN_CPU_CAPABILITY`, None when unset.
    """

    model: str = "unknown CPU"
    flags: frozenset[str] = field(default_factory=frozenset)
    onednn_max_isa: str | None = None
    aten_capability: str | None = None

    @property
    def has_bf16_instructions(self) -> bool:
        """The CPU itself has bf16 dot-product instructions (AVX512-BF16, AMX-BF16 or Arm's BF16)."""
        return bool(self.flags & _BF16_FLAGS)

    @property
    def limited(self) -> list[str]:
        """The environment limits that take bf16 kernels away from torch, as "NAME=value" (empty: none)."""
        out = []
        if self.onednn_max_isa and self.onednn_max_isa.upper() not in _ONEDNN_BF16_ISAS:
            out.append(f"ONEDNN_MAX_CPU_ISA={self.onednn_max_isa}")
        if self.aten_capability and self.aten_capability.lower() in ("avx2", "default"):
            out.append(f"ATEN_CPU_CAPABILITY={self.aten_capability}")
        return out

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run on the CPU's own bf16 instructions: it has them and no environment limit hides them."""
        return self.has_bf16_instructions and not self.limited

    def isa_names(self) -> list[str]:
        """The instruction sets that matter here, by their usual names (e.g. ["AVX2", "FMA"])."""
        return [name for flag, name in _ISA_FLAGS if flag in self.flags] + (["BF16"] if "bf16" in self.flags else [])

    def describe(self) -> str:
        """One line: model, instruction sets, limits and whether bf16 is native, e.g.
        "AMD EPYC: AVX2 FMA; no AVX-512; bf16 emulated (fp32 is faster here)"."""
        isas = self.isa_names()
        text = f"{self.model}: {' '.join(isas) or 'no AVX2'}"
        if "avx512f" not in self.flags and platform.machine() in ("x86_64", "AMD64"):
            text += "; no AVX-512"
        if self.limited:
            text += f"; limited by {' '.join(self.limited)}"
        return text + ("; bf16 native" if self.native_bf16 else "; bf16 emulated (fp32 is faster here)")


def parse_cpuinfo(text: str, env: Mapping[str, str] | None = None) -> CpuFeatures:
    """`CpuFeatures` from the text of /proc/cpuinfo (its first processor) and an environment.

    Args:
        text: /proc/cpuinfo's contents (x86 "flags" and "model name"; Arm "Features" and "CPU part").
        env: the environment to read `ONEDNN_MAX_CPU_ISA` and `ATEN_CPU_CAPABILITY` from; None = os.environ.
    """
    env = os.environ if env is None else env
    model, flags = "unknown CPU", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.lower().split())
    return CpuFeatures(model=model, flags=flags, onednn_max_isa=env.get("ONEDNN_MAX_CPU_ISA") or None,
                       aten_capability=env.get("ATEN_CPU_CAPABILITY") or None)


@functools.lru_cache(maxsize=1)
def host_cpu() -> CpuFeatures:
    """This machine's `CpuFeatures` (read once per process). Where /proc/cpuinfo is missing (macOS), the
    flags come from torch: "avx512_bf16" when `torch.ops.mkldnn._is_mkldnn_bf16_supported()` says so."""
    path = Path("/proc/cpuinfo")
    if path.is_file():
        return parse_cpuinfo(path.read_text(errors="replace"))
    try:
        import torch

        flags = frozenset({"avx512_bf16"}) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else frozenset()
    except Exception:  # no torch, or a build without oneDNN: nothing says bf16 is native
        flags = frozenset()
    return CpuFeatures(model=platform.processor() or "unknown CPU", flags=flags,
                       onednn_max_isa=os.environ.get("ONEDNN_MAX_CPU_ISA") or None,
                       aten_capability=os.environ.get("ATEN_CPU_CAPABILITY") or None)


def torch_capability() -> str:
    """The kernels torch dispatches to (`torch.backends.cpu.get_cpu_capability()`, e.g. "AVX2"), or "no torch"."""
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except ImportError:
        return "no torch"
