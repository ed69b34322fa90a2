"""Give freed heap memory back to the OS after a large transient allocation (glibc `malloc_trim`).

A weight sync moves the whole policy (~0.5 GB for Gemma 3 270M in bf16) through the driver and the
rollout worker every step. glibc keeps the freed chunks mapped, and both processes' memory grew by about
0.5 GB every two steps in the main job (docs/main-job.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def malloc_trim() -> bool:
    """Return free heap memory to the OS. True when glibc's `malloc_trim` released some; False when it
    released nothing or this C library has none (musl, macOS): then it does nothing."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
