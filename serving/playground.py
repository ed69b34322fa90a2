"""The playground of the served searcher: `GET /` serves one static page
(`serving/static/playground/`) that asks a question over `POST /v1/search/stream` and shows the episode
turn by turn; `GET /v1/limits` tells it what a request may ask for.

Authentication: the page and its script and style are public (they hold no data and no model output; a
browser cannot send a bearer token when it opens a URL). Every call the page makes is an API call and
needs `Authorization: Bearer <SEARCHRL_API_TOKEN>` when the token is set: the page has a token field and
sends it as that header (it keeps it only in the page, never in storage).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from serving.auth import check_bearer

STATIC_DIR = Path(__file__).resolve().parent / "static"
"""The pages' static files (`playground/`, `run_viewer/`, `common/`), served under `/static`."""


def add_playground(app: FastAPI, backend: Any, settings: Any) -> None:
    """Add `GET /` (the page), `GET /static/...` (its files) and `GET /v1/limits` to the searcher's `app`.

    Args:
        backend: the `serving.api.Backend` (its `model` names what answers).
        settings: the `serving.api.ApiSettings` (its `limits` and `token`).
    """
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        """The playground page (public: the API calls it makes carry the token)."""
        return FileResponse(STATIC_DIR / "playground" / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/v1/limits")
    async def limits(request: Request) -> JSONResponse:
        """What a `/v1/search` request may ask for: `max_turns` (0..), `max_topk` (1..), `max_timeout_s`
        (seconds), `temperature` [0, 2], and the served `model`."""
        check_bearer(request.headers.get("authorization"), settings.token)
        return JSONResponse({**settings.limits.model_dump(), "temperature": [0.0, 2.0],
                             "model": backend.model.model_dump()})
