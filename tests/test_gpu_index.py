"""Retrieval shards on GPU (`actors.retrieval.gpu_index`, `ShardSearcher(gpu=True)`, the pool's shard
options, `retrieval.shard_gpus` and its role in `cluster.roles`), tested on CPU: the plans are checked
on real faiss indexes; the GPU calls themselves go to a stand-in of faiss's GPU API where needed."""

from __future__ import annotations

import functools
import json
import sys
import types

import faiss
import numpy as np
import pydantic
import pytest

from actors.retrieval import gpu_index
from actors.retrieval.gpu_index import GpuPlan, gpu_plan, to_cpu_for_write, to_gpu
from configs import DEFAULT_CONFIG, load_config
from configs.schema import RetrievalConfig

D = 56  # divisible by 8 (PQ8), 56 (PQ56) and 7 (PQ7)
HAS_GPU_FAISS = hasattr(faiss, "StandardGpuResources")


def vectors(n: int = 300, d: int = D, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def built(factory: str, n: int = 300, d: int = D):
    """A real trained, filled inner-product index from a factory string (PQ ones with "np": no
    polysemous training, which takes minutes here and changes nothing these tests look at). Cached:
    training PQ56 takes seconds; no test modifies an index."""
    index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    x = vectors(n, d)
    if not index.is_trained:
        index.train(x)
    if isinstance(index, faiss.IndexIDMap):
        index.add_with_ids(x, np.arange(n, dtype=np.int64) * 7)
    else:
        index.add(x)
    return index


# ----------------------------------------------------------------------------- gpu_plan


@pytest.mark.parametrize("index", [faiss.IndexFlatIP(D), faiss.IndexFlatL2(D)], ids=["IP", "L2"])
def test_flat_moves_with_float16_storage(index):
    index.add(vectors())
    plan = gpu_plan(index, {}, topk=10)
    assert plan == GpuPlan(True, True, False, plan.reason) and "float16" in plan.reason


def test_wrapped_flat_is_looked_through():
    plan = gpu_plan(built("IDMap,Flat"), {}, topk=10)
    assert plan.move and plan.use_float16


def test_ivf_flat_moves_in_float32():
    plan = gpu_plan(built("IVF4,Flat"), {"nprobe": 2}, topk=10)
    assert (plan.move, plan.use_float16, plan.float16_lookup_tables) == (True, False, False)


@pytest.mark.parametrize("m,lookup16", [(8, False), (56, True)])
def test_ivfpq_supported_code_sizes_move(m, lookup16):
    index = built(f"IVF4,PQ{m}np")
    assert faiss.downcast_index(index).pq.M == m
    plan = gpu_plan(index, {"nprobe": 4}, topk=100)
    assert (plan.move, plan.use_float16, plan.float16_lookup_tables) == (True, False, lookup16)
    assert ("float16 lookup tables" in plan.reason) == lookup16


@pytest.mark.parametrize("factory,shown", [("IVF4,PQ7np", "PQ7x8"), ("IVF4,PQ8x4np", "PQ8x4")])
def test_ivfpq_unsupported_codes_stay_on_cpu(factory, shown):
    plan = gpu_plan(built(factory), {}, topk=10)
    assert not plan.move and not plan.float16_lookup_tables
    assert shown in plan.reason and "not supported by GPU IVFPQ" in plan.reason and "index.pq_m" in plan.reason


@pytest.mark.parametrize("factory", ["HNSW8", "HNSW8_SQfp16"])
def test_hnsw_stays_on_cpu_and_says_why(factory):
    plan = gpu_plan(built(factory), {"ef_search": 16}, topk=10)
    assert not plan.move and not plan.use_float16
    assert "no GPU HNSW" in plan.reason and "retrieval.shard_gpus=0" in plan.reason
    assert "flat or IVF" in plan.reason


def test_other_index_types_stay_on_cpu():
    plan = gpu_plan(built("IVF4,SQ8"), {}, topk=10)
    assert not plan.move and plan.reason.startswith("IndexIVFScalarQuantizer")


def test_gpu_limits_on_k_and_nprobe():
    index = built("IVF4,Flat")
    assert gpu_plan(index, {"nprobe": 2048}, topk=2048).move  # the limits themselves are fine
    with pytest.raises(ValueError, match=r"topk=2049 .*retrieval\.max_topk.*retrieval\.shard_gpus=0"):
        gpu_plan(index, {}, topk=2049)
    with pytest.raises(ValueError, match=r"nprobe=4096 .*index\.ivf_nprobe"):
        gpu_plan(index, {"nprobe": 4096}, topk=10)
    with pytest.raises(ValueError, match="retrieval.max_topk"):  # checked for every type, HNSW too
        gpu_plan(built("HNSW8"), {}, topk=5000)


# ----------------------------------------------------------------------------- to_gpu / to_cpu_for_write


@pytest.mark.skipif(HAS_GPU_FAISS, reason="this faiss has GPU support")
def test_to_gpu_on_faiss_cpu_names_the_wheel():
    index = built("Flat")
    with pytest.raises(RuntimeError, match=r"faiss-gpu==1\.15\.1.*requirements\.txt.*faiss-gpu-cu12"):
        to_gpu(index, gpu_plan(index, {}, topk=10))


class FakeGpuIndex:
    """Stands for a faiss GpuIndex made by the fake `index_cpu_to_gpu` below."""

    def __init__(self, cpu_index, device, options):
        self.cpu_index, self.device, self.options = cpu_index, device, options


@pytest.fixture
def fake_gpu_faiss(monkeypatch):
    """faiss's GPU API replaced by stand-ins that record how they were called."""
    made = []

    class Resources:
        def __init__(self):
            made.append(self)

    monkeypatch.setattr(faiss, "StandardGpuResources", Resources, raising=False)
    monkeypatch.setattr(faiss, "GpuClonerOptions", types.SimpleNamespace, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", lambda res, dev, idx, co: FakeGpuIndex(idx, dev, co), raising=False)
    monkeypatch.setattr(faiss, "GpuIndex", FakeGpuIndex, raising=False)
    monkeypatch.setattr(faiss, "index_gpu_to_cpu", lambda g: ("cpu copy", g.cpu_index), raising=False)
    monkeypatch.setattr(gpu_index, "_GPU_RESOURCES", {})
    return made


@pytest.mark.parametrize("factory,float16", [("Flat", True), ("IVF4,PQ56np", True), ("IVF4,PQ8np", False),
                                             ("IVF4,Flat", False)])
def test_to_gpu_sets_cloner_options_and_keeps_resources(fake_gpu_faiss, factory, float16):
    index = built(factory)
    g = to_gpu(index, gpu_plan(index, {}, topk=10), device=1)
    assert g.cpu_index is index and g.device == 1 and g.options.useFloat16 is float16
    assert len(fake_gpu_faiss) == 1 and g.referenced_objects == [fake_gpu_faiss[0]]
    assert gpu_index._GPU_RESOURCES == {1: fake_gpu_faiss[0]}
    to_gpu(index, gpu_plan(index, {}, topk=10), device=1)
    assert len(fake_gpu_faiss) == 1  # one StandardGpuResources per device, reused


def test_to_gpu_refuses_an_index_that_stays_on_cpu(fake_gpu_faiss):
    index = built("HNSW8")
    with pytest.raises(ValueError, match="no GPU HNSW"):
        to_gpu(index, gpu_plan(index, {}, topk=10))
    assert fake_gpu_faiss == []


def test_to_cpu_for_write_returns_cpu_indexes_unchanged():
    index = built("IVF4,Flat")
    assert to_cpu_for_write(index) is index


def test_to_cpu_for_write_copies_gpu_indexes_back(fake_gpu_faiss):
    index = built("Flat")
    assert to_cpu_for_write(index) is index
    assert to_cpu_for_write(to_gpu(index, gpu_plan(index, {}, topk=10))) == ("cpu copy", index)


# ----------------------------------------------------------------------------- ShardSearcher(gpu=True)


def write_shard(path, factory: str, n: int = 300):
    """A shard directory as `pipelines.build_index` writes it: record, Parquet documents, FAISS index."""
    from actors.retrieval.index_store import DOCS, FAISS_FILE, SHARD_RECORD, write_docs

    path.mkdir(parents=True)
    (path / SHARD_RECORD).write_text(json.dumps({"start": 1000, "count": n, "params": {}}))
    write_docs(path / DOCS, [f"d{i}" for i in range(n)], ["t"] * n, ["x"] * n, row_group_size=100)
    faiss.write_index(built(factory, n), str(path / FAISS_FILE))
    return path


def test_shard_moves_flat_index_to_gpu(tmp_path, monkeypatch):
    from actors.retrieval import shard as shard_mod

    calls = []
    monkeypatch.setattr(shard_mod, "to_gpu", lambda index, plan, device=0: calls.append((plan, device)) or index)
    s = shard_mod.ShardSearcher(str(write_shard(tmp_path / "s", "Flat")), gpu=True)
    info = s.device_info()
    assert info["device"] == "cuda:0" and info["reason"].startswith("IndexFlat") and "float16" in info["reason"]
    assert calls[0][0].use_float16 and calls[0][1] == 0
    scores, ids = s.search(vectors(2), 3)
    assert ids.shape == (2, 3) and ids.min() >= 1000


def test_shard_keeps_hnsw_on_cpu_with_a_warning(tmp_path, monkeypatch, caplog):
    from actors.retrieval import shard as shard_mod

    monkeypatch.setattr(shard_mod, "to_gpu", lambda *a, **k: pytest.fail("HNSW must not be moved"))
    with caplog.at_level("WARNING", logger=shard_mod.__name__):
        s = shard_mod.ShardSearcher(str(write_shard(tmp_path / "s", "HNSW8")), gpu=True)
    info = s.device_info()
    assert info["device"] == "cpu" and "no GPU HNSW" in info["reason"]
    assert "stays on CPU" in caplog.text


def test_shard_without_gpu_is_on_cpu(tmp_path):
    from actors.retrieval.shard import ShardSearcher

    s = ShardSearcher(str(write_shard(tmp_path / "s", "Flat")))
    assert s.device_info()["device"] == "cpu" and "shard_gpus=0" in s.device_info()["reason"]


@pytest.mark.skipif(HAS_GPU_FAISS, reason="this faiss has GPU support")
def test_shard_gpu_on_faiss_cpu_fails_loudly(tmp_path):
    from actors.retrieval.shard import ShardSearcher

    with pytest.raises(RuntimeError, match="faiss-gpu"):
        ShardSearcher(str(write_shard(tmp_path / "s", "Flat")), gpu=True)


# ----------------------------------------------------------------------------- pool options


class FakeRay(types.ModuleType):
    """`ray.remote(cls).options(**o).remote(*args)` recorded as (options, args)."""

    def __init__(self):
        super().__init__("ray")
        self.started = []

    def remote(self, cls):
        ray = self

        class Handle:
            def options(self, **opts):
                return types.SimpleNamespace(remote=lambda *args: ray.started.append((opts, args)))

        return Handle()


def bm25_index_dir(tmp_path, shards: int = 2):
    from actors.retrieval.index_store import MANIFEST

    records = [{"name": f"shard-{i:05d}", "start": 10 * i, "count": 10} for i in range(shards)]
    manifest = {"version": 1, "index_type": "bm25", "metric": "bm25", "dim": None, "normalized": False,
                "encoder": None, "index": {}, "num_docs": 10 * shards, "shards": records, "corpus": {}}
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    return tmp_path


@pytest.mark.parametrize("shard_gpus", [0.5, 0.0, None])
def test_pool_reserves_gpus_for_shards(tmp_path, monkeypatch, shard_gpus):
    from actors.retrieval.pool import RetrievalPool

    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    retrieval = RetrievalConfig().model_dump()
    if shard_gpus is None:
        del retrieval["shard_gpus"]  # a caller's dict without the key
    else:
        retrieval["shard_gpus"] = shard_gpus
    RetrievalPool(str(bm25_index_dir(tmp_path)), retrieval)
    assert len(fake.started) == 2
    for opts, args in fake.started:
        assert opts["scheduling_strategy"] == "SPREAD" and opts["max_restarts"] == retrieval["max_restarts"]
        assert opts["max_task_retries"] == 0 and opts["num_cpus"] == retrieval["shard_cpus"]
        assert opts.get("num_gpus", 0) == (shard_gpus or 0)
        assert ("num_gpus" in opts) == bool(shard_gpus)
        assert args[1:] == (1, 0.0, bool(shard_gpus))


# ----------------------------------------------------------------------------- config and roles


def test_config_shard_gpus_limits_max_topk():
    assert RetrievalConfig().shard_gpus == 0.0
    assert RetrievalConfig(shard_gpus=0.25, max_topk=2048).shard_gpus == 0.25
    assert RetrievalConfig(shard_gpus=0, max_topk=5000).max_topk == 5000  # CPU shards have no such limit
    with pytest.raises(pydantic.ValidationError, match=r"retrieval\.max_topk \(5000\) must be <= 2048"):
        RetrievalConfig(shard_gpus=0.5, max_topk=5000)
    cfg = RetrievalConfig(max_topk=5000)
    with pytest.raises(pydantic.ValidationError, match=r"retrieval\.max_topk"):
        cfg.shard_gpus = 1  # validated on assignment too
    with pytest.raises(pydantic.ValidationError):
        RetrievalConfig(shard_gpus=-0.5)


def test_plan_roles_reserves_shard_gpus():
    from cluster.roles import plan_roles, total_resources

    base = {r.name: r for r in plan_roles(load_config(DEFAULT_CONFIG))}
    cfg = load_config(DEFAULT_CONFIG, ["retrieval.shard_gpus=0.25"])
    plan = plan_roles(cfg)
    shard = {r.name: r for r in plan}["retrieval_shard"]
    assert base["retrieval_shard"].gpus == 0.0 and "GPU" not in base["retrieval_shard"].bundle()
    assert shard.gpus == 0.25 and shard.strategy == "SPREAD"
    assert shard.keys["gpus"] == "retrieval.shard_gpus"
    assert shard.ray_options()["num_gpus"] == 0.25 and shard.ray_options()["scheduling_strategy"] == "SPREAD"
    extra = total_resources(plan)["GPU"] - total_resources(list(base.values()))["GPU"]
    assert extra == pytest.approx(0.25 * cfg.index.num_shards)
