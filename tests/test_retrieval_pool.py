"""RetrievalPool / RetrievalShard on a real index of Wikipedia passages, through Ray."""

import asyncio
import time

import numpy as np
import pytest

from actors.retrieval.encoder import EncoderSpec, TextEncoder
from actors.retrieval.index_store import Manifest, load_shard_vectors
from actors.retrieval.pool import start_retrieval_pool
from actors.retrieval.shard import RetrievalRequestError, ShardSearcher, ShardUnavailableError, merge_topk, same_topk
from configs.dtype_choice import auto_dtype
from configs.schema import RetrievalConfig
from pipelines.data import iter_qa, pack_file


@pytest.fixture(scope="module")
def questions(data_dir):
    return [ex.question for ex in iter_qa(pack_file("dev.jsonl.gz", data_dir), limit=24)]


@pytest.fixture(scope="module")
def flat_reference(small_index):
    """An unsharded exact flat index over the same vectors, with the index's query encoder."""
    import faiss

    manifest = Manifest.load(small_index)
    vectors = load_shard_vectors(small_index)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    encoder = TextEncoder(EncoderSpec(**manifest.encoder))

    def search(queries, k):
        s, i = index.search(encoder.encode_queries(queries), k)
        return merge_topk([s], [i.astype(np.int64)], k)

    return search


def light(**kw) -> RetrievalConfig:
    """Small CPU reservations so several pools fit the 4 logical CPUs of the test cluster."""
    return RetrievalConfig(pool_cpus=0.25, shard_cpus=0.05, **kw)


@pytest.fixture(scope="module")
def pool(small_index):
    return start_retrieval_pool(small_index, light(max_topk=50))


def as_arrays(results, k):
    ids = np.array([[int(h["doc_id"].split("-")[1]) for h in hits] for hits in results])
    scores = np.array([[h["score"] for h in hits] for hits in results], dtype=np.float32)
    assert ids.shape == (len(results), k)
    return scores, ids


def test_manifest_describes_the_build(small_index):
    m = Manifest.load(small_index)
    assert m.num_docs == 600 and len(m.shards) == 2
    assert [s.count for s in m.shards] == [300, 300] and m.shards[1].start == 300
    assert m.dim == 384 and m.metric == "inner_product" and m.normalized
    assert m.encoder["model"] == "all-MiniLM-L6-v2" and m.encoder["precision"] == auto_dtype(False, "fp32")
    assert all(len(h) == 64 for s in m.shards for h in s.files.values())


@pytest.mark.parametrize("k", [1, 5, 20])
def test_pool_equals_unsharded_flat_search(ray_local, pool, flat_reference, questions, k):
    """Corpus ids are `wiki-<row>`, so the global id of a hit is readable from its doc_id."""
    results = ray_local.get(pool.search.remote(questions, k))
    got_s, got_i = as_arrays(results, k)
    ref_s, ref_i = flat_reference(questions, k)
    assert same_topk(got_s, got_i, ref_s, ref_i, atol=1e-5)
    np.testing.assert_allclose(got_s, ref_s, atol=1e-5)
    assert (got_i == ref_i).mean() > 0.99  # ties on real embeddings are rare


def test_hits_carry_the_passage(ray_local, pool, data_dir):
    from pipelines.data import iter_corpus

    first = next(iter(iter_corpus(pack_file("corpus.jsonl.gz", data_dir))))
    [[hit]] = ray_local.get(pool.search.remote([first.title], 1))
    assert set(hit) == {"doc_id", "title", "text", "score"}
    assert (hit["doc_id"], hit["title"], hit["text"]) == (first.id, first.title, first.text)


def test_shard_searcher_without_ray(small_index, flat_reference, questions):
    """The plain class behind the actor: global ids, -1/-inf never appear when k <= shard size."""
    shard = ShardSearcher(str(small_index / "shard-00001"))
    encoder = TextEncoder(EncoderSpec(**Manifest.load(small_index).encoder))
    scores, ids = shard.search(encoder.encode_queries(questions[:3]), 4)
    assert scores.dtype == np.float32 and ids.dtype == np.int64 and ids.shape == (3, 4)
    assert ((ids >= 300) & (ids < 600)).all()
    assert (np.diff(scores, axis=1) <= 0).all()
    docs = shard.fetch(ids[0].tolist())
    assert [d["doc_id"] for d in docs] == [f"wiki-{g:06d}" for g in ids[0]]


def same_hits(a: list[list[dict]], b: list[list[dict]]) -> bool:
    """Per query, the same doc ids, titles and texts in order, and scores within 1e-5. Stricter than
    `same_topk`, which leaves the run of documents at the cut unchecked: here the query vectors are equal."""
    strip = lambda hits: [{k: v for k, v in h.items() if k != "score"} for h in hits]
    return len(a) == len(b) and all(
        strip(x) == strip(y) and np.allclose([h["score"] for h in x], [h["score"] for h in y], atol=1e-5)
        for x, y in zip(a, b)
    )


def test_concurrent_callers_are_micro_batched(ray_local, pool, questions):
    before = ray_local.get(pool.get_stats.remote())
    expected = ray_local.get(pool.search.remote(questions, 3))

    async def burst():
        return await asyncio.gather(*(pool.search.remote([q], 3) for q in questions))

    got = asyncio.run(burst())
    after = ray_local.get(pool.get_stats.remote())
    got = [r[0] for r in got]
    assert [[h["doc_id"] for h in r] for r in got] == [[h["doc_id"] for h in r] for r in expected]
    np.testing.assert_allclose(
        [[h["score"] for h in r] for r in got], [[h["score"] for h in r] for r in expected], atol=1e-5
    )
    new_requests = after["requests"] - before["requests"]
    new_batches = after["batches"] - before["batches"]
    assert new_requests == len(questions) + 1
    assert new_batches < new_requests  # callers shared batches


@pytest.mark.parametrize(
    "queries, k, match",
    [
        ([], 3, "non-empty list"),
        ("just a string", 3, "non-empty list"),
        (["ok", 5], 3, r"queries\[1\]"),
        (["ok", "   "], 3, r"queries\[1\]"),
        (["ok"], 0, "topk"),
        (["ok"], 51, "1..50"),
        (["ok"], True, "topk"),
    ],
)
def test_bad_queries_get_clear_errors(ray_local, pool, queries, k, match):
    with pytest.raises(RetrievalRequestError, match=match):
        ray_local.get(pool.search.remote(queries, k))


def test_too_many_queries_is_rejected(ray_local, small_index):
    small = start_retrieval_pool(small_index, light(max_queries_per_request=2))
    with pytest.raises(RetrievalRequestError, match="at most 2"):
        ray_local.get(small.search.remote(["a", "b", "c"], 1))
    ray_local.kill(small)


def test_shard_killed_mid_request_is_restarted_and_request_succeeds(ray_local, small_index, questions):
    cfg = light(max_restarts=2, max_retries=3, retry_backoff_s=0.2)
    pool = start_retrieval_pool(small_index, cfg, search_delay_s=1.5)
    expected_pool = start_retrieval_pool(small_index, cfg)
    expected = ray_local.get(expected_pool.search.remote(questions[:4], 5))
    shards = ray_local.get(pool.shard_handles.remote())
    ref = pool.search.remote(questions[:4], 5)
    deadline = time.monotonic() + 60
    while ray_local.get(pool.get_stats.remote())["encode_s"] == 0.0:  # encoded: the fan-out starts now
        assert time.monotonic() < deadline, "the request never reached the shards"
        time.sleep(0.02)
    time.sleep(0.3)  # well inside the shards' 1.5 s search
    ray_local.kill(shards[0], no_restart=False)
    assert same_hits(ray_local.get(ref, timeout=120), expected)
    stats = ray_local.get(pool.get_stats.remote())
    assert stats["retries"] >= 1 and stats["errors"] == 0
    for p in (pool, expected_pool):
        ray_local.kill(p)


def test_shard_that_stays_down_is_a_clear_error(ray_local, small_index, questions):
    pool = start_retrieval_pool(small_index, light(max_restarts=0, max_retries=1, retry_backoff_s=0.1))
    shards = ray_local.get(pool.shard_handles.remote())
    ray_local.kill(shards[1], no_restart=True)
    with pytest.raises(ShardUnavailableError, match="shard 1 .*down after 2 attempts"):
        ray_local.get(pool.search.remote(questions[:2], 3), timeout=120)
    ray_local.kill(pool)


def test_repeated_queries_reuse_cached_vectors(ray_local, pool, questions):
    """RL rollouts repeat queries; the pool encodes each distinct query once and answers the same."""
    q = [questions[5], questions[6], questions[5]]  # a repeat inside one request too
    before = ray_local.get(pool.get_stats.remote())["cache_hits"]
    first = ray_local.get(pool.search.remote(q, 3))
    second = ray_local.get(pool.search.remote(q, 3))
    hits = ray_local.get(pool.get_stats.remote())["cache_hits"] - before
    # Same documents in the same order; scores to float32 rounding: FAISS may score two equal rows
    # of one batch a last bit apart on some CPUs (CI saw 0.3019497 vs 0.3019496).
    assert same_hits(first, second) and same_hits([first[0]], [first[2]])
    assert hits >= 3  # the whole second request


def test_cache_off_still_answers(ray_local, small_index, questions):
    p = start_retrieval_pool(small_index, light(query_cache_size=0))
    a = ray_local.get(p.search.remote(questions[:2], 3))
    b = ray_local.get(p.search.remote(questions[:2], 3))
    assert ray_local.get(p.get_stats.remote())["cache_hits"] == 0
    assert [[h["doc_id"] for h in r] for r in a] == [[h["doc_id"] for h in r] for r in b]
    ray_local.kill(p)
