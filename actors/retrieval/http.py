"""HTTP front of the retrieval pool, wire-compatible with Search-R1's retrieval server.

`POST {prefix}/retrieve` with `{"queries": [str, ...], "topk": int?, "return_scores": bool?}` answers
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` (one list per query, best first;
bare document dicts when `return_scores` is false; `contents` = `'"' + title + '"\\n' + text`).
`GET {prefix}/health` answers `{"status": "ok", "num_docs", "num_shards", "index_type"}`.
Client mistakes get 4xx with `{"detail": "<field>: <problem>; expected <allowed range>"}`.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from ray import serve
from ray.exceptions import RayActorError

from actors.retrieval.shard import RetrievalRequestError, ShardUnavailableError

app = FastAPI(title="searchrl retrieval", description="Search-R1 compatible retrieval route")


class RetrieveRequest(BaseModel):
    """Body of `POST /retrieve`. `topk` None means `retrieval.topk`. Strict: no type coercion."""

    model_config = ConfigDict(strict=True, extra="forbid")
    queries: list[str]
    topk: int | None = None
    return_scores: bool = True


def search_r1_item(hit: dict, with_score: bool) -> dict:
    """A pool `Hit` as a Search-R1 result item (the document alone when `with_score` is false)."""
    doc = {"id": str(hit["doc_id"]), "contents": f'"{hit["title"]}"\n{hit["text"]}'}
    return {"document": doc, "score": float(hit["score"])} if with_score else doc


def _loc(loc: tuple) -> str:
    """Pydantic error location as `queries[2]`; the empty location is the whole body."""
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc)) or "body"


def parse_request(raw: bytes, retrieval: dict) -> RetrieveRequest:
    """Validate a `/retrieve` body against the schema and `retrieval`'s limits (a `RetrievalConfig` dict).

    Raises:
        HTTPException: 400 for a body that is not JSON, 422 for any other violation; the detail reads
            `"<field>: <problem>; expected <allowed range>"`, e.g. `"topk: got 0; expected an integer in 1..100, ..."`.
    """
    expected = {
        "body": 'a JSON object {"queries": [str, ...], "topk": int, "return_scores": bool}',
        "queries": f"a list of 1..{retrieval['max_queries_per_request']} non-empty strings",
        "topk": f"an integer in 1..{retrieval['max_topk']}, or omitted for {retrieval['topk']}",
        "return_scores": "true or false",
    }

    def reject(status: int, where: str, problem: str) -> HTTPException:
        """HTTPException `status` with detail `"<where>: <problem>; expected <allowed>"` (allowed: by field)."""
        allowed = expected.get(where.split("[")[0].split(".")[0], "only the fields queries, topk, return_scores")
        return HTTPException(status, f"{where}: {problem}; expected {allowed}")

    try:
        req = RetrieveRequest.model_validate_json(raw)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]  # the first problem, named precisely
        more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
        raise reject(400 if err["type"] == "json_invalid" else 422, _loc(err["loc"]), err["msg"] + more) from None
    if not 1 <= len(req.queries) <= retrieval["max_queries_per_request"]:
        raise reject(422, "queries", f"got {len(req.queries)} queries")
    blank = next((i for i, q in enumerate(req.queries) if not q.strip()), None)
    if blank is not None:
        raise reject(422, f"queries[{blank}]", "is empty or whitespace")
    if req.topk is not None and not 1 <= req.topk <= retrieval["max_topk"]:
        raise reject(422, "topk", f"got {req.topk}")
    return req


async def await_pool(call, timeout_s: float):
    """Await a pool actor call (an ObjectRef or any awaitable) with a timeout in seconds.

    Raises:
        HTTPException: 400 with the message of a `RetrievalRequestError`; 503 for a
            `ShardUnavailableError` (its message) or a dead pool actor; 504 after `timeout_s`.
    """
    try:
        return await asyncio.wait_for(asyncio.ensure_future(call), timeout_s)
    except TimeoutError:
        raise HTTPException(504, f"retrieval took longer than retrieval.request_timeout_s={timeout_s} s") from None
    except RetrievalRequestError as e:  # Ray re-raises the pool's error as a subclass with `.cause`
        raise HTTPException(400, str(getattr(e, "cause", e))) from None
    except ShardUnavailableError as e:
        raise HTTPException(503, str(getattr(e, "cause", e))) from None
    except RayActorError as e:  # includes ActorUnavailableError
        raise HTTPException(503, f"retrieval pool actor is unavailable ({type(e).__name__})") from None


_BODY_SCHEMA = {"content": {"application/json": {"schema": RetrieveRequest.model_json_schema()}}, "required": True}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
@serve.ingress(app)
class RetrievalRoute:
    """One Serve replica forwarding HTTP requests to the `RetrievalPool` actor (which micro-batches).

    Args:
        pool: the pool's actor handle (`start_retrieval_pool`).
        retrieval: `RetrievalConfig` as a dict; uses topk, max_topk, max_queries_per_request and
            request_timeout_s (seconds; a slower search answers 504).
    """

    def __init__(self, pool, retrieval: dict):
        self.pool, self.cfg = pool, retrieval

    @app.post("/retrieve", openapi_extra={"requestBody": _BODY_SCHEMA})
    async def retrieve(self, request: Request) -> JSONResponse:
        """Search-R1 `/retrieve`: top-k passages per query (see the module docstring)."""
        req = parse_request(await request.body(), self.cfg)
        k = req.topk if req.topk is not None else self.cfg["topk"]
        hits = await await_pool(self.pool.search.remote(req.queries, k), self.cfg["request_timeout_s"])
        result = [[search_r1_item(h, req.return_scores) for h in row] for row in hits]
        return JSONResponse({"result": result})  # skips jsonable_encoder: plain JSON types only

    @app.get("/health")
    async def health(self) -> dict:
        """`{"status": "ok", "num_docs", "num_shards", "index_type"}` once every shard answers; else 503/504."""
        return {"status": "ok", **await await_pool(self.pool.ready.remote(), self.cfg["request_timeout_s"])}


def serve_retrieval(pool, serve_cfg, retrieval_cfg, name: str = "retrieval") -> str:
    """Start Ray Serve's HTTP proxy on `serve_cfg.host:serve_cfg.port` and deploy the route.

    Args:
        pool: `RetrievalPool` actor handle.
        serve_cfg: `configs.schema.ServeConfig` (host, port, route_prefix).
        retrieval_cfg: `configs.schema.RetrievalConfig` or its dict (request limits, default topk).
        name: Serve application name (`serve.delete(name)` removes it).
    Returns:
        Base URL of the route, e.g. `http://127.0.0.1:8000` (route prefix included when not "/");
        append `/retrieve` or `/health`. A wildcard host (0.0.0.0, ::) is shown as 127.0.0.1.
    Raises:
        RuntimeError: Serve already runs on this cluster with another host/port (HTTP options are
            fixed once Serve starts; deploy on that port or `serve.shutdown()` first).
        ValueError: an invalid route prefix (from Ray Serve).
    """
    cfg = retrieval_cfg if isinstance(retrieval_cfg, dict) else retrieval_cfg.model_dump()
    serve.start(http_options={"host": serve_cfg.host, "port": serve_cfg.port})
    from ray.serve.context import _get_global_client  # no public accessor for the running HTTP options

    http = _get_global_client().http_config
    if (http.host, http.port) != (serve_cfg.host, serve_cfg.port):
        raise RuntimeError(
            f"Ray Serve already listens on {http.host}:{http.port}, not {serve_cfg.host}:{serve_cfg.port}; "
            f"set serve.host/serve.port to match or shut Serve down first"
        )
    serve.run(RetrievalRoute.bind(pool, cfg), name=name, route_prefix=serve_cfg.route_prefix)
    host = "127.0.0.1" if serve_cfg.host in ("0.0.0.0", "::", "") else serve_cfg.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{serve_cfg.port}{serve_cfg.route_prefix.rstrip('/')}"
