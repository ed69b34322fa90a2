"""Ray's bundled jemalloc for the CPU processes that churn through large tensors: the vLLM engine's
processes (`actors.engines.cpu_env.engine_preload`) and the learner ranks (`LearnerGroup`).

Why: under glibc's malloc the policy engine's vLLM worker grew 37 MiB a minute in the training soak
(`scripts.ops.soak train`), and 10-12 under jemalloc; the learner rank's glibc `[heap]` grew 335 MiB over
the same 40 steps. The library ships in Ray's wheel (`ray/core/libjemalloc.so`), so nothing is installed.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def bundled_jemalloc() -> str | None:
    """Path of Ray's bundled `libjemalloc.so`, or None when this Ray (or no Ray) has none."""
    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "core" / "libjemalloc.so"
    return str(lib) if lib.is_file() else None


def jemalloc_preload(opt_out_var: str, current: str | None = None) -> str | None:
    """The `LD_PRELOAD` value that puts jemalloc first in front of `current` (default: this process's
    `LD_PRELOAD`), or None to leave things as they are: when the environment variable `opt_out_var`
    is "system", when `current` already names a malloc (tcmalloc, jemalloc, mimalloc), or when Ray
    bundles no jemalloc."""
    current = os.environ.get("LD_PRELOAD") if current is None else current
    if os.environ.get(opt_out_var, "") == "system" or "malloc" in (current or ""):
        return None
    lib = bundled_jemalloc()
    if lib is None:
        return None
    return f"{lib}:{current}" if current else lib
