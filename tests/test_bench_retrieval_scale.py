"""`scripts.bench.retrieval_scale`: its pieces without Ray (exact search in chunks, re-ranking, drawn vectors,
the doc store at scale, option errors), and one small run through the pool (slow: it starts Ray)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from actors.retrieval.index_store import DocStore, shard_ranges
from actors.retrieval.request import check_vector_search
from actors.retrieval.shard import RetrievalRequestError, merge_topk, rerank_exact, same_topk
from configs.schema import RetrievalConfig
from scripts.bench import retrieval_scale as bench
from scripts.bench import retrieval_scale_data as data


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def clustered(rng, n, d, centres=20):
    """Unit vectors around `centres` random directions: real embeddings' kind of structure."""
    c = unit(rng, centres, d)
    return unit(rng, n, d) * 0.4 + c[rng.integers(0, centres, n)]


def test_exact_topk_in_chunks_is_brute_force_over_all_parts(tmp_path):
    rng = np.random.default_rng(0)
    x, q = unit(rng, 3000, 32), unit(rng, 40, 32)
    paths = data.write_vectors(tmp_path, shard_ranges(3000, 3), 32, lambda s, c: x[s : s + c], block_rows=700)
    parts = data.open_vectors(paths)
    assert [p.shape for p in parts] == [(1000, 32)] * 3 and parts[0].dtype == np.float16
    stored = np.concatenate([np.asarray(p, np.float32) for p in parts])
    scores, ids = data.exact_topk(parts, q, 10, chunk_rows=333)
    full = q @ stored.T
    ref_i = np.argsort(-full, axis=1, kind="stable")[:, :10]
    ref_s = np.take_along_axis(full, ref_i, axis=1)
    assert same_topk(scores, ids, ref_s.astype(np.float32), ref_i.astype(np.int64), atol=1e-5)
    assert data.recall_at_k(ids, ids, scores, parts, q) == 1.0
    worse = ids.copy()
    worse[:, 9] = ids[:, -1] + 1  # mostly not among the top 10
    assert data.recall_at_k(worse, ids, scores, parts, q) < 1.0
    np.testing.assert_array_equal(data.gather_rows(parts, ids[:2]), stored[ids[:2]])


def test_rerank_exact_orders_candidates_by_true_score():
    rng = np.random.default_rng(1)
    x, q = unit(rng, 500, 16), unit(rng, 7, 16)
    cand = np.stack([rng.choice(500, 30, replace=False) for _ in range(7)]).astype(np.int64)
    cand[0, 25:] = -1  # fewer candidates for one query
    scores, rows = rerank_exact(x.astype(np.float16), q, cand, 5, chunk=3)
    for i in range(7):
        c = cand[i][cand[i] >= 0]
        true = x[c].astype(np.float16).astype(np.float32) @ q[i]
        assert list(rows[i]) == list(c[np.argsort(-true, kind="stable")[:5]])
        np.testing.assert_allclose(scores[i], np.sort(true)[::-1][:5], atol=1e-5)
    s, r = rerank_exact(x, q[:1], cand[:1, :3], 5)  # k above the candidates: padded as merge_topk pads
    assert list(r[0, 3:]) == [-1, -1] and np.isneginf(s[0, 3:]).all()
    ref = merge_topk([q[:1] @ x[cand[0, :3]].T], [cand[:1, :3]], 5)
    np.testing.assert_array_equal(r, ref[1])


def test_drawn_vectors_keep_inner_products_and_do_not_depend_on_shards(tmp_path):
    rng = np.random.default_rng(2)
    real = clustered(rng, 2000, 24)
    real /= np.linalg.norm(real, axis=1, keepdims=True)
    mix = data.fit_mixture(real, 40, 48, seed=0)
    assert mix.normalize and mix.dim == 48 and len(mix.weights) == 40 and np.isclose(mix.weights.sum(), 1)
    lifted = mix.to_dim(real[:50])
    np.testing.assert_allclose(lifted @ lifted.T, real[:50] @ real[:50].T, atol=1e-5)  # an isometry
    draws = mix.draw(1000, [0, 7])
    np.testing.assert_allclose(np.linalg.norm(draws, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(draws, mix.draw(1000, [0, 7]))
    # drawn vectors sit near the real ones as real vectors do (their structure, not isotropic noise)
    assert (draws @ lifted.T).max(axis=1).mean() > 0.5 > np.abs(unit(rng, 1000, 48) @ lifted.T).max(axis=1).mean()
    one = data.open_vectors(data.write_vectors(tmp_path / "a", shard_ranges(5000, 1), 48, lambda s, c: mix.draw(c, [0, s]), 1024))
    three = data.open_vectors(data.write_vectors(tmp_path / "b", shard_ranges(5000, 3), 48, lambda s, c: mix.draw(c, [0, s]), 1024))
    np.testing.assert_array_equal(one[0], np.concatenate(three))
    assert "mixture, 40 components" in mix.describe() and "inner products kept" in mix.describe()


def test_doc_store_at_scale_returns_the_texts_of_the_right_ids(tmp_path, data_dir):
    source = data.PassageSource.from_pack(data_dir, sample=300)
    info = data.fill_docstore(tmp_path / "docs.parquet", source, 5000, row_group_size=256)
    assert info["rows"] == 5000 and info["bytes"] > 5000 * 300
    store = DocStore(tmp_path / "docs.parquet")
    rows = [4999, 0, 1234, 256, 255, 1234]
    ids, titles, texts = zip(*(tuple(x[0] for x in source.rows(r, 1)) for r in rows))
    got = store.get(rows)
    assert [d["doc_id"] for d in got] == list(ids) == [f"syn-{r:09d}" for r in rows]
    assert [d["text"] for d in got] == list(texts) and [d["title"] for d in got] == list(titles)
    words = [len(t.split()) for t in source.rows(0, 5000)[2]]
    assert max(words) == 100 and 0.8 < np.mean(np.array(words) == 100) < 0.95  # wiki-18's 100-word blocks
    m = data.measure_docstore(str(tmp_path / "docs.parquet"), 50, 10)
    assert m["rows"] == 5000 and m["ids_right"] and 0 < m["p50_ms"] <= m["p99_ms"]
    assert m["mem_after"]["rss"] > 0 and set(m["mem_after"]) == {"pid", "rss", "anon", "file"}


def test_vector_queries_are_checked_like_text_queries():
    cfg = RetrievalConfig(max_topk=50, max_queries_per_request=4).model_dump()
    arr, k = check_vector_search([[1, 0, 0]], 5, 3, cfg)
    assert arr.dtype == np.float32 and arr.shape == (1, 3) and k == 5
    for vectors, k, dim, msg in [(np.zeros((1, 4)), 5, 3, r"vectors: got shape \[1, 4\]; expected a float array \[n, 3\]"),
                                 (np.zeros((5, 3)), 5, 3, r"with n in 1..4 \(retrieval.max_queries_per_request\)"),
                                 (np.array([[np.nan, 0, 0]]), 5, 3, "NaN or inf"),
                                 (np.array([["a", "b", "c"]]), 5, 3, "dtype"),
                                 (np.zeros((1, 3)), 51, 3, r"topk: .*1..50"),
                                 (np.zeros((1, 3)), 5, None, "BM25")]:
        with pytest.raises(RetrievalRequestError, match=msg):
            check_vector_search(vectors, k, dim, cfg)


@pytest.mark.parametrize("argv, msg", [
    (["--indexes", "flat16,hnsw"], "--indexes: 'flat16,hnsw'"),
    (["--vectors", "fake"], "--vectors"),
    (["--ivfpq", "IVF16,PQ7", "--dim", "64"], "PQ7 must divide the dimension 64"),
    (["--ivfpq", "OPQ16,IVF16,PQ16"], "--ivfpq: 'OPQ16,IVF16,PQ16'"),
    (["--callers", "1,0"], "--callers"),
    (["--n", "3", "--shards", "4"], "fewer than --shards 4"),
    (["--vectors", "none"], "--docstore N"),
    (["--fit-from", "/nonexistent.npy"], "--fit-from"),
])
def test_bad_options_exit_2_with_an_error_line(argv, msg, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and msg in err[-1]


def test_small_run_through_the_pool_reports_every_column(ray_local, tmp_path, capsys):
    """N=5,000 drawn 64-d vectors in 2 shards: exact flat search finds the exact top-10, re-ranking IVF-PQ's
    candidates (memory-mapped fp16 or faiss RFlat) beats IVF-PQ alone, and every table has all its columns."""
    rng = np.random.default_rng(3)
    np.save(tmp_path / "real.npy", clustered(rng, 3000, 32))
    out = tmp_path / "report.json"
    argv = ["--vectors", "drawn", "--fit-from", str(tmp_path / "real.npy"), "--n", "5000", "--dim", "64", "--shards", "2",
            "--ivfpq", "IVF16,PQ16x4", "--nprobe", "2", "--k-factor", "10", "--queries", "200", "--latency-queries", "32",
            "--mixture", "50", "--train-size", "2000", "--docstore", "3000", "--docstore-fetches", "100",
            "--work", str(tmp_path / "work"), "--out", str(out)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    (sec,) = report["sections"]
    assert (sec["vectors"], sec["n"], sec["dim"], sec["shards"], sec["skipped"]) == ("drawn", 5000, 64, 2, [])
    recall = {r["index"]: r["recall@10"] for r in sec["search"]}
    assert recall["flat16"] == 1.0
    assert recall["ivfpq-mmap"] >= recall["ivfpq"] and recall["ivfpq-rflat"] >= recall["ivfpq"]
    assert recall["ivfpq-mmap"] > recall["ivfpq"] + 0.1 and abs(recall["ivfpq-mmap"] - recall["ivfpq-rflat"]) < 0.01
    columns = bench.search_columns([1, 16, 64])
    assert {r["index"] for r in sec["search"]} == set(bench.VARIANTS)
    for r in sec["search"]:
        assert all(r.get(c) is not None for c in columns if c not in ("nprobe", "k_factor", "exact10_in_topk")), r
        assert r["route"] == "pool vectors" and r["p50_ms@64"] <= r["p99_ms@64"] and r["qps@64"] > 0
    assert next(r for r in sec["search"] if r["index"] == "ivfpq")["exact10_in_topk"].endswith(" in 100")
    for r in sec["build"]:
        assert all(r.get(c) is not None for c in bench.BUILD_COLUMNS), r
    totals = {r["index"]: r for r in sec["build"] if r["shard"] == "total"}
    assert set(totals) == set(bench.VARIANTS) and totals["flat16"]["rows"] == 5000
    assert totals["ivfpq-mmap"]["index_mib"] > totals["ivfpq"]["index_mib"] and totals["flat16"]["rss_mib"] > 100
    assert all(report["docstore"].get(c) is not None for c in bench.DOCSTORE_COLUMNS) and report["docstore"]["ids_right"]
    for header in (bench.BUILD_COLUMNS, columns, bench.DOCSTORE_COLUMNS):
        assert "| " + " | ".join(header) + " |" in printed
    assert "### drawn vectors: N=5,000, d=64, 2 shards" in printed and "Gaussian mixture" in printed
    assert not (tmp_path / "work" / "drawn").exists()  # removed without --keep


def test_pool_over_an_index_built_from_vectors(ray_local, tmp_path):
    """`build_vector_shard` + `finish_index` make an index with no encoder: the pool answers `search_vectors` with the
    exact top-k (as one flat search would), refuses text, and a shard re-ranks by its refine file once k_factor > 1."""
    from actors.retrieval.index_store import new_faiss_index, write_docs
    from actors.retrieval.pool import start_retrieval_pool
    from pipelines.build_index import build_vector_shard, finish_index

    rng = np.random.default_rng(4)
    x, q = unit(rng, 600, 16), unit(rng, 9, 16)
    paths = data.write_vectors(tmp_path / "vec", shard_ranges(600, 2), 16, lambda s, c: x[s : s + c])
    parts = data.open_vectors(paths)
    raws = []
    for i, ((start, count), part) in enumerate(zip(shard_ranges(600, 2), parts)):
        ids = [f"syn-{r:09d}" for r in range(start, start + count)]
        raws.append(build_vector_shard(tmp_path / "idx", i, start, part, new_faiss_index(16, "IVF4,PQ4x4", {}), "IVF4,PQ4x4",
                                       {"nprobe": 4}, lambda p, ids=ids: write_docs(p, ids, ids, ids, 64),
                                       refine_from=paths[i], chunk_rows=100))
    m = finish_index(tmp_path / "idx", raws, index_type="ivf_pq", encoder=None, normalized=True,
                     index={"type": "ivf_pq"}, corpus={}, build_seconds=0.0)
    assert m.num_docs == 600 and m.dim == 16 and m.encoder is None and raws[1]["build_s"]["add"] >= 0
    pool = start_retrieval_pool(tmp_path / "idx", RetrievalConfig(pool_cpus=0.25, shard_cpus=0.05))
    try:
        exact_s, exact_i = data.exact_topk(parts, q, 5)

        def found():
            return np.array([[int(h["doc_id"][4:]) for h in hits] for hits in ray_local.get(pool.search_vectors.remote(q, 5))])

        pq_only = data.recall_at_k(found(), exact_i, exact_s, parts, q)
        shards = ray_local.get(pool.shard_handles.remote())
        ray_local.get([s.set_search_params.remote({"k_factor": 100}) for s in shards])  # re-rank every candidate
        got = found()
        assert data.recall_at_k(got, exact_i, exact_s, parts, q) == 1.0 > pq_only
        np.testing.assert_array_equal(got, exact_i)
        with pytest.raises(RetrievalRequestError, match="no encoder; call search_vectors"):
            ray_local.get(pool.search.remote(["who wrote hamlet?"], 5))
        with pytest.raises(RetrievalRequestError, match=r"vectors: got shape \[9, 8\]"):
            ray_local.get(pool.search_vectors.remote(q[:, :8], 5))
    finally:
        ray_local.kill(pool)
