"""Retrieval shards on GPU: decide whether a shard's FAISS index can move (`gpu_plan`), move it
(`to_gpu`) and get a CPU copy back for writing (`to_cpu_for_write`).

Why these rules (faiss GPU wiki, "Faiss on the GPU" and "GPU limitations", and `GpuCloner.cpp`):

* GPU faiss implements IndexFlat (L2 / inner product), IndexIVFFlat, IndexIVFScalarQuantizer and
  IndexIVFPQ; the index builder writes flat, HNSW or IVF-PQ shards, and this module moves flat,
  IVF-Flat and IVF-PQ ones. There is no GPU HNSW, so an HNSW shard stays on CPU.
* GpuIndexIVFPQ takes only 8-bit codes with 1, 2, 3, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64
  or 96 bytes per code (M); its per-query lookup table (M x 256 entries) lives in shared memory
  (48 KiB per block), so M >= 56 needs float16 lookup tables.
* GPU k-selection is limited to k <= 2048, and IVF `nprobe` <= 2048, for every index type.
* A GPU index cannot be written with `faiss.write_index`; it is copied back to CPU first.

Pure functions except `to_gpu`; `faiss` is imported lazily. The GPU path needs the faiss-gpu wheel
(faiss-gpu==1.15.1 in requirements.txt); the faiss-cpu wheel has none of the GPU symbols.
"""

from __future__ import annotations

from dataclasses import dataclass

# faiss/gpu/utils/DeviceDefs.cuh: GPU_MAX_SELECTION_K (CUDA >= 9); IVF nprobe is bounded the same way.
GPU_MAX_K = 2048
GPU_MAX_NPROBE = 2048
# faiss/gpu/impl/IVFPQ.cu `isSupportedPQCodeLength`: bytes per code (= M with 8-bit codes).
GPU_IVFPQ_CODE_BYTES = frozenset({1, 2, 3, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 96})
# M x 256 float32 lookup entries exceed 48 KiB of shared memory from M = 56 on: use float16 tables.
GPU_IVFPQ_FLOAT16_FROM_M = 56

NO_GPU_FAISS = (
    "this faiss has no GPU support (no faiss.StandardGpuResources): install the faiss-gpu wheel "
    "(faiss-gpu==1.15.1, as in requirements.txt; not faiss-gpu-cu12, whose wheels fail on H100 with "
    "'no kernel image is available'), or set retrieval.shard_gpus=0 to search shards on CPU"
)

# One StandardGpuResources per device for the whole process: it must outlive every index cloned with
# it (the GPU index keeps only a raw pointer), and faiss recommends one per device (each reserves
# temporary GPU memory).
_GPU_RESOURCES: dict[int, object] = {}


@dataclass(frozen=True)
class GpuPlan:
    """What `to_gpu` does with one CPU index.

    Attributes:
        move: whether the index goes to the GPU (False: the shard searches on CPU).
        use_float16: float16 vector storage (IndexFlat): half the GPU memory, scores within ~1e-3.
        float16_lookup_tables: float16 IVFPQ lookup tables (needed from M = 56 bytes per code).
        reason: one line for logs and `ShardSearcher.device_info`, saying what was decided and why.
    """

    move: bool
    use_float16: bool
    float16_lookup_tables: bool
    reason: str


def _unwrap(index):
    """The innermost index under `IndexIDMap` / `IndexIDMap2` / `IndexPreTransform` wrappers, downcast."""
    import faiss

    inner = faiss.downcast_index(index)
    while isinstance(inner, (faiss.IndexIDMap, faiss.IndexIDMap2, faiss.IndexPreTransform)):
        inner = faiss.downcast_index(inner.index)
    return inner


def check_gpu_limits(params: dict, topk: int) -> None:
    """Raise `ValueError` when a GPU index could not answer: `topk` (hits per shard search) or
    `params["nprobe"]` (IVF lists probed) above faiss's GPU limit of 2048."""
    if topk > GPU_MAX_K:
        raise ValueError(
            f"topk={topk} exceeds faiss's GPU limit k <= {GPU_MAX_K}: lower retrieval.max_topk to "
            f"<= {GPU_MAX_K} or set retrieval.shard_gpus=0 to search shards on CPU"
        )
    nprobe = params.get("nprobe", 0)
    if nprobe > GPU_MAX_NPROBE:
        raise ValueError(
            f"nprobe={nprobe} exceeds faiss's GPU limit nprobe <= {GPU_MAX_NPROBE}: lower index.ivf_nprobe "
            f"to <= {GPU_MAX_NPROBE} (and rebuild the index) or set retrieval.shard_gpus=0"
        )


def gpu_plan(index, params: dict, topk: int) -> GpuPlan:
    """Decide whether (and how) a CPU FAISS index moves to the GPU.

    Args:
        index: a CPU faiss index as read from a shard (wrappers `IndexIDMap` / `IndexPreTransform`
            are looked through; faiss clones them on CPU and moves the index inside).
        params: the shard's search params (`nprobe` for IVF, `ef_search` for HNSW).
        topk: the largest k the shard will be asked for (hits per query).
    Returns:
        A `GpuPlan`: IndexFlat (L2 / IP) moves with float16 storage; IndexIVFFlat moves (float32);
        IndexIVFPQ moves when its code size is one GPU IVFPQ supports (float16 lookup tables from
        M = 56); HNSW and every other type stay on CPU, with the reason.
    Raises:
        ValueError: `topk` or `params["nprobe"]` above 2048 (names the config key to lower).
    """
    import faiss

    check_gpu_limits(params, topk)
    inner = _unwrap(index)
    name = type(inner).__name__
    if isinstance(inner, faiss.IndexHNSW):
        return GpuPlan(False, False, False,
                       f"{name}: faiss has no GPU HNSW, so this shard searches on CPU (set retrieval.shard_gpus=0 "
                       "to not reserve a GPU for it, or rebuild the index as flat or IVF to search on GPU)")
    if inner.metric_type not in (faiss.METRIC_L2, faiss.METRIC_INNER_PRODUCT):
        return GpuPlan(False, False, False, f"{name}: metric {inner.metric_type} is not L2 or inner product; "
                       "this shard searches on CPU")
    if type(inner) in (faiss.IndexFlat, faiss.IndexFlatIP, faiss.IndexFlatL2):
        return GpuPlan(True, True, False, f"{name}: moved to GPU with float16 storage")
    if type(inner) is faiss.IndexIVFFlat:
        return GpuPlan(True, False, False, f"{name}: moved to GPU (float32 lists)")
    if type(inner) is faiss.IndexIVFPQ:
        m, nbits = int(inner.pq.M), int(inner.pq.nbits)
        if nbits != 8 or m not in GPU_IVFPQ_CODE_BYTES:
            return GpuPlan(False, False, False,
                           f"{name}: PQ{m}x{nbits} is not supported by GPU IVFPQ (8-bit codes with M in "
                           f"{sorted(GPU_IVFPQ_CODE_BYTES)}); this shard searches on CPU (rebuild with a "
                           "supported index.pq_m and index.pq_nbits=8 to search on GPU)")
        f16 = m >= GPU_IVFPQ_FLOAT16_FROM_M
        return GpuPlan(True, False, f16, f"{name}: PQ{m}x8 moved to GPU"
                       + (" with float16 lookup tables (M >= 56)" if f16 else ""))
    return GpuPlan(False, False, False, f"{name}: no GPU version is used for this index type; "
                   "this shard searches on CPU")


def _gpu_resources(device: int):
    """The process's `StandardGpuResources` for `device` (created once, never freed)."""
    import faiss

    if not hasattr(faiss, "StandardGpuResources"):
        raise RuntimeError(NO_GPU_FAISS)
    if device not in _GPU_RESOURCES:
        _GPU_RESOURCES[device] = faiss.StandardGpuResources()
    return _GPU_RESOURCES[device]


def to_gpu(index, plan: GpuPlan, device: int = 0):
    """Copy a CPU index to GPU `device` as `plan` says; returns the GPU index.

    GpuClonerOptions has one float16 switch, `useFloat16`: float16 storage for GpuIndexFlat and
    float16 lookup tables (`useFloat16LookupTables`) for GpuIndexIVFPQ; it is set from either plan
    flag. The `StandardGpuResources` is kept in this module (and on the returned index as
    `referenced_objects`, as faiss does) so it outlives the index.

    Raises:
        ValueError: `plan.move` is False (the caller should keep the CPU index).
        RuntimeError: this faiss has no GPU support (the faiss-cpu wheel); the message names the fix.
    """
    import faiss

    if not plan.move:
        raise ValueError(f"this index stays on CPU: {plan.reason}")
    res = _gpu_resources(device)
    co = faiss.GpuClonerOptions()
    co.useFloat16 = bool(plan.use_float16 or plan.float16_lookup_tables)
    gpu_index = faiss.index_cpu_to_gpu(res, device, index, co)
    try:
        gpu_index.referenced_objects = [res]
    except AttributeError:  # a proxy that takes no attributes: the module dict keeps it alive anyway
        pass
    return gpu_index


def is_gpu_index(index) -> bool:
    """Whether `index` (or the index inside its IDMap / PreTransform wrappers) lives on a GPU."""
    import faiss

    gpu_cls = getattr(faiss, "GpuIndex", None)
    if gpu_cls is None:
        return False
    return isinstance(index, gpu_cls) or isinstance(_unwrap(index), gpu_cls)


def to_cpu_for_write(index):
    """A CPU copy of a GPU index (`faiss.index_gpu_to_cpu`), or `index` itself when it is already on
    CPU: indexes are always written (`faiss.write_index`) from a CPU copy."""
    import faiss

    return faiss.index_gpu_to_cpu(index) if is_gpu_index(index) else index
