"""Weight sync over NCCL (`learner.weight_sync: nccl`, GPU only): DeepSpeed rank 0 broadcasts the policy's
Hugging Face-named tensors straight into the GPUs of every vLLM rollout engine.

The pattern is OpenRLHF's and vLLM's own RLHF example: a *stateless* process group (vLLM's
`StatelessProcessGroup`, a TCPStore rendezvous that leaves torch.distributed's default group, DeepSpeed's, alone)
joined by the trainer's rank 0 and every worker process of every engine, with a `PyNcclCommunicator` on top.
Both ends use vLLM's weight-transfer API (vllm 0.32, `vllm.distributed.weight_transfer`):

- engine side: the engines are started with `weight_transfer_config={"backend": "nccl"}`, so each vLLM
  worker holds an `NCCLWeightTransferEngine`; `VLLMEngine.init_weight_transfer` / `receive_weights`
  (`actors.engines.vllm_engine`) drive it through `AsyncLLM.init_weight_transfer_engine`,
  `start_weight_update`, `update_weights` and `finish_weight_update`.
- trainer side (here): `NcclWeightSender` opens rank 0 of the group with `nccl_common.stateless_init_process_group`
  and broadcasts with `packed_tensor.packed_nccl_broadcast_producer`, the same producer vLLM's
  `NCCLTrainerWeightTransferEngine` uses, matched by the workers' `packed_nccl_broadcast_consumer`.

Why not `NCCLTrainerWeightTransferEngine.trainer_init` itself: it gives every worker `rank_offset=1`, which is
right for ONE vLLM deployment (its workers' ranks then come from their data-parallel index), but here each
rollout worker holds its own independent `AsyncLLM` (data-parallel index 0 in each), so engine i must start at
rank `1 + sum(tensor_parallel_size of engines before it)` (`nccl_layout`). It also drives the engines through a
client from inside the trainer; here the driver does (`sync_over_nccl`), as it does for the object-store path.

Metadata (names, dtype names, shapes) travels on the control plane, not over NCCL: it is vLLM's
`NCCLWeightTransferUpdateInfo` as a dict (`update_message`), handed to each engine's `update_weights`; the
workers size their receive buffers and packed-chunk boundaries from it, so the trainer must send exactly those
tensors in that order, packed into buckets of the same size (`bucket_bytes`, given to both ends at init).

Failure model: an NCCL broadcast has no timeout; if an engine dies mid-transfer, rank 0 blocks in it and the
call's deadline (`ray.call_timeout_s`) is what ends the step (the learner group must then be rebuilt). Checks
that can fail (names, dtypes, shapes, a restarted engine that left the group) run before any NCCL call.
NCCL needs one GPU per rank: rank 0 and the engine workers must be on different GPUs (a learner sharing a GPU
with an engine through fractional `gpus_per_rank` / `gpus_per_worker` cannot use this path; CUDA IPC would be
the colocated route). Re-syncing a subset of the workers (e.g. one restarted worker) forms a group of just
those; the next sync of all workers forms one of all again (each formation costs a rendezvous, seconds).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Bytes per packed broadcast bucket (both ends must agree; sent to the engines at init). vLLM's default is 1 GiB
# with 2 buffers, i.e. up to 2 GiB of extra GPU memory on the trainer and on every engine worker; 256 MiB (the
# object-store path's bucket) keeps that at 512 MiB while still moving ≥ 100 MB per NCCL call.
DEFAULT_BUCKET_BYTES = 256 << 20
DEFAULT_NUM_BUFFERS = 2


@dataclass(frozen=True)
class NcclLayout:
    """Ranks of the weight-transfer group: rank 0 is the trainer (DeepSpeed rank 0); engine i's workers are
    ranks `rank_offsets[i] .. rank_offsets[i] + tensor_parallel_sizes[i] - 1`.

    Attributes:
        world_size: 1 + the sum of the engines' tensor_parallel_size (processes in the group).
        rank_offsets: first rank of each engine, in the order the engines were given.
        tensor_parallel_sizes: worker processes (GPUs) of each engine.
    """

    world_size: int
    rank_offsets: tuple[int, ...]
    tensor_parallel_sizes: tuple[int, ...]


def nccl_layout(tensor_parallel_sizes: Sequence[int]) -> NcclLayout:
    """The group layout for engines of the given tensor-parallel sizes (pure Python).

    Example: sizes [1, 2, 1] -> world_size 5, rank_offsets (1, 2, 4).

    Raises:
        ValueError: no engines, or a size that is not an int >= 1.
    """
    sizes = tuple(tensor_parallel_sizes)
    if not sizes:
        raise ValueError("nccl_layout: no engines; pass one tensor_parallel_size per rollout engine")
    for i, tp in enumerate(sizes):
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"nccl_layout: engine {i} has tensor_parallel_size {tp!r}; expected an int >= 1")
    offsets, next_rank = [], 1
    for tp in sizes:
        offsets.append(next_rank)
        next_rank += tp
    return NcclLayout(world_size=next_rank, rank_offsets=tuple(offsets), tensor_parallel_sizes=sizes)


def engine_init_infos(master_address: str, master_port: int, layout: NcclLayout, *,
                      bucket_bytes: int = DEFAULT_BUCKET_BYTES, num_buffers: int = DEFAULT_NUM_BUFFERS) -> list[dict]:
    """One `init_info` dict per engine for `VLLMEngine.init_weight_transfer`: vLLM's
    `NCCLWeightTransferInitInfo` (TCP rendezvous at `master_address:master_port`, the engine's `rank_offset`,
    `world_size`, packed broadcast with `bucket_bytes` x `num_buffers`), serialized with vLLM's
    `worker_init_payload` (source: `vllm/distributed/weight_transfer/nccl_common.py`).

    Raises:
        ValueError: a bad port or bucket geometry (vLLM's own validation of the rendezvous fields too).
    """
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload

    if not 0 < int(master_port) < 65536:
        raise ValueError(f"engine_init_infos: master_port must be in 1..65535, got {master_port}")
    if bucket_bytes < 1 << 20 or num_buffers < 1:
        raise ValueError(f"engine_init_infos: bucket_bytes must be >= 1 MiB and num_buffers >= 1, got "
                         f"{bucket_bytes} and {num_buffers}")
    return [worker_init_payload(NCCLWeightTransferInitInfo(
        master_address=master_address, master_port=int(master_port), rank_offset=offset,
        world_size=layout.world_size, packed=True, packed_buffer_size_bytes=int(bucket_bytes),
        packed_num_buffers=int(num_buffers)))
        for offset in layout.rank_offsets]


def dtype_name(dtype: torch.dtype) -> str:
    """"bfloat16" for torch.bfloat16: the name vLLM's workers turn back with `getattr(torch, name)`."""
    return str(dtype).removeprefix("torch.")


def update_message(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list]:
    """The metadata of one update, as the engines receive it: `{"names", "dtype_names", "shapes"}`, i.e.
    `dataclasses.asdict` of vLLM's `NCCLWeightTransferUpdateInfo` (lists of str, str, list of int; same order
    as the tensors will be broadcast).

    Raises:
        TypeError: a value is not a torch.Tensor.
        ValueError: no tensors, or a name given twice.
    """
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    names, dtypes, shapes, seen = [], [], [], set()
    for name, tensor in named_tensors:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"update_message: {name!r} is {type(tensor).__name__}, expected a torch.Tensor")
        if name in seen:
            raise ValueError(f"update_message: tensor {name!r} given twice")
        seen.add(name)
        names.append(str(name))
        dtypes.append(dtype_name(tensor.dtype))
        shapes.append([int(d) for d in tensor.shape])
    if not names:
        raise ValueError("update_message: no tensors; pass (name, tensor) pairs")
    info = NCCLWeightTransferUpdateInfo(names=names, dtype_names=dtypes, shapes=shapes)
    return {"names": info.names, "dtype_names": info.dtype_names, "shapes": info.shapes}


def parse_update_message(message: Mapping[str, Any]) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """`update_message`'s dict back to (name, torch dtype, shape) triples, read the way vLLM's
    `NCCLWeightTransferEngine.receive_weights` reads it (`getattr(torch, dtype_name)`).

    Raises:
        ValueError: missing or extra keys, lists of different lengths, or an unknown dtype name.
    """
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    try:
        info = NCCLWeightTransferUpdateInfo(**dict(message))
    except TypeError as e:
        raise ValueError(f"parse_update_message: not an NCCL update message ({e}); expected keys names, "
                         "dtype_names, shapes") from None
    out = []
    for name, dname, shape in zip(info.names, info.dtype_names, info.shapes):
        dtype = getattr(torch, str(dname), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"parse_update_message: {name!r} has unknown dtype name {dname!r}")
        out.append((name, dtype, tuple(int(d) for d in shape)))
    return out


def _require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what}: NCCL weight sync needs CUDA, and this process sees no GPU (torch "
                           f"{torch.__version__}, cuda available: False); set learner.weight_sync: object_store "
                           "(the CPU default), or give the learner GPUs (learner.gpus_per_rank > 0)")


class NcclWeightSender:
    """The trainer end of the weight-transfer group; lives on DeepSpeed rank 0 (`DeepSpeedRank.nccl_init`).

    Args:
        device: the CUDA device to send from (default: the current CUDA device at `init`).
        bucket_bytes, num_buffers: packed-broadcast geometry; must equal what the engines were given
            (`engine_init_infos`).

    Raises (init / send):
        RuntimeError: CUDA is not available (the message names the config fix), or `send` before `init`.
    """

    def __init__(self, device: torch.device | str | int | None = None, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 num_buffers: int = DEFAULT_NUM_BUFFERS):
        self.device = device
        self.bucket_bytes, self.num_buffers = int(bucket_bytes), int(num_buffers)
        self.world_size: int | None = None
        self.endpoint: tuple[str, int] | None = None
        self._comm: Any = None  # vllm PyNcclCommunicator

    @property
    def ready(self) -> bool:
        """Whether `init` has formed the group (and `shutdown` has not torn it down)."""
        return self._comm is not None

    def init(self, master_address: str, master_port: int, world_size: int) -> None:
        """Host the group's TCPStore at `master_address:master_port` as rank 0 of `world_size` processes and
        open the NCCL communicator (vLLM `StatelessProcessGroup.create` + `PyNcclCommunicator`, through
        `vllm.distributed.weight_transfer.nccl_common.stateless_init_process_group`). Blocks until every engine
        worker joined (they run `init_weight_transfer` at the same time); vLLM's store timeout is 300 s.
        A group opened before is torn down first.

        Raises:
            RuntimeError: no CUDA, or the device is not a CUDA device.
            ValueError: world_size < 2 (no engine to send to).
        """
        _require_cuda("NcclWeightSender.init")
        if int(world_size) < 2:
            raise ValueError(f"NcclWeightSender.init: world_size must be >= 2 (the trainer and at least one engine "
                             f"worker), got {world_size}")
        from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group

        self.shutdown()
        device = torch.device("cuda", torch.cuda.current_device()) if self.device is None else torch.device(self.device)
        if device.type != "cuda":
            raise RuntimeError(f"NcclWeightSender.init: device {device} is not a CUDA device; NCCL sends from a GPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # vLLM's packed producer takes its streams on the current device
        self.device = device
        self._comm = stateless_init_process_group(master_address, int(master_port), 0, int(world_size), device.index)
        self.world_size, self.endpoint = int(world_size), (str(master_address), int(master_port))

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int,
             expected: Mapping[str, Any] | None = None) -> dict[str, float]:
        """Broadcast `named_tensors` (any device; sent in their own dtype) from rank 0, in order, packed into
        `bucket_bytes` buckets (vLLM `packed_nccl_broadcast_producer`). The engines must be receiving the same
        update at the same time (`VLLMEngine.receive_weights` with `update_message(named_tensors)`); returns
        when every bucket has left this GPU.

        Args:
            version: the weight version (for the returned record; the engines set theirs).
            expected: the metadata the engines were given; checked against the tensors before any NCCL call
                (a mismatch would split the stream differently on each side: a hang or garbage weights).

        Returns:
            {"version", "tensors" (count), "bytes", "send_s" (seconds)}.

        Raises:
            RuntimeError: no CUDA, or `init` not called.
            ValueError: the tensors disagree with `expected`; TypeError / ValueError from `update_message`.
        """
        _require_cuda("NcclWeightSender.send")
        if self._comm is None:
            raise RuntimeError("NcclWeightSender.send: the group is not formed; call init(master_address, "
                               "master_port, world_size) first (sync_over_nccl does)")
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        pairs = list(named_tensors)
        message = update_message(pairs)
        if expected is not None and dict(expected) != message:
            bad = next((i for i, (a, b) in enumerate(zip(parse_update_message(expected), parse_update_message(message)))
                        if a != b), min(len(expected["names"]), len(message["names"])))
            raise ValueError(f"NcclWeightSender.send: the tensors disagree with the metadata the engines were given "
                             f"(first difference at index {bad} of {len(message['names'])} tensors vs "
                             f"{len(expected['names'])} announced); nothing was sent")
        device = self.device
        t0 = time.perf_counter()
        packed_nccl_broadcast_producer(iterator=iter(pairs), group=self._comm, src=0,
                                       post_iter_func=lambda item: item[1].to(device),
                                       buffer_size_bytes=self.bucket_bytes, num_buffers=self.num_buffers)
        torch.cuda.current_stream(device).synchronize()
        size = sum(t.numel() * t.element_size() for _, t in pairs)
        return {"version": float(version), "tensors": float(len(pairs)), "bytes": float(size),
                "send_s": time.perf_counter() - t0}

    def shutdown(self) -> None:
        """Tear the communicator down (idempotent). The engines keep theirs until their next
        `init_weight_transfer` (which shuts the old one down first)."""
        comm, self._comm = self._comm, None
        self.world_size = self.endpoint = None
        if comm is not None:
            comm.destroy()


@dataclass(frozen=True)
class _GroupState:
    """What `sync_over_nccl` keeps on the LearnerGroup between syncs."""

    endpoint: tuple[str, int]
    layout: NcclLayout


_STATE_ATTR = "_nccl_sync_state"


def _formed(state: _GroupState | None, worker_states: Sequence[Mapping[str, Any]]) -> bool:
    """Whether these workers are exactly the members of the group formed last: as many as it has, each still
    holding its endpoint (a restarted worker holds none; one from an older group holds an older one)."""
    if state is None or len(worker_states) != len(state.layout.rank_offsets):
        return False
    return all(s.get("endpoint") is not None and tuple(s["endpoint"]) == state.endpoint for s in worker_states)


def _form_group(group: Any, workers: Sequence[Any], worker_states: Sequence[Mapping[str, Any]],
                timeout_s: float | None) -> _GroupState:
    """Form a new weight-transfer group of rank 0 and `workers` (rank 0 picks the address and a free port)."""
    from actors.lifecycle import get_within

    layout = nccl_layout([int(s["ranks"]) for s in worker_states])
    rank0 = group.actors[0]
    address, port = get_within(rank0.master_address.remote(), timeout_s, "policy learner rank 0: NCCL address")
    infos = engine_init_infos(address, port, layout, bucket_bytes=DEFAULT_BUCKET_BYTES, num_buffers=DEFAULT_NUM_BUFFERS)
    refs = [w.init_weight_transfer.remote(info) for w, info in zip(workers, infos)]
    refs.append(rank0.nccl_init.remote(address, port, layout.world_size, DEFAULT_BUCKET_BYTES, DEFAULT_NUM_BUFFERS))
    get_within(refs, timeout_s, f"NCCL weight-transfer group of {layout.world_size} ranks at {address}:{port} "
                                "(policy rank 0 and the rollout engines)")
    return _GroupState(endpoint=(str(address), int(port)), layout=layout)


def sync_over_nccl(group: Any, rollout_workers: Sequence[Any], version: int) -> dict[str, float]:
    """What `LearnerGroup.sync_weights` calls when `config.weight_sync == "nccl"`: send the policy's weights
    to every RolloutWorker's vLLM engine over NCCL and set their weight version to `version`.

    Steps: (1) every rank gathers the weights (`DeepSpeedRank.nccl_stage`, ZeRO partitions; in
    `learner.sync_dtype`), rank 0 keeps them and returns their metadata; (2) every worker checks that metadata
    against its checkpoint and reports its engine's group (`RolloutWorker.weight_transfer_state`); (3) when the
    workers are not exactly the members of the group formed last (first call, a restarted worker, another set
    of workers), a new group is formed (`nccl_layout`, `engine_init_infos`, rank 0's `nccl_init`); (4) rank 0
    broadcasts (`nccl_send`) while every worker receives (`receive_weights`).

    Args:
        group: the policy `LearnerGroup` (uses its `actors`, `config.sync_dtype`, `call_timeout_s`).
        rollout_workers: RolloutWorker handles with vLLM engines on GPUs.
        version: the weight version the engines record.

    Returns:
        {"sync_gather_s", "sync_init_s", "sync_load_s", "sync_s", "sync_bytes"}: seconds to gather on rank 0,
        seconds to check the workers and (re)form the group, seconds of the broadcast until every engine loaded
        the weights, the total, and the bytes broadcast once.

    Raises:
        ValueError: not the policy group, no workers, or a worker's engine is not vLLM / rejects the names.
        RuntimeError: an engine was not started for NCCL weight transfer, no CUDA on rank 0, or a worker
            reports another version.
        actors.lifecycle.RemoteTimeoutError: a step passed `call_timeout_s` (e.g. an engine died mid-broadcast:
            rank 0 is then stuck in NCCL and the learner group must be rebuilt).
    """
    from actors.lifecycle import get_within

    if getattr(group, "role", "policy") != "policy":
        raise ValueError("sync_weights: only the policy group has weights for the rollout workers")
    workers = list(rollout_workers)
    if not workers:
        raise ValueError("sync_over_nccl: no rollout workers to send to")
    timeout_s = group.call_timeout_s
    t0 = time.perf_counter()
    message = group._all("nccl_stage", group.config.sync_dtype)[0]
    t1 = time.perf_counter()
    states = get_within([w.weight_transfer_state.remote(message) for w in workers], timeout_s,
                        f"rollout workers: checking weights version {version} for NCCL")
    state = getattr(group, _STATE_ATTR, None)
    if not _formed(state, states):
        setattr(group, _STATE_ATTR, None)
        state = _form_group(group, workers, states, timeout_s)
        setattr(group, _STATE_ATTR, state)
    t2 = time.perf_counter()
    refs = [w.receive_weights.remote(message, version) for w in workers]
    refs.append(group.actors[0].nccl_send.remote(version))
    try:
        results = get_within(refs, timeout_s, f"NCCL weight sync of version {version} (policy rank 0 -> "
                                               f"{len(workers)} rollout engines)")
    except BaseException:
        setattr(group, _STATE_ATTR, None)  # the group's state is unknown: form a new one next time
        raise
    t3 = time.perf_counter()
    versions, sent = results[:-1], results[-1]
    if any(v != version for v in versions):
        raise RuntimeError(f"sync_weights: workers report versions {versions}, expected {version}")
    return {"sync_gather_s": t1 - t0, "sync_init_s": t2 - t1, "sync_load_s": t3 - t2, "sync_s": t3 - t0,
            "sync_bytes": float(sent["bytes"])}
