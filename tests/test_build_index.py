"""Index building: resume after interruption, parameter mismatch, bad corpus rows, BM25 shards.

BM25 builds need no encoder, so these run in seconds; the dense path is covered by `small_index`.
"""

import gzip
import hashlib
import json

import numpy as np
import pytest

from actors.retrieval.index_store import IndexFormatError, Manifest, ShardRecord, sha256_file, verify_shard
from actors.retrieval.shard import ShardSearcher, merge_topk
from configs import Config
from pipelines import build_index as build_module
from pipelines.build_index import build_index
from pipelines.data import BadRowError


def bm25_config(tmp_path, data_dir, shards=3, limit=300) -> Config:
    cfg = Config()
    cfg.data.dir = str(data_dir)
    cfg.data.corpus_limit = limit
    cfg.index.dir = str(tmp_path / "bm25")
    cfg.index.type = "bm25"
    cfg.index.num_shards = shards
    return cfg


def test_bm25_build_writes_manifest_and_finds_titles(tmp_path, data_dir):
    cfg = bm25_config(tmp_path, data_dir)
    m = build_index(cfg, progress=False)
    assert m.metric == "bm25" and m.encoder is None and m.num_docs == 300
    assert [(s.start, s.count) for s in m.shards] == [(0, 100), (100, 100), (200, 100)]
    assert m.corpus["limit"] == 300
    shards = [ShardSearcher(str(tmp_path / "bm25" / s.name)) for s in m.shards]
    for s in m.shards:
        verify_shard(tmp_path / "bm25" / s.name, s)
    # Search each passage's own title: the passage itself should come back near the top.
    probe = shards[1].fetch([150])[0]
    per = [sh.search_text([probe["title"]], 5) for sh in shards]
    _, ids = merge_topk([p[0] for p in per], [p[1] for p in per], 5)
    assert 150 in ids[0].tolist()


def test_interrupted_build_resumes_at_first_unfinished_shard(tmp_path, data_dir, monkeypatch):
    cfg = bm25_config(tmp_path, data_dir)
    calls = []
    real = build_module.build_shard

    def crash_on_third(cfg_, index_dir, i, *a, **kw):
        calls.append(i)
        if i == 2:
            raise KeyboardInterrupt("simulated interruption")
        return real(cfg_, index_dir, i, *a, **kw)

    monkeypatch.setattr(build_module, "build_shard", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        build_index(cfg, progress=False)
    index_dir = tmp_path / "bm25"
    assert not (index_dir / "manifest.json").exists()
    with pytest.raises(IndexFormatError, match="not a finished index"):
        Manifest.load(index_dir)
    done = {p: sha256_file(p / "shard.json") for p in (index_dir / "shard-00000", index_dir / "shard-00001")}

    calls.clear()
    monkeypatch.setattr(build_module, "build_shard", lambda *a, **kw: (calls.append(a[2]), real(*a, **kw))[1])
    m = build_index(cfg, progress=False)
    assert calls == [2]  # shards 0 and 1 were kept
    assert {p: sha256_file(p / "shard.json") for p in done} == done
    assert len(m.shards) == 3 and not list(index_dir.glob("*.partial"))


def test_resume_with_other_parameters_is_refused(tmp_path, data_dir):
    cfg = bm25_config(tmp_path, data_dir, limit=120)
    build_index(cfg, progress=False)
    cfg.index.num_shards = 2
    with pytest.raises(IndexFormatError, match="differs in: index"):
        build_index(cfg, progress=False)


def test_bad_corpus_row_names_file_and_line(tmp_path, data_dir):
    corpus = tmp_path / "corpus.jsonl.gz"
    rows = [{"id": f"d{i}", "title": f"T{i}", "text": f"text {i}"} for i in range(5)]
    rows[3] = {"id": "d3", "title": "T3"}  # no text
    with gzip.open(corpus, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = bm25_config(tmp_path, data_dir, shards=1, limit=5)
    with pytest.raises(BadRowError, match=r"corpus.jsonl.gz line 4"):
        build_index(cfg, corpus_path=corpus, progress=False)


def test_flashrag_corpus_builds(tmp_path, data_dir):
    corpus = tmp_path / "flashrag.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": str(i), "contents": f'"Title {i}"\nbody number {i} zebra{i}'}) for i in range(6)))
    cfg = bm25_config(tmp_path, data_dir, shards=2, limit=None)
    cfg.data.corpus_limit = None
    m = build_index(cfg, corpus_path=corpus, progress=False)
    shard = ShardSearcher(str(tmp_path / "bm25" / m.shards[1].name))
    scores, ids = shard.search_text(["zebra4"], 2)
    assert ids[0, 0] == 4 and np.isfinite(scores[0, 0])
    assert shard.fetch([4]) == [{"doc_id": "4", "title": "Title 4", "text": "body number 4 zebra4"}]


def _manifest_dict() -> dict:
    shards = [ShardRecord(name=f"shard-0000{i}", start=100 * i, count=100, files={"docs.parquet": "ab" * 32},
                          size_bytes=10, ntotal=100) for i in range(2)]
    m = Manifest(version=1, index_type="bm25", metric="bm25", dim=None, normalized=False, encoder=None,
                 index={"type": "bm25", "fp16": False, "factory": None, "params": {}}, num_docs=200, shards=shards,
                 corpus={"path": "corpus.jsonl.gz", "limit": 200}, build_seconds=1.5)
    return json.loads(m.to_json())


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda m: m.update(num_docs="200"), "num_docs: Input should be a valid integer"),
        (lambda m: m["shards"][1].pop("count"), "shards[1].count: Field required"),
        (lambda m: m["shards"][0].update(start=None), "shards[0].start: Input should be a valid integer"),
        (lambda m: m.update(num_shards=2), "num_shards: Unexpected keyword argument"),
        (lambda m: m["shards"][0].update(sha="x"), "shards[0].sha: Unexpected keyword argument"),
        (lambda m: m.update(shards={"name": "shard-00000"}), "shards: Input should be a valid array"),
    ],
)
def test_bad_manifest_is_an_index_format_error_naming_the_key(tmp_path, change, problem):
    """manifest.json is checked on load (types, missing and unknown keys); the good one loads unchanged."""
    good = _manifest_dict()
    (tmp_path / "manifest.json").write_text(json.dumps(good))
    loaded = Manifest.load(tmp_path)
    assert json.loads(loaded.to_json()) == good and isinstance(loaded.shards[1], ShardRecord)
    change(good)
    (tmp_path / "manifest.json").write_text(json.dumps(good))
    with pytest.raises(IndexFormatError, match="unreadable manifest") as e:
        Manifest.load(tmp_path)
    assert problem in str(e.value) and "rebuild the index" in str(e.value), str(e.value)


def test_manifest_that_is_not_json_is_an_index_format_error(tmp_path):
    (tmp_path / "manifest.json").write_text('{"version": 1,')
    with pytest.raises(IndexFormatError, match="unreadable manifest: <root>: Invalid JSON"):
        Manifest.load(tmp_path)


def test_sha256_file_is_the_file_digest(tmp_path):
    data = np.random.default_rng(0).bytes(3 * 2**20 + 7)  # more than one read buffer
    (tmp_path / "blob").write_bytes(data)
    assert sha256_file(tmp_path / "blob") == hashlib.sha256(data).hexdigest()


def test_ready_index_builds_a_missing_index_once(tmp_path, data_dir, monkeypatch):
    from pipelines.build_index import ready_index

    cfg = bm25_config(tmp_path, data_dir, shards=2, limit=120)
    built = ready_index(cfg, progress=False)  # a fresh clone: nothing at index.dir yet
    assert built.num_docs == 120 and Manifest.load(cfg.index.dir) == built

    def no_rebuild(*a, **kw):
        raise AssertionError("a finished index was built again")

    monkeypatch.setattr(build_module, "build_index", no_rebuild)
    assert ready_index(cfg, progress=False) == built  # read as it is, never rebuilt or touched


def test_an_entry_point_refuses_an_index_type_it_cannot_read(tmp_path, data_dir):
    from pipelines.build_index import require_index_type

    cfg = bm25_config(tmp_path, data_dir, shards=1)
    require_index_type(cfg, ("bm25",), "reads one BM25 shard", shards=1)
    with pytest.raises(IndexFormatError, match=r"index.type='bm25' index.num_shards=1: .* flat indexes only; use "
                                               r"e.g. --config configs/retrieval_cpu.yaml"):
        require_index_type(cfg, ("flat",), "compares against exact search")
    cfg.index.num_shards = 4
    with pytest.raises(IndexFormatError, match="index.dir=indexes/bm25-1 index.type=bm25 index.num_shards=1"):
        require_index_type(cfg, ("bm25",), "reads one BM25 shard", shards=1)
