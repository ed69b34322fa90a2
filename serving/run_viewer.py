"""The run viewer's web app: one static page (`serving/static/run_viewer/`) and the JSON routes
it reads, over `pipelines.run_view.RunView`. `scripts.view_run` serves it with uvicorn on 127.0.0.1.

    GET /                                  the page
    GET /static/...                        its script and style (`serving/static`)
    GET /api/run                           what the run has: methods, datasets, steps, dev curve, what is missing
    GET /api/episodes                      evaluation episodes; ?method= &dataset= &f1_min= &f1_max= &offset= &limit=
    GET /api/episodes/{n}                  one episode in full (turns, documents, gold marked)
    GET /api/question?id=&dataset=         one question's episodes across methods (side by side)
    GET /api/steps/{step}/rollouts         a training step's rollouts; ?offset= &limit=
    GET /reward_curves.png                 the run's reward curves

A bad parameter (unknown method or step, a number that is not one, an unknown parameter) answers 404 or
422 with `{"detail": message, "error": {...}}` (`serving.errors.ApiError`'s body), never 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from pipelines.run_view import MAX_PAGE, BadRequest, NotFound, RunView, RunViewError
from serving.errors import ApiError

STATIC_DIR = Path(__file__).resolve().parent / "static"
"""The pages' static files: `run_viewer/`, `playground/` and the `common/` script both use."""


def _error(status: int, message: str) -> JSONResponse:
    err = ApiError(status, message, message.partition(":")[0] if ":" in message else None)
    return JSONResponse(err.body(), status_code=status)


def _params(request: Request, allowed: tuple[str, ...]) -> Mapping[str, str]:
    """The query parameters, refusing one the route does not take (a typo would else filter nothing)."""
    unknown = [k for k in request.query_params if k not in allowed]
    if unknown:
        raise BadRequest(f"{unknown[0]}: unknown parameter; expected only {', '.join(allowed)}")
    return request.query_params


def _number(value: str | None, name: str, default: float, kind: type = int):
    """`value` read as `kind` (int or float); `default` when absent. Raises BadRequest (a 4xx) naming `name`."""
    if value is None or value == "":
        return default
    try:
        return kind(value)
    except ValueError:
        raise BadRequest(f"{name}: got {value!r}; expected {'an integer' if kind is int else 'a number'}") from None


def make_viewer_app(view: RunView) -> FastAPI:
    """The viewer's FastAPI app over `view` (routes in the module docstring)."""
    app = FastAPI(title="searchrl run viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.exception_handler(RunViewError)
    async def _bad(request: Request, exc: RunViewError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "run_viewer" / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/api/run")
    def run(request: Request) -> dict[str, Any]:
        """What the run has (`RunView.summary`)."""
        _params(request, ())
        return view.summary()

    @app.get("/api/episodes")
    def episodes(request: Request) -> dict[str, Any]:
        """Filtered, paginated evaluation episodes (`RunView.list_episodes`)."""
        q = _params(request, ("method", "dataset", "f1_min", "f1_max", "offset", "limit"))
        return view.list_episodes(q.get("method") or None, q.get("dataset") or None,
                                  _number(q.get("f1_min"), "f1_min", 0.0, float), _number(q.get("f1_max"), "f1_max", 1.0, float),
                                  _number(q.get("offset"), "offset", 0), _number(q.get("limit"), "limit", 50))

    @app.get("/api/episodes/{n}")
    def episode(n: str, request: Request) -> dict[str, Any]:
        """One episode in full (`RunView.episode`)."""
        _params(request, ())
        return view.episode(_number(n, "episode", -1))

    @app.get("/api/question")
    def question(request: Request) -> dict[str, Any]:
        """One question's episodes by method (`RunView.question`)."""
        q = _params(request, ("id", "dataset"))
        if not q.get("id"):
            raise BadRequest("id: missing; expected the question's id (the `qid` of an episode)")
        return view.question(q["id"], q.get("dataset") or None)

    @app.get("/api/steps/{step}/rollouts")
    def rollouts(step: str, request: Request) -> dict[str, Any]:
        """A training step's rollouts (`RunView.rollouts`), at most `MAX_PAGE` a request."""
        q = _params(request, ("offset", "limit"))
        return view.rollouts(_number(step, "step", -1), _number(q.get("offset"), "offset", 0),
                             _number(q.get("limit"), "limit", min(20, MAX_PAGE)))

    @app.get("/reward_curves.png", include_in_schema=False)
    def reward_curves() -> FileResponse:
        path = view.reward_curves()
        if path is None:
            raise NotFound("reward_curves.png: the run has not written it (it is drawn when training ends)")
        return FileResponse(path, media_type="image/png")

    return app
