"""The environment the vLLM CPU engine's processes start with: OpenMP CPU binding, jemalloc in
`LD_PRELOAD`, and oneDNN's global primitive cache off. Each is set in this process only while the
engine spawns its processes (or, for the vLLM defaults, only where the user set nothing)."""

from __future__ import annotations

import contextlib
import itertools
import os


def _id_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (vLLM's CPU list format)."""
    out = []
    for _, group in itertools.groupby(enumerate(ids), key=lambda t: t[1] - t[0]):
        run = [c for _, c in group]
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def cpu_bind_string(ranks: int = 1) -> str:
    """This process's allowed CPUs split into `ranks` equal lists joined by "|", the
    `VLLM_CPU_OMP_THREADS_BIND` format (one list per tensor-parallel rank), e.g. "0-1" or "0-7|8-15".

    Raises:
        ValueError: fewer CPUs than ranks.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if len(cpus) < ranks:
        raise ValueError(f"tensor_parallel_size={ranks} needs at least {ranks} CPUs; this process may use {len(cpus)}")
    per = len(cpus) // ranks
    return "|".join(_id_ranges(cpus[i * per:(i + 1) * per]) for i in range(ranks))


def set_cpu_env_defaults(ranks: int = 1) -> dict[str, str]:
    """Set vLLM CPU environment variables unless the user already set them; return what was set.

    `VLLM_CPU_OMP_THREADS_BIND` = this process's CPUs split over `ranks` (vLLM's "auto" default
    binds one logical CPU per physical core of a NUMA node; on large SMT servers "auto" may be the
    better choice: set it yourself), `VLLM_CPU_NUM_OF_RESERVED_CPU=0` (by default vLLM keeps one
    core for itself: half of a 2-core machine).
    """
    wanted = {"VLLM_CPU_OMP_THREADS_BIND": cpu_bind_string(ranks), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    done = {}
    for key, value in wanted.items():
        if key not in os.environ:
            os.environ[key] = value
            done[key] = value
    return done


@contextlib.contextmanager
def engine_preload():
    """While the engine starts, Ray's jemalloc (`cluster.jemalloc`) first in `LD_PRELOAD`: the engine core
    and its workers are spawned then, so they start with it; afterwards this process's `LD_PRELOAD` is as it was (what
    else it starts keeps its malloc). Nothing changes when `LD_PRELOAD` already names a malloc (tcmalloc,
    jemalloc, mimalloc), with `SEARCHRL_ENGINE_MALLOC=system`, or without a bundled jemalloc.
    Yields the `LD_PRELOAD` the engine starts with ("" = none)."""
    from cluster.jemalloc import jemalloc_preload

    before = os.environ.get("LD_PRELOAD")
    preload = jemalloc_preload("SEARCHRL_ENGINE_MALLOC", before)
    if preload is None:
        yield before or ""
        return
    os.environ["LD_PRELOAD"] = preload
    try:
        yield os.environ["LD_PRELOAD"]
    finally:
        if before is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = before


ONEDNN_CACHE_VAR = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ENGINE_ONEDNN_CACHE = "0"
"""oneDNN's process-wide primitive cache in the CPU engine's processes: off. vLLM's CPU linear layers keep
their own cache of oneDNN matmuls (32 batch shapes per layer); oneDNN's global one (1,024 primitives by
default) held up to 1.1 GiB more in the worker (measured with Gemma 3 270M on prompts of varied lengths:
+1,160 MiB, flat only after 5 minutes; with the cache off, +100 MiB and the same requests a minute)."""


@contextlib.contextmanager
def engine_onednn_cache():
    """While the engine starts its processes, `ONEDNN_PRIMITIVE_CACHE_CAPACITY=0` (`ENGINE_ONEDNN_CACHE`),
    unless the user set it; afterwards this process's environment is as it was (its own torch keeps
    oneDNN's cache, which torch's CPU kernels rely on). Yields the value the engine starts with."""
    if ONEDNN_CACHE_VAR in os.environ:
        yield os.environ[ONEDNN_CACHE_VAR]
        return
    os.environ[ONEDNN_CACHE_VAR] = ENGINE_ONEDNN_CACHE
    try:
        yield ENGINE_ONEDNN_CACHE
    finally:
        os.environ.pop(ONEDNN_CACHE_VAR, None)
