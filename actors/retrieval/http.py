"""HTTP front of the retrieval pool, wire-compatible with Search-R1's retrieval server.

`POST {prefix}/retrieve` with `{"queries": [str, ...], "topk": int?, "return_scores": bool?}` answers
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` (one list per query, best first;
bare document dicts when `return_scores` is false; `contents` = `'"' + title + '"\\n' + text`).
`GET {prefix}/health` answers `{"status": "ok", "num_docs", "num_shards", "index_type"}`.
Client mistakes get 4xx with `{"detail": "<field>: <problem>; expected <allowed range>"}` (the body is
checked by `actors.retrieval.request`, which checks the pool's calls too); a body over
`retrieval.max_body_bytes` gets 413 unread, one not all received within `retrieval.request_timeout_s` 408.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from ray import serve

from actors.lifecycle import actor_death_errors
from actors.retrieval.request import MalformedBodyError, RetrieveRequest, parse_body
from actors.retrieval.shard import RetrievalRequestError, ShardUnavailableError

app = FastAPI(title="searchrl retrieval", description="Search-R1 compatible retrieval route")


def search_r1_item(hit: dict, with_score: bool) -> dict:
    """A pool `Hit` as a Search-R1 result item (the document alone when `with_score` is false)."""
    doc = {"id": str(hit["doc_id"]), "contents": f'"{hit["title"]}"\n{hit["text"]}'}
    return {"document": doc, "score": float(hit["score"])} if with_score else doc


def parse_request(raw: bytes, retrieval: dict) -> RetrieveRequest:
    """Validate a `/retrieve` body with `actors.retrieval.request.parse_body` (the pool's validator too)
    against `retrieval`'s limits (a `RetrievalConfig` dict).

    Raises:
        HTTPException: 400 for a body that is not JSON, 422 for any other violation; the detail reads
            `"<field>: <problem>; expected <allowed range>"`, e.g. `"topk: got 0; expected an integer in 1..100 ..."`.
    """
    try:
        return parse_body(raw, retrieval)
    except RetrievalRequestError as e:
        raise HTTPException(400 if isinstance(e, MalformedBodyError) else 422, str(e)) from None


_CLOSE = {"Connection": "close"}  # the rest of an unread body must not be taken for the next request


async def read_body(request: Request, max_bytes: int, timeout_s: float, section: str = "retrieval") -> bytes:
    """The request body, at most `max_bytes` bytes, received within `timeout_s` seconds; error messages
    name the limits as keys of the config `section` (the searcher routes pass "serve").

    `Content-Length` is checked before anything is read; the bytes are counted while reading too (a
    chunked body has no Content-Length), and reading stops at the limit.

    Raises:
        HTTPException: 413 for a body over `max_bytes` (retrieval.max_body_bytes); 408 when the body is
            not all there after `timeout_s` (retrieval.request_timeout_s); 400 for a Content-Length
            that is not a byte count. The detail names the limit and its config key.
    """
    limit = f"expected at most {max_bytes} bytes ({section}.max_body_bytes)"
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.strip().isascii() and declared.strip().isdigit()):
            raise HTTPException(400, f"content-length: {declared[:40]!r} is not a byte count; expected an integer >= 0")
        if int(declared) > max_bytes:
            raise HTTPException(413, f"body: Content-Length is {int(declared)} bytes; {limit}", _CLOSE)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise HTTPException(413, f"body: over {max_bytes} bytes; {limit}", _CLOSE)
                chunks.append(chunk)
    except TimeoutError:
        raise HTTPException(
            408, f"body: {size} bytes received in {timeout_s} s ({section}.request_timeout_s); expected the whole "
            "body within that time", _CLOSE,
        ) from None
    return b"".join(chunks)


async def await_pool(call, timeout_s: float):
    """Await a pool actor call (an ObjectRef or any awaitable) with a timeout in seconds.

    Raises:
        HTTPException: 400 with the message of a `RetrievalRequestError`; 503 for a
            `ShardUnavailableError` (its message) or a dead pool actor (also one Ray's
            memory monitor killed); 504 after `timeout_s`.
    """
    try:
        return await asyncio.wait_for(asyncio.ensure_future(call), timeout_s)
    except TimeoutError:
        raise HTTPException(504, f"retrieval took longer than retrieval.request_timeout_s={timeout_s} s") from None
    except RetrievalRequestError as e:  # Ray re-raises the pool's error as a subclass with `.cause`
        raise HTTPException(400, str(getattr(e, "cause", e))) from None
    except ShardUnavailableError as e:
        raise HTTPException(503, str(getattr(e, "cause", e))) from None
    except actor_death_errors() as e:  # ActorUnavailableError too; OutOfMemoryError: the memory monitor's kill
        raise HTTPException(503, f"retrieval pool actor is unavailable ({type(e).__name__})") from None


async def retrieve_response(request: Request, search, retrieval: dict) -> JSONResponse:
    """The whole `/retrieve` exchange (see the module docstring): read and check the body, search,
    answer in Search-R1's format. Shared by this route and the searcher application (`serving.app`).

    Args:
        search: `search(queries, k)` → an awaitable of one hit list per query (the pool's
            `search.remote`, or a Serve handle's).
        retrieval: `RetrievalConfig` dict (limits, default topk, request_timeout_s).
    Raises:
        HTTPException: 400/408/413/422 for the request, 503/504 for the search (`read_body`,
            `parse_request`, `await_pool`).
    """
    raw = await read_body(request, retrieval["max_body_bytes"], retrieval["request_timeout_s"])
    req = parse_request(raw, retrieval)
    hits = await await_pool(search(req.queries, req.k(retrieval)), retrieval["request_timeout_s"])
    result = [[search_r1_item(h, req.return_scores) for h in row] for row in hits]
    return JSONResponse({"result": result})  # skips jsonable_encoder: plain JSON types only


_BODY_SCHEMA = {"content": {"application/json": {"schema": RetrieveRequest.model_json_schema()}}, "required": True}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
@serve.ingress(app)
class RetrievalRoute:
    """One Serve replica forwarding HTTP requests to the `RetrievalPool` actor (which micro-batches).

    Args:
        pool: the pool's actor handle (`start_retrieval_pool`).
        retrieval: `RetrievalConfig` as a dict; uses topk, max_topk, max_queries_per_request,
            max_body_bytes (a larger body answers 413) and request_timeout_s (seconds; bounds reading the
            body, 408, and the search, 504, each).
    """

    def __init__(self, pool, retrieval: dict):
        self.pool, self.cfg = pool, retrieval

    @app.post("/retrieve", openapi_extra={"requestBody": _BODY_SCHEMA})
    async def retrieve(self, request: Request) -> JSONResponse:
        """Search-R1 `/retrieve`: top-k passages per query (see the module docstring)."""
        return await retrieve_response(request, self.pool.search.remote, self.cfg)

    @app.get("/health")
    async def health(self) -> dict:
        """`{"status": "ok", "num_docs", "num_shards", "index_type"}` once every shard answers; else 503/504."""
        return {"status": "ok", **await await_pool(self.pool.ready.remote(), self.cfg["request_timeout_s"])}


def serve_retrieval(pool, serve_cfg, retrieval_cfg, name: str = "retrieval", ready_timeout_s: float = 60.0) -> str:
    """Start Ray Serve's HTTP proxy on `serve_cfg.host:serve_cfg.port`, deploy the route, and wait until
    the proxy there routes to it.

    Args:
        pool: `RetrievalPool` actor handle.
        serve_cfg: `configs.schema.ServeConfig` (host, port, route_prefix).
        retrieval_cfg: `configs.schema.RetrievalConfig` or its dict (request limits, default topk).
        name: Serve application name (`serve.delete(name)` removes it).
        ready_timeout_s: seconds to wait for the proxy on host:port to list the application.
    Returns:
        Base URL of the route, e.g. `http://127.0.0.1:8000` (route prefix included when not "/");
        append `/retrieve` or `/health`. A wildcard host (0.0.0.0, ::) is shown as 127.0.0.1.
    Raises:
        RuntimeError: no Serve proxy on host:port routes to the application (Serve already ran on this
            cluster with another host/port: HTTP options are fixed once Serve starts; deploy on that
            port or `serve.shutdown()` first); the application is deleted again.
        ValueError: an invalid route prefix (from Ray Serve).
    """
    cfg = retrieval_cfg if isinstance(retrieval_cfg, dict) else retrieval_cfg.model_dump()
    running = bool(serve.status().proxies)  # Serve already up: its proxies listen where it was started
    serve.start(http_options={"host": serve_cfg.host, "port": serve_cfg.port})
    serve.run(RetrievalRoute.bind(pool, cfg), name=name, route_prefix=serve_cfg.route_prefix)
    host = "127.0.0.1" if serve_cfg.host in ("0.0.0.0", "::", "") else serve_cfg.host
    host = f"[{host}]" if ":" in host else host
    try:
        wait_for_route(f"http://{host}:{serve_cfg.port}", name, ready_timeout_s, refused_is_final=running)
    except RuntimeError as e:
        serve.delete(name)
        raise RuntimeError(
            f"{e}; if Ray Serve already runs on this cluster with another host/port, set serve.host/serve.port "
            f"to match or shut Serve down first"
        ) from None
    return f"http://{host}:{serve_cfg.port}{serve_cfg.route_prefix.rstrip('/')}"


def wait_for_route(base_url: str, name: str, timeout_s: float, refused_is_final: bool = False) -> None:
    """Wait until the Serve proxy at `base_url` lists application `name` in its route table (`GET /-/routes`,
    Serve's public `{route_prefix: application}` endpoint), polling every 0.25 s.

    Args:
        base_url: `http://host:port` of a Serve proxy.
        name: the Serve application name.
        timeout_s: seconds to wait in all.
        refused_is_final: fail at the first refused connection (the proxy is known to be up elsewhere).
    Raises:
        RuntimeError: not listed within `timeout_s`, or the connection was refused with `refused_is_final`.
    """
    deadline, problem = time.monotonic() + timeout_s, "no answer"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to the proxy, no http_proxy
    while True:
        try:
            with opener.open(f"{base_url}/-/routes", timeout=min(5.0, timeout_s)) as r:
                routes = json.loads(r.read())
            if isinstance(routes, dict) and name in routes.values():
                return
            problem = f"routes {routes!r:.200}"
        except urllib.error.HTTPError as e:  # 503 until the proxy has its route table
            problem = f"HTTP {e.code}"
        except (OSError, ValueError) as e:  # refused, reset, timed out; not JSON
            problem = f"{type(e).__name__}: {e}"
            if refused_is_final and isinstance(getattr(e, "reason", e), ConnectionRefusedError):
                break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    raise RuntimeError(f"no Ray Serve proxy at {base_url} routes to application {name!r} ({problem})")
