"""The Search-R1 compatible HTTP route (Ray Serve) in front of a real 2-shard retrieval pool."""

import asyncio
import socket
import time

import httpx
import pytest

from configs.schema import RetrievalConfig, ServeConfig

APP = "retrieval-http-test"
QUERIES = ["who wrote the declaration of independence", "largest planet in the solar system"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(ray_local, small_index):
    """(pool handle, httpx client on the route's base URL, RetrievalConfig); the app is deleted afterwards."""
    from ray import serve

    from actors.retrieval.http import serve_retrieval
    from actors.retrieval.pool import start_retrieval_pool

    rcfg = RetrievalConfig(topk=4, max_topk=20, max_queries_per_request=5, batch_wait_ms=1.0, pool_cpus=0.5)
    pool = start_retrieval_pool(small_index, rcfg)
    url = serve_retrieval(pool, ServeConfig(host="127.0.0.1", port=free_port()), rcfg, name=APP)
    assert url.startswith("http://127.0.0.1:")
    client = httpx.Client(base_url=url, timeout=30.0)
    deadline = time.monotonic() + 60
    while True:  # the HTTP proxy may need a few seconds after serve.run returns
        try:
            if client.get("/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "route did not answer /health within 60 s"
        time.sleep(0.5)
    yield pool, client, rcfg
    client.close()
    serve.delete(APP)
    ray_local.kill(pool)


def test_round_trip_matches_pool(served):
    pool, client, _ = served
    import ray

    r = client.post("/retrieve", json={"queries": QUERIES, "topk": 3})
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    expected = ray.get(pool.search.remote(QUERIES, 3))
    assert len(result) == 2 and all(len(row) == 3 for row in result)
    for row, hits in zip(result, expected):
        assert [item["document"]["id"] for item in row] == [h["doc_id"] for h in hits]
        assert [item["score"] for item in row] == pytest.approx([h["score"] for h in hits], abs=1e-6)
        for item, h in zip(row, hits):
            assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
            assert item["document"]["contents"] == f'"{h["title"]}"\n{h["text"]}'
        assert [item["score"] for item in row] == sorted((item["score"] for item in row), reverse=True)


def test_without_scores_and_default_topk(served):
    _, client, rcfg = served
    r = client.post("/retrieve", json={"queries": QUERIES[:1], "topk": 2, "return_scores": False})
    assert r.status_code == 200, r.text
    (row,) = r.json()["result"]
    assert len(row) == 2 and all(set(doc) == {"id", "contents"} for doc in row)
    assert row[0]["contents"].startswith('"') and "\n" in row[0]["contents"]

    r = client.post("/retrieve", json={"queries": QUERIES})
    assert r.status_code == 200, r.text
    assert [len(row) for row in r.json()["result"]] == [rcfg.topk] * 2


@pytest.mark.parametrize(
    "body, field, allowed",
    [
        ({"queries": []}, "queries", "1..5"),
        ({"queries": ["q"] * 6}, "queries", "1..5"),
        ({"queries": ["q", "   "]}, "queries[1]", "non-empty strings"),
        ({"queries": ["q", 5]}, "queries[1]", "strings"),
        ({"queries": "just one string"}, "queries", "list"),
        ({"queries": ["q"], "topk": 0}, "topk", "1..20"),
        ({"queries": ["q"], "topk": 21}, "topk", "1..20"),
        ({"queries": ["q"], "topk": "3"}, "topk", "1..20"),
        ({"queries": ["q"], "return_scores": "yes"}, "return_scores", "true or false"),
        ({"topk": 3}, "queries", "1..5"),
        ({"queries": ["q"], "top_k": 3}, "top_k", "queries, topk, return_scores"),
        (["q"], "body", "JSON object"),
        (b'{"queries": ["q"', "body", "JSON object"),
    ],
)
def test_bad_requests_are_4xx_naming_the_field(served, body, field, allowed):
    _, client, _ = served
    if isinstance(body, bytes):
        r = client.post("/retrieve", content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.post("/retrieve", json=body)
    assert r.status_code in (400, 422), (r.status_code, r.text)
    detail = r.json()["detail"]
    assert detail.startswith(f"{field}: ") and allowed in detail, detail


def test_health(served):
    _, client, _ = served
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "num_docs": 600, "num_shards": 2, "index_type": "flat"}


def _pool_errors():
    from ray.exceptions import RayActorError, RayTaskError

    from actors.retrieval.shard import RetrievalRequestError, ShardUnavailableError

    def remote(cause):  # how an actor's exception reaches the caller: a RayTaskError subclass of it
        return RayTaskError("search", "Traceback (most recent call last): ...", cause).as_instanceof_cause()

    return [
        (remote(RetrievalRequestError("k (topk) must be an integer in 1..100, got 0")), 400, "k (topk) must be"),
        (remote(ShardUnavailableError("shard 1 (shard-00001) is down")), 503, "shard 1 (shard-00001) is down"),
        (RayActorError(), 503, "retrieval pool actor is unavailable"),
        (None, 504, "retrieval.request_timeout_s=0.05 s"),
    ]


@pytest.mark.parametrize("error, status, message", _pool_errors())
def test_pool_errors_map_to_http_status(error, status, message):
    from fastapi import HTTPException

    from actors.retrieval.http import await_pool

    async def call():
        if error is None:
            await asyncio.sleep(5)
        raise error

    with pytest.raises(HTTPException) as info:
        asyncio.run(await_pool(call(), 0.05))
    assert info.value.status_code == status and message in info.value.detail, info.value.detail
