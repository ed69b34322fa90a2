"""The searcher's HTTP routes (FastAPI), over a `Backend` that runs the episodes.

    GET  /                       the playground page (`serving.playground`; public, its API calls carry the token)
    GET  /health                 200 {"status": "ok", ...} when every deployment answers, else 503 (no auth)
    GET  /v1/models              the served model (OpenAI list format)
    GET  /v1/limits              what a search request may ask for (max_turns, max_topk, max_timeout_s, temperature)
    POST /v1/search              one question → answer, finish_reason, turns with documents, usage, timings
    POST /v1/search/stream       the same as server-sent events: `turn` per turn, `answer`, `done`
    POST /v1/chat/completions    OpenAI-compatible (plain and `stream: true`); the search trace in `search`
    POST /retrieve               Search-R1's retrieval route, unchanged (`actors.retrieval.http`)

Errors answer `{"detail", "error": {message, type, param, code}}` (`serving.errors.ApiError`): 401
without the bearer token (`serving.auth`), 413 for a body over serve.max_body_bytes, 408 for a body
slower than serve.request_timeout_s, 422 naming the bad field (`serving.schemas.parse_json`), 404 for
another model id, 503 with Retry-After for a full queue or a deployment that is not up, 504 past the
request's deadline. A stream that fails after its first event ends with an `error` event instead.
`serving.app` builds this app inside the Serve ingress with a backend of deployment handles; tests
build it over a scripted engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from actors.retrieval.http import read_body
from serving import openai_compat
from serving.auth import check_bearer
from serving.errors import (
    ApiError,
    DeadlineError,
    OverloadedError,
    QuestionTooLongError,
    UnavailableError,
)
from serving.playground import add_playground
from serving.schemas import (
    ChatCompletionRequest,
    Limits,
    ModelOut,
    SearchRequest,
    parse_json,
)

log = logging.getLogger(__name__)

_GRACE_S = 2.0  # the replica enforces the deadline; the ingress waits this much longer before it gives up


class Backend(Protocol):
    """What the routes call; `serving.app.HandleBackend` (Serve deployments) or a test double.
    `received_at` is `time.time()` at the ingress; errors are those of `serving.errors`."""

    model: ModelOut

    async def search(self, req: SearchRequest, request_id: str, received_at: float) -> dict: ...

    def events(self, req: SearchRequest, request_id: str, received_at: float) -> AsyncIterator[tuple[str, dict]]: ...

    async def health(self) -> dict: ...

    async def retrieve(self, request: Request) -> Response: ...


@dataclass(frozen=True)
class ApiSettings:
    """Limits of the routes: body size (bytes), default/largest deadline (s), request limits, the
    bearer token (None = open) and Retry-After of a 503 (s)."""

    max_body_bytes: int = 65536
    request_timeout_s: float = 300.0
    limits: Limits = Limits()
    token: str | None = None
    retry_after_s: int = 2


def _message(exc: BaseException) -> str:
    """The error's own message (a replica's exception arrives wrapped by Ray: its `cause` is the original)."""
    cause = getattr(exc, "cause", None)
    return str(cause if isinstance(cause, BaseException) else exc)


def as_api_error(exc: BaseException, retry_after_s: int) -> ApiError:
    """The HTTP answer for an exception of a route or a replica (Ray re-raises a replica's exception
    as a subclass of it, so isinstance works across the handle). Anything unexpected is a 500 that
    names the exception type (and is logged with its traceback)."""
    retry = {"Retry-After": str(retry_after_s)}
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QuestionTooLongError):
        return ApiError(422, _message(exc), "question")
    if isinstance(exc, (DeadlineError, asyncio.TimeoutError)):
        return ApiError(504, _message(exc) or "the request ran past its deadline (timeout_s)", "timeout_s")
    if isinstance(exc, OverloadedError):
        return ApiError(503, f"every searcher replica is busy and the queue is full ({_message(exc)}); retry later",
                        None, retry)
    if isinstance(exc, UnavailableError):
        return ApiError(503, f"{_message(exc)}; retry later", None, retry)
    if isinstance(exc, HTTPException):
        return ApiError(exc.status_code, str(exc.detail), "body", exc.headers)
    log.error("unexpected error in a searcher route", exc_info=exc)
    return ApiError(500, f"internal error ({type(exc).__name__}); see the server log")


def _error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def make_api(backend: Backend, settings: ApiSettings = ApiSettings()) -> FastAPI:
    """The FastAPI app of the searcher routes (see the module docstring) over `backend`."""
    app = FastAPI(title="searchrl searcher", description="A trained search agent with its retriever")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    async def body_of(request: Request, model: type) -> Any:
        """Auth, then the body read within the limits and validated against `model`."""
        check_bearer(request.headers.get("authorization"), settings.token)
        try:
            raw = await read_body(request, settings.max_body_bytes, settings.request_timeout_s, section="serve")
        except HTTPException as e:
            raise ApiError(e.status_code, str(e.detail), "body", e.headers) from None
        return parse_json(model, raw, settings.limits)

    async def run(req: SearchRequest, request_id: str, received_at: float) -> dict:
        """`backend.search` within the request's deadline (plus a grace the replica should not need)."""
        timeout_s = req.timeout_s or settings.request_timeout_s
        try:
            return await asyncio.wait_for(backend.search(req, request_id, received_at), timeout_s + _GRACE_S)
        except Exception as e:  # noqa: BLE001 - every failure becomes a clear HTTP answer
            raise as_api_error(e, settings.retry_after_s) from None

    async def first_and_rest(req: SearchRequest, request_id: str, received_at: float):
        """The stream's first event, awaited here so that a request that fails before any event (full
        queue, too long, deadline) gets its HTTP status; then an iterator over the rest that ends with
        an `("error", ApiError)` pair instead of raising."""
        agen = backend.events(req, request_id, received_at)
        timeout_s = req.timeout_s or settings.request_timeout_s
        try:
            first = await asyncio.wait_for(anext(agen), timeout_s + _GRACE_S)
        except Exception as e:  # noqa: BLE001
            await agen.aclose()
            raise as_api_error(e, settings.retry_after_s) from None

        async def rest():
            try:
                yield first
                async for item in agen:
                    yield item
            except Exception as e:  # noqa: BLE001 - headers are sent: report in the stream
                yield "error", as_api_error(e, settings.retry_after_s)
            finally:
                await agen.aclose()

        return rest()

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 when every deployment answers its readiness check, else 503 naming the one that did not."""
        try:
            return JSONResponse({"status": "ok", "model": backend.model.model_dump(), **await backend.health()})
        except Exception as e:  # noqa: BLE001
            err = as_api_error(e if isinstance(e, UnavailableError) else UnavailableError(f"not ready: {e}"),
                               settings.retry_after_s)
            return _error_response(err)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        """The served model in OpenAI's list format, with checkpoint, step and recipe."""
        check_bearer(request.headers.get("authorization"), settings.token)
        return JSONResponse(openai_compat.model_list(backend.model))

    @app.post("/v1/search")
    async def search(request: Request) -> JSONResponse:
        """One question → `serving.schemas.SearchResponse`."""
        received_at = time.time()
        req = await body_of(request, SearchRequest)
        return JSONResponse(await run(req, f"srch-{uuid.uuid4().hex}", received_at))

    @app.post("/v1/search/stream")
    async def search_stream(request: Request) -> StreamingResponse:
        """Server-sent events: `turn` (a TurnOut) per turn, `answer` (the SearchResponse), `done`; or `error`."""
        received_at = time.time()
        req = await body_of(request, SearchRequest)
        events = await first_and_rest(req, f"srch-{uuid.uuid4().hex}", received_at)

        async def sse():
            async for kind, payload in events:
                data = payload.body() if isinstance(payload, ApiError) else payload
                yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"
                if kind == "error":
                    return
            yield "event: done\ndata: {}\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        """OpenAI chat completions: the last user message is the question, the answer the content."""
        received_at = time.time()
        body = await body_of(request, ChatCompletionRequest)
        if body.model != backend.model.name:
            raise ApiError(404, f"model: {body.model!r} is not served here; expected {backend.model.name!r} "
                                f"(GET /v1/models)", "model")
        req = body.options()
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        if not body.stream:
            return JSONResponse(openai_compat.completion(await run(req, request_id, received_at)))
        events = await first_and_rest(req, request_id, received_at)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = openai_compat.chunks(events, request_id, backend.model.name, include_usage=usage)
        return StreamingResponse(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        """Search-R1's `/retrieve` (see `actors.retrieval.http`): same body, limits and answers."""
        check_bearer(request.headers.get("authorization"), settings.token)
        return await backend.retrieve(request)

    add_playground(app, backend, settings)
    return app
