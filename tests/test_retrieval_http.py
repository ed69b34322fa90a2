"""The Search-R1 compatible HTTP route (Ray Serve) in front of a real 2-shard retrieval pool."""

import asyncio
import json
import re
import socket
import time

import httpx
import numpy as np
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


@pytest.fixture(scope="module")
def limited(served):
    """(pool, client, RetrievalConfig) of a second app on the same Serve proxy, route `/limited`, with a
    4 KiB body limit and a 3 s request timeout."""
    from ray import serve

    from actors.retrieval.http import serve_retrieval

    pool, client, rcfg = served
    cfg = RetrievalConfig(**(rcfg.model_dump() | {"max_body_bytes": 4096, "request_timeout_s": 3.0}))
    port = client.base_url.port
    serve_cfg = ServeConfig(host="127.0.0.1", port=port, route_prefix="/limited")
    url = serve_retrieval(pool, serve_cfg, cfg, name=APP + "-lim")
    assert url == f"http://127.0.0.1:{port}/limited"
    yield pool, client, cfg
    serve.delete(APP + "-lim")


def _requests(pool) -> int:
    import ray

    return ray.get(pool.get_stats.remote())["requests"]


def test_body_at_the_limit_is_served(limited):
    pool, client, cfg = limited
    body = json.dumps({"queries": QUERIES[:1], "topk": 2}).encode()
    body += b" " * (cfg.max_body_bytes - len(body))  # JSON allows trailing whitespace: exactly at the limit
    r = client.post("/limited/retrieve", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert len(r.json()["result"][0]) == 2


@pytest.mark.parametrize("declared", [True, False])
def test_oversized_body_is_413_unparsed_and_unsearched(limited, declared):
    """Over max_body_bytes: with Content-Length (checked before reading) and chunked (counted while reading).
    The body is not even JSON, so 413 (not 400) shows it was never parsed; the pool saw no request."""
    pool, client, cfg = limited
    before = _requests(pool)
    chunks = [b"x" * 1024] * 8  # 8 KiB > 4 KiB
    content = b"".join(chunks) if declared else iter(chunks)  # a generator: no Content-Length, chunked
    r = client.post("/limited/retrieve", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.request.headers.get("content-length") == ("8192" if declared else None)
    detail = r.json()["detail"]
    assert detail.startswith("body: ") and "4096 bytes" in detail and "retrieval.max_body_bytes" in detail, detail
    assert _requests(pool) == before


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP/1.1 response (status line, headers, Content-Length body) read from `sock`."""
    answer = b""
    while True:
        head, sep, body = answer.partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if sep and length and len(body) >= int(length[1]):
            return answer
        data = sock.recv(65536)
        if not data:
            return answer
        answer += data


def test_slow_body_is_408_within_the_timeout(limited):
    """A client that declares 200 bytes and sends 20 gets 408 after request_timeout_s (3 s), not a hung worker."""
    _, client, cfg = limited
    head = b"POST /limited/retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", client.base_url.port), timeout=60) as sock:
        sock.sendall(head + b'Content-Length: 200\r\n\r\n{"queries": ["who w')
        answer = _read_response(sock)
    elapsed = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert cfg.request_timeout_s <= elapsed < cfg.request_timeout_s + 30, elapsed
    detail = json.loads(answer.split(b"\r\n\r\n", 1)[1])["detail"]
    assert "retrieval.request_timeout_s" in detail, detail


def test_serve_on_another_port_is_refused(served):
    """Serve's HTTP options are fixed once it runs: asking for another port fails fast and leaves no app."""
    from ray import serve

    from actors.retrieval.http import serve_retrieval

    pool, _, rcfg = served
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="shut Serve down first"):
        serve_retrieval(pool, ServeConfig(host="127.0.0.1", port=free_port(), route_prefix="/o"), rcfg, name="other")
    assert time.monotonic() - t0 < 30
    assert "other" not in serve.status().applications


@pytest.mark.parametrize(
    "queries, k",
    [([], 3), (["q"] * 6, 3), (["q", "  "], 3), (["q", 5], 3), ("one", 3), (["q"], 0), (["q"], 21), (["q"], "3")],
)
def test_pool_and_route_share_one_validator(queries, k):
    """The pool's check of `search(queries, k)` and the route's check of the same JSON body say the same."""
    from actors.retrieval.request import check_search, parse_body
    from actors.retrieval.shard import RetrievalRequestError

    cfg = RetrievalConfig(topk=4, max_topk=20, max_queries_per_request=5).model_dump()
    with pytest.raises(RetrievalRequestError) as pool_error:
        check_search(queries, k, cfg)
    with pytest.raises(RetrievalRequestError) as route_error:
        parse_body(json.dumps({"queries": queries, "topk": k}), cfg)
    pool_msg, route_msg = str(pool_error.value), str(route_error.value)
    # the same field, problem and allowed range (pydantic words a JSON array and a Python list differently)
    assert pool_msg.split(": ")[0] == route_msg.split(": ")[0]
    assert pool_msg.rsplit("; expected ", 1)[1] == route_msg.rsplit("; expected ", 1)[1]
    assert pool_msg == route_msg or queries == "one"
    assert check_search(("q", "r"), np.int64(3), cfg) == (["q", "r"], 3)
    assert check_search(["q"], None, cfg) == (["q"], 4)


def test_health(served):
    _, client, _ = served
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "num_docs": 600, "num_shards": 2, "index_type": "flat"}


def _pool_errors():
    from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError

    from actors.retrieval.shard import RetrievalRequestError, ShardUnavailableError

    def remote(cause):  # how an actor's exception reaches the caller: a RayTaskError subclass of it
        return RayTaskError("search", "Traceback (most recent call last): ...", cause).as_instanceof_cause()

    return [
        (remote(RetrievalRequestError("k (topk) must be an integer in 1..100, got 0")), 400, "k (topk) must be"),
        (remote(ShardUnavailableError("shard 1 (shard-00001) is down")), 503, "shard 1 (shard-00001) is down"),
        (RayActorError(), 503, "retrieval pool actor is unavailable"),
        (OutOfMemoryError("killed by the memory monitor"), 503, "unavailable (OutOfMemoryError)"),
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


def _request(headers: dict, chunks: list[bytes], delay_s: float = 0.0):
    """A Starlette request whose body arrives in `chunks`, `delay_s` seconds apart (no server)."""
    from starlette.requests import Request

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        await asyncio.sleep(delay_s)
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/retrieve", "headers": [
        (k.lower().encode(), v.encode()) for k, v in headers.items()]}
    return Request(scope, receive)


@pytest.mark.parametrize(
    "headers, chunks, delay_s, status, text",
    [
        ({"Content-Length": "100"}, [b"x" * 60, b"y" * 40], 0.0, None, ""),  # exactly the limit
        ({"Content-Length": "101"}, [b"x" * 101], 0.0, 413, "Content-Length is 101 bytes"),
        ({}, [b"x" * 60, b"y" * 60], 0.0, 413, "over 100 bytes"),  # chunked: counted while reading
        ({"Content-Length": "10"}, [b"x" * 60, b"y" * 60], 0.0, 413, "over 100 bytes"),  # a lying Content-Length
        ({"Content-Length": "abc"}, [b"x"], 0.0, 400, "content-length: 'abc'"),
        ({}, [b"x", b"y", b"z"], 0.2, 408, "retrieval.request_timeout_s"),  # 3 slow chunks, 0.3 s timeout
    ],
)
def test_read_body_limits(headers, chunks, delay_s, status, text):
    from fastapi import HTTPException

    from actors.retrieval.http import read_body

    request = _request(headers, chunks, delay_s)
    if status is None:
        assert asyncio.run(read_body(request, 100, 0.3)) == b"".join(chunks)
        return
    with pytest.raises(HTTPException) as info:
        asyncio.run(read_body(request, 100, 0.3))
    assert info.value.status_code == status and text in info.value.detail, info.value.detail
    if status != 400:
        assert ("retrieval.max_body_bytes" if status == 413 else "retrieval.request_timeout_s") in info.value.detail
