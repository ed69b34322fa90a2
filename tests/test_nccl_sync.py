"""NCCL weight sync (`learner.weight_sync: nccl`), the parts that run without a GPU: the group layout, the
config rules, the sender's CUDA check, the metadata message, the requests built for vLLM (parsed by vLLM's own
dataclasses and worker-engine parsers), and the engine / rank / worker forwarding with fakes in place of
vLLM's AsyncLLM and NCCL. The broadcast itself needs GPUs (not covered here)."""

import asyncio
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError
from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest
from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine, NCCLWeightTransferUpdateInfo

from actors.engines.vllm_engine import (
    NCCL_WEIGHT_TRANSFER,
    VLLMEngine,
    weight_transfer_init_request,
    weight_transfer_update_request,
)
from actors.learner import nccl_sync
from actors.learner.nccl_sync import (
    NcclLayout,
    NcclWeightSender,
    engine_init_infos,
    nccl_layout,
    parse_update_message,
    update_message,
)
from configs.schema import Config, LearnerConfig, RolloutConfig

# -- layout -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes, world, offsets", [
    ([1], 2, (1,)),
    ([1, 1, 1, 1], 5, (1, 2, 3, 4)),
    ([1, 2, 1], 5, (1, 2, 4)),
    ([4, 2], 7, (1, 5)),
])
def test_layout_world_size_and_offsets(sizes, world, offsets):
    layout = nccl_layout(sizes)
    assert layout == NcclLayout(world_size=world, rank_offsets=offsets, tensor_parallel_sizes=tuple(sizes))
    assert layout.world_size == 1 + sum(sizes)


@pytest.mark.parametrize("sizes", [[], [0], [1, -1], [1.0], [True], ["2"]])
def test_layout_rejects_bad_sizes(sizes):
    with pytest.raises(ValueError, match="nccl_layout"):
        nccl_layout(sizes)


def test_engine_init_infos_give_every_worker_a_distinct_rank_after_the_trainer():
    """Each engine's info parses as vLLM's NCCLWeightTransferInitInfo, and vLLM's worker rank rule
    (`worker_init_process_group`: dp_index * (TP*PP) + rank_in_engine + rank_offset, dp_index 0 for an
    independent AsyncLLM) gives ranks 1 .. world_size - 1, each once."""
    sizes = [2, 1, 3]
    layout = nccl_layout(sizes)
    infos = engine_init_infos("10.0.0.7", 29555, layout, bucket_bytes=64 << 20, num_buffers=3)
    assert len(infos) == len(sizes)
    ranks = []
    for info, tp in zip(infos, sizes):
        parsed = NCCLWeightTransferInitInfo(**info)
        assert (parsed.master_address, parsed.master_port, parsed.world_size) == ("10.0.0.7", 29555, 7)
        assert parsed.packed and parsed.packed_buffer_size_bytes == 64 << 20 and parsed.packed_num_buffers == 3
        assert "nccl_unique_id_b64" not in info  # TCP rendezvous only
        ranks += [0 * tp + r + parsed.rank_offset for r in range(tp)]
    assert sorted(ranks) == list(range(1, layout.world_size))


@pytest.mark.parametrize("kwargs", [{"bucket_bytes": 1000}, {"num_buffers": 0}])
def test_engine_init_infos_reject_bad_geometry(kwargs):
    with pytest.raises(ValueError, match="bucket_bytes|num_buffers"):
        engine_init_infos("h", 1234, nccl_layout([1]), **kwargs)


def test_engine_init_infos_reject_bad_port():
    with pytest.raises(ValueError, match="master_port"):
        engine_init_infos("h", 0, nccl_layout([1]))


# -- config -------------------------------------------------------------------------------------------------------


def test_weight_sync_defaults_to_object_store():
    assert LearnerConfig().weight_sync == "object_store"
    assert Config().learner.weight_sync == "object_store"


def test_nccl_needs_learner_gpus():
    with pytest.raises(ValidationError) as e:
        LearnerConfig(weight_sync="nccl")
    msg = str(e.value)
    assert "learner.weight_sync" in msg and "learner.gpus_per_rank" in msg and "object_store" in msg
    assert LearnerConfig(weight_sync="nccl", gpus_per_rank=1.0).weight_sync == "nccl"


def test_nccl_assignment_on_cpu_learner_is_refused():
    cfg = LearnerConfig()
    with pytest.raises(ValidationError, match="learner.weight_sync"):
        cfg.weight_sync = "nccl"


def test_unknown_weight_sync_is_refused():
    with pytest.raises(ValidationError, match="weight_sync"):
        LearnerConfig(weight_sync="gloo")


def test_nccl_needs_gpu_rollout_engines():
    learner = LearnerConfig(weight_sync="nccl", gpus_per_rank=1.0)
    with pytest.raises(ValidationError) as e:
        Config(learner=learner)
    assert "learner.weight_sync" in str(e.value) and "rollout.gpus_per_worker" in str(e.value)
    with pytest.raises(ValidationError, match="rollout.backend"):
        Config(learner=learner, rollout=RolloutConfig(backend="hf", gpus_per_worker=1.0))
    ok = Config(learner=learner, rollout=RolloutConfig(gpus_per_worker=1.0))
    assert ok.learner.weight_sync == "nccl"


# -- sender -------------------------------------------------------------------------------------------------------

requires_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")


@requires_no_cuda
def test_sender_init_without_cuda_is_a_clear_error():
    sender = NcclWeightSender()
    with pytest.raises(RuntimeError, match="needs CUDA") as e:
        sender.init("127.0.0.1", 29500, 2)
    assert "learner.weight_sync: object_store" in str(e.value)
    assert not sender.ready


@requires_no_cuda
def test_sender_send_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match="needs CUDA"):
        NcclWeightSender().send([("w", torch.zeros(2))], version=1)


def test_sender_send_before_init(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="call init"):
        NcclWeightSender().send([("w", torch.zeros(2))], version=1)


def test_sender_init_rejects_a_group_without_engines(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="world_size"):
        NcclWeightSender().init("127.0.0.1", 29500, 1)


def test_sender_refuses_tensors_that_disagree_with_the_announced_metadata(monkeypatch):
    """Checked before any NCCL call: the fake communicator would fail if the producer touched it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    sender = NcclWeightSender()
    sender._comm = object()
    pairs = [("a", torch.zeros(2, 3)), ("b", torch.zeros(4))]
    announced = update_message([("a", torch.zeros(2, 3)), ("b", torch.zeros(5))])
    with pytest.raises(ValueError, match="first difference at index 1"):
        sender.send(pairs, version=3, expected=announced)
    announced = update_message([("a", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(4))])
    with pytest.raises(ValueError, match="index 0"):
        sender.send(pairs, version=3, expected=announced)


# -- metadata message ---------------------------------------------------------------------------------------------


def _pairs():
    return [
        ("model.embed_tokens.weight", torch.zeros(10, 4, dtype=torch.bfloat16)),
        ("model.layers.0.self_attn.q_proj.weight", torch.zeros(4, 4, dtype=torch.float32)),
        ("model.layers.0.input_layernorm.weight", torch.zeros(4, dtype=torch.float16)),
        ("scalar", torch.tensor(1.5, dtype=torch.float64)),
        ("empty", torch.zeros(0, 3)),
        ("ids", torch.zeros(3, dtype=torch.int64)),
    ]


def test_metadata_message_round_trips_names_dtypes_shapes():
    pairs = _pairs()
    message = update_message(pairs)
    assert message["names"] == [n for n, _ in pairs]
    assert message["dtype_names"] == ["bfloat16", "float32", "float16", "float64", "float32", "int64"]
    assert message["shapes"] == [[10, 4], [4, 4], [4], [], [0, 3], [3]]
    assert parse_update_message(message) == [(n, t.dtype, tuple(t.shape)) for n, t in pairs]


def test_metadata_message_is_what_vllms_worker_reads():
    """vLLM's NCCLWeightTransferEngine parses the dict into its dataclass and reads dtypes with
    getattr(torch, name); its consumer sizes each tensor as prod(shape) * itemsize."""
    pairs = _pairs()
    info = NCCLWeightTransferUpdateInfo(**update_message(pairs))
    for (name, t), n, d, s in zip(pairs, info.names, info.dtype_names, info.shapes):
        dtype = getattr(torch, d)
        assert (n, dtype, tuple(s)) == (name, t.dtype, tuple(t.shape))
        assert torch.Size(s).numel() * dtype.itemsize == t.numel() * t.element_size()


def test_metadata_message_rejects_bad_input():
    with pytest.raises(ValueError, match="twice"):
        update_message([("a", torch.zeros(1)), ("a", torch.zeros(1))])
    with pytest.raises(TypeError, match="torch.Tensor"):
        update_message([("a", [1.0])])
    with pytest.raises(ValueError, match="no tensors"):
        update_message([])


@pytest.mark.parametrize("message, match", [
    ({"names": ["a"], "dtype_names": ["float32"]}, "not an NCCL update message"),
    ({"names": ["a"], "dtype_names": ["float32"], "shapes": [[1]], "version": 2}, "not an NCCL update message"),
    ({"names": ["a", "b"], "dtype_names": ["float32"], "shapes": [[1], [2]]}, "same size"),
    ({"names": ["a"], "dtype_names": ["float99"], "shapes": [[1]]}, "unknown dtype"),
    ({"names": ["a"], "dtype_names": ["Tensor"], "shapes": [[1]]}, "unknown dtype"),
])
def test_parse_update_message_rejects_bad_messages(message, match):
    with pytest.raises(ValueError, match=match):
        parse_update_message(message)


# -- requests for vLLM ----------------------------------------------------------------------------------------------


def _bare_worker_engine():
    """vLLM's worker-side NCCL engine without its constructor: enough for its parse_* methods, which the
    vLLM worker calls on what AsyncLLM forwards (`Worker.init_weight_transfer_engine` / `update_weights`)."""
    return object.__new__(NCCLWeightTransferEngine)


def test_init_request_is_vllms_and_parses_in_the_worker_engine():
    info = engine_init_infos("10.1.2.3", 40000, nccl_layout([1, 2]))[1]
    request = weight_transfer_init_request(info)
    assert isinstance(request, WeightTransferInitRequest)
    assert request.init_info == info and request.init_info is not info
    parsed = _bare_worker_engine().parse_init_info(request.init_info)
    assert isinstance(parsed, NCCLWeightTransferInitInfo)
    assert (parsed.rank_offset, parsed.world_size, parsed.packed) == (2, 4, True)


def test_update_request_is_vllms_and_parses_in_the_worker_engine():
    message = update_message(_pairs())
    request = weight_transfer_update_request(message)
    assert isinstance(request, WeightTransferUpdateRequest)
    parsed = _bare_worker_engine().parse_update_info(request.update_info)
    assert isinstance(parsed, NCCLWeightTransferUpdateInfo)
    assert parsed.names == message["names"] and parsed.shapes == message["shapes"]


@pytest.mark.parametrize("info", [
    {"master_address": "h", "master_port": 1, "world_size": 2},  # no rank_offset
    {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 2, "bogus": 1},
    {"rank_offset": 1, "world_size": 2},  # no rendezvous
    ["not", "a", "dict"],
])
def test_init_request_rejects_bad_info(info):
    with pytest.raises(ValueError, match="init_weight_transfer"):
        weight_transfer_init_request(info)


@pytest.mark.parametrize("update", [
    {"names": ["a"], "dtype_names": ["float32"]},
    {"names": ["a"], "dtype_names": ["float32", "float32"], "shapes": [[1]]},
    "names",
])
def test_update_request_rejects_bad_update(update):
    with pytest.raises(ValueError):
        weight_transfer_update_request(update)


def test_engine_kwargs_build_vllms_weight_transfer_config():
    from vllm.config.weight_transfer import WeightTransferConfig

    assert WeightTransferConfig(**NCCL_WEIGHT_TRANSFER["weight_transfer_config"]).backend == "nccl"


# -- engine side, with a fake AsyncLLM -----------------------------------------------------------------------------

PARAMS = {"model.embed_tokens.weight", "model.norm.weight",
          "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"}


class FakeAsyncLLM:
    """Records the weight-transfer calls VLLMEngine makes, in order."""

    def __init__(self, backend="nccl"):
        config = None if backend is None else SimpleNamespace(backend=backend)
        self.vllm_config = SimpleNamespace(weight_transfer_config=config)
        self.calls = []

    async def init_weight_transfer_engine(self, request):
        self.calls.append(("init", request))

    async def shutdown_weight_transfer_engine(self):
        self.calls.append(("shutdown", None))

    async def start_weight_update(self):
        self.calls.append(("start", None))

    async def update_weights(self, request):
        self.calls.append(("update", request))

    async def finish_weight_update(self, weight_version=None):
        self.calls.append(("finish", weight_version))

    async def reset_prefix_cache(self, reset_running_requests=False):
        self.calls.append(("reset", reset_running_requests))
        return True


def _engine(backend="nccl", tied=False):
    engine = object.__new__(VLLMEngine)
    engine._engine, engine._closed, engine._update_lock = FakeAsyncLLM(backend), False, None
    engine._param_names, engine._tied, engine.model, engine.weight_version = set(PARAMS), tied, "m", 0
    return engine


def _message(names):
    return update_message([(n, torch.zeros(2)) for n in names])


def test_engine_receives_through_vllms_update_lifecycle():
    engine = _engine()
    info = engine_init_infos("h", 1234, nccl_layout([1]))[0]
    asyncio.run(engine.init_weight_transfer(info))
    assert engine.weight_transfer_info == info
    message = _message(sorted(PARAMS))
    asyncio.run(engine.receive_weights(message, version=7))
    kinds = [k for k, _ in engine._engine.calls]
    assert kinds == ["init", "start", "update", "finish", "reset"]
    assert isinstance(engine._engine.calls[0][1], WeightTransferInitRequest)
    update = engine._engine.calls[2][1]
    assert isinstance(update, WeightTransferUpdateRequest) and update.update_info == message
    assert engine._engine.calls[4] == ("reset", True)
    assert engine.weight_version == 7


def test_engine_leaves_its_old_group_before_joining_a_new_one():
    engine = _engine()
    first, second = (engine_init_infos("h", port, nccl_layout([1]))[0] for port in (1111, 2222))
    asyncio.run(engine.init_weight_transfer(first))
    asyncio.run(engine.init_weight_transfer(second))
    assert [k for k, _ in engine._engine.calls] == ["init", "shutdown", "init"]
    assert engine.weight_transfer_info["master_port"] == 2222


def test_engine_without_nccl_weight_transfer_is_a_clear_error():
    engine = _engine(backend=None)
    with pytest.raises(RuntimeError, match="NCCL_WEIGHT_TRANSFER"):
        asyncio.run(engine.init_weight_transfer(engine_init_infos("h", 1234, nccl_layout([1]))[0]))
    assert engine._engine.calls == []


def test_engine_receive_before_init_is_an_error():
    engine = _engine()
    with pytest.raises(RuntimeError, match="init_weight_transfer first"):
        asyncio.run(engine.receive_weights(_message(sorted(PARAMS)), version=1))
    assert engine._engine.calls == []


@pytest.mark.parametrize("names, match", [
    (sorted(PARAMS) + ["model.bogus.weight"], "not in the checkpoint"),
    (["model.layers.0.self_attn.q_proj.weight"], "only in part"),
    (sorted(PARAMS) + ["lm_head.weight"], "not in the checkpoint"),
])
def test_engine_rejects_bad_names_before_any_nccl_call(names, match):
    engine = _engine()
    engine.weight_transfer_info = {"master_address": "h", "master_port": 1}
    with pytest.raises(ValueError, match=match):
        asyncio.run(engine.receive_weights(_message(names), version=1))
    assert engine._engine.calls == []


def test_engine_allows_a_tied_lm_head():
    _engine(tied=True).check_weight_update(_message(sorted(PARAMS) + ["lm_head.weight"]))


# -- learner rank and rollout worker forwarding ---------------------------------------------------------------------


class FakeSender:
    def __init__(self):
        self.sent = []

    def send(self, named, version, expected=None):
        self.sent.append((named, version, expected))
        return {"bytes": 8.0}


def test_rank_stages_on_every_rank_and_sends_from_rank_0():
    from actors.learner.rank import DeepSpeedRank

    pairs = [("model.norm.weight", torch.ones(2))]
    ranks = [DeepSpeedRank(LearnerConfig(num_ranks=2), rank=r, world_size=2) for r in (0, 1)]
    gathered = []
    for r in ranks:
        r.named_weights = lambda dtype, r=r: gathered.append((r.rank, dtype)) or (pairs if r.rank == 0 else None)
    assert ranks[1].nccl_stage("fp32") is None
    message = ranks[0].nccl_stage("fp32")
    assert gathered == [(1, "fp32"), (0, "fp32")]
    assert message == update_message(pairs)
    with pytest.raises(RuntimeError, match="nccl_init"):
        ranks[0].nccl_send(1)  # no sender: and the staged weights are dropped
    ranks[0].nccl_stage("fp32")
    ranks[0]._nccl_sender = FakeSender()
    assert ranks[0].nccl_send(4) == {"bytes": 8.0}
    assert ranks[0]._nccl_sender.sent == [(pairs, 4, message)]
    with pytest.raises(RuntimeError, match="nccl_stage"):
        ranks[0].nccl_send(5)  # sent once, then dropped
    with pytest.raises(ValueError, match="rank 0 only"):
        ranks[1].nccl_init("h", 1, 2, 1 << 20, 2)


@requires_no_cuda
def test_rank_0_nccl_init_without_cuda_is_a_clear_error():
    from actors.learner.rank import DeepSpeedRank

    with pytest.raises(RuntimeError, match="needs CUDA"):
        DeepSpeedRank(LearnerConfig()).nccl_init("127.0.0.1", 29500, 2, 1 << 20, 2)


def _worker(engine, tp=2, backend="vllm"):
    from actors.engines.spec import EngineHolder
    from actors.rollout.worker import RolloutWorker

    worker = object.__new__(RolloutWorker)
    worker.holder = EngineHolder({"backend": backend, "model": "m", "tensor_parallel_size": tp})
    worker.holder.engine = engine
    return worker


def test_worker_reports_ranks_and_endpoint_and_forwards():
    engine = _engine()
    worker = _worker(engine, tp=2)
    message = _message(sorted(PARAMS))
    assert asyncio.run(worker.weight_transfer_state(message)) == {"ranks": 2, "endpoint": None}
    info = engine_init_infos("10.0.0.1", 4321, nccl_layout([2]))[0]
    asyncio.run(worker.init_weight_transfer(info))
    assert asyncio.run(worker.weight_transfer_state()) == {"ranks": 2, "endpoint": ["10.0.0.1", 4321]}
    assert asyncio.run(worker.receive_weights(message, 9)) == 9
    with pytest.raises(ValueError, match="only in part"):
        asyncio.run(worker.weight_transfer_state(_message(["model.layers.0.mlp.up_proj.weight"])))


def test_worker_with_a_non_vllm_engine_refuses():
    worker = _worker(SimpleNamespace(weight_version=0), backend="hf")
    with pytest.raises(ValueError, match="rollout.backend: vllm"):
        asyncio.run(worker.weight_transfer_state())


# -- when a new group must be formed -------------------------------------------------------------------------------


def test_group_is_reformed_when_its_members_change():
    state = nccl_sync._GroupState(endpoint=("h", 5000), layout=nccl_layout([1, 1]))
    same = [{"ranks": 1, "endpoint": ["h", 5000]}, {"ranks": 1, "endpoint": ["h", 5000]}]
    assert nccl_sync._formed(state, same)
    assert not nccl_sync._formed(None, same)  # first sync
    assert not nccl_sync._formed(state, same[:1])  # a subset (e.g. re-syncing one restarted worker)
    assert not nccl_sync._formed(state, [same[0], {"ranks": 1, "endpoint": None}])  # a restarted worker
    assert not nccl_sync._formed(state, [same[0], {"ranks": 1, "endpoint": ["h", 4999]}])  # an older group


def test_policy_engines_of_an_nccl_run_start_with_vllms_weight_transfer_engine():
    from actors.engines.spec import engine_spec
    from configs import load_config

    gpu = ["learner.gpus_per_rank=1", "rollout.gpus_per_worker=1", "rollout.backend=vllm"]
    cfg = load_config(None, [*gpu, "learner.weight_sync=nccl"])
    assert engine_spec(cfg, "policy").backend_options()["weight_transfer_config"] == {"backend": "nccl"}
    assert "weight_transfer_config" not in engine_spec(cfg, "generator").backend_options()  # frozen: never synced
    assert "weight_transfer_config" not in engine_spec(load_config(None, gpu), "policy").backend_options()
