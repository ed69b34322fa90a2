"""The searcher application on Ray Serve: deployments composed with handles, and `build_app`.

    Ingress (FastAPI, `serving.api`) ──► Searcher × serve.replicas (policy engine + AgentLoop)
        │                                    │ searches             │ s3: answer from the selected documents
        └── /retrieve ──────────────────► Retrieval (RetrievalPool actors)   Generator (frozen LLM)

- `Searcher`: one policy engine per replica (`engine_spec(cfg, "policy", model)`, vLLM on CPU or
  GPU), running `serving.searcher.SearchService`; its concurrent episodes share the engine's
  continuous batching. `serve.max_ongoing_requests`, `serve.max_queued_requests` and
  `serve.replicas` / `serve.autoscaling_config` configure it.
- `Retrieval`: owns a `RetrievalPool` (`start_retrieval_pool`, as training and evaluation).
- `Generator`: a `FrozenLLMWorker` (`frozen.*`), only for recipes whose generator answers (s3).
- `Ingress`: the routes; it maps Serve's back-pressure to 503 + Retry-After and a dead replica to 503.

`build_app({"checkpoint": PATH, "config": FILE?, "overrides": "k=v k=v"?})` is the application
builder for `serve run serving.app:build_app checkpoint=PATH`, `serve deploy` and a KubeRay
RayService (`import_path: serving.app:build_app`); `scripts.serve` runs the same app.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)

from actors.engines.base import Sampling
from actors.engines.spec import EngineHolder, engine_spec
from actors.frozen.worker import FrozenLLMWorker
from actors.lifecycle import actor_death_errors
from actors.rollout.agent_loop import RolloutLimits
from serving.api import ApiSettings, make_api
from serving.auth import TOKEN_ENV, token_from_env
from serving.checkpoint import Served
from serving.errors import OverloadedError, UnavailableError
from serving.schemas import Limits, ModelOut, SearchRequest
from serving.searcher import SearchService

_READY_TIMEOUT_S = 10.0  # /health waits this long for each deployment's answer

# Stopping the app (`serve.shutdown()`, a scale-down, an upgrade). Serve stops the deployments one after another
# (seen: Ingress, then Searcher, then Retrieval) and `serve.shutdown()` gives up on the controller after 30 s; a
# replica still running at its deadline is killed, and an engine killed mid-shutdown leaves its 160 MB
# `psm_*` segment in /dev/shm. Serve's defaults (20 s each, drained in 2 s polls) can sum past 30 s with
# requests in flight. An engine's own shutdown takes ~5 s (vLLM gives its engine core 5 s, then kills it), so:
_STOP_POLL = {"graceful_shutdown_wait_loop_s": 0.5}  # in-flight requests polled every 0.5 s, not 2 s
_STOP_ENGINE = {**_STOP_POLL, "graceful_shutdown_timeout_s": 10.0}  # the engine's shutdown (s) fits in it
_STOP_QUICK = {**_STOP_POLL, "graceful_shutdown_timeout_s": 3.0}  # no engine: short requests only (s)
# a replica died (also by Ray's memory monitor: OutOfMemoryError) or none is up
_LOST = (*actor_death_errors(), DeploymentUnavailableError, ReplicaUnavailableError)


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000, **_STOP_QUICK)
class Retrieval:
    """The retrieval pool of the app (its shard and encoder actors die with this replica, and a
    restarted replica starts them again). Args: the index directory and `RetrievalConfig` dict."""

    def __init__(self, index_dir: str, retrieval: dict):
        from actors.retrieval.pool import start_retrieval_pool

        self.pool = start_retrieval_pool(index_dir, retrieval)

    async def search(self, queries: list[str], k: int) -> list[list[dict]]:
        """Top-k hits per query (the pool's `search`; its errors pass through)."""
        return await self.pool.search.remote(queries, k)

    async def ready(self) -> dict:
        """The pool's `ready()` (num_docs, num_shards, index_type) once every shard answers."""
        return await self.pool.ready.remote()


@serve.deployment(max_ongoing_requests=1000, **_STOP_ENGINE)
class Generator(FrozenLLMWorker):
    """The frozen generator (s3 answers from the selected documents), as in evaluation."""

    async def __del__(self):
        await self.shutdown()  # Serve calls it when the replica stops: free the engine


@serve.deployment(**_STOP_ENGINE)
class Searcher:
    """A policy engine running served episodes (`SearchService`).

    Args:
        spec: the policy `EngineSpec` as a dict. recipe, recipe_options: `train.recipe` and
            `Config.eval_recipe_config()`. sampling, limits: `Sampling` / `RolloutLimits` fields (evaluation's:
            `pipelines.evaluate.eval_sampling`, `Config.searcher_limits`).
        chat: `rollout.chat`. model: `ModelOut` fields. max_question_tokens, default_timeout_s:
            from `serve.*`. retrieval, generator: handles of the other deployments (generator None
            unless the recipe's generator answers).
    """

    async def __init__(self, spec: dict, recipe: str, recipe_options: dict, sampling: dict, limits: dict,
                       chat: bool | None, model: dict, max_question_tokens: int, default_timeout_s: float,
                       retrieval: Any, generator: Any = None):
        self.holder = EngineHolder(spec)
        engine = await self.holder.get()  # loaded before the replica counts as up

        async def search(query: str, k: int):
            return (await retrieval.search.remote([query], k))[0]

        async def answer(question: str, context: str, template: str) -> str:
            return await generator.generate_answer.remote(question, context, template)

        self.service = SearchService(
            engine, recipe, recipe_options, search, sampling=Sampling(**sampling), limits=RolloutLimits(**limits),
            chat=chat, model=ModelOut(**model), max_question_tokens=max_question_tokens,
            answer_fn=answer if generator is not None else None, default_timeout_s=default_timeout_s)

    async def search(self, req: SearchRequest, request_id: str, received_at: float) -> dict:
        """`SearchService.search` (raises its errors: too long, deadline)."""
        return await self.service.search(req, request_id, received_at)

    async def events(self, req: SearchRequest, request_id: str, received_at: float):
        """`SearchService.events`, streamed through the handle."""
        async for item in self.service.events(req, request_id, received_at):
            yield item

    async def ready(self) -> dict:
        """The engine's model and weight version, and this replica's process id (for operators)."""
        engine = await self.holder.get()
        return {"model": self.holder.spec.model, "weight_version": engine.weight_version, "pid": os.getpid()}

    async def __del__(self):
        await self.holder.shutdown()  # vLLM leaves /dev/shm segments otherwise


class HandleBackend:
    """`serving.api.Backend` over the deployments' handles: Serve's back-pressure becomes
    `OverloadedError` (503), a lost replica `UnavailableError` (503)."""

    def __init__(self, searcher: Any, retrieval: Any, generator: Any, model: ModelOut, retrieval_cfg: dict):
        self.searcher, self.retrieval, self.generator = searcher, retrieval, generator
        self.model, self.retrieval_cfg = model, retrieval_cfg

    async def search(self, req, request_id, received_at):
        response = self.searcher.search.remote(req, request_id, received_at)
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()  # past the ingress deadline: stop the episode in the replica
            raise
        except BackPressureError as e:
            raise OverloadedError(str(e).splitlines()[0]) from None
        except _LOST as e:
            raise UnavailableError(f"the searcher replica was lost ({type(e).__name__})") from None

    async def events(self, req, request_id, received_at):
        stream = self.searcher.options(stream=True).events.remote(req, request_id, received_at)
        try:
            async for item in stream:
                yield tuple(item)
        except BackPressureError as e:
            raise OverloadedError(str(e).splitlines()[0]) from None
        except _LOST as e:
            raise UnavailableError(f"the searcher replica was lost ({type(e).__name__})") from None
        finally:
            stream.cancel()  # the client left or the stream ended: nothing more to generate

    async def health(self) -> dict:
        checks = {"searcher": self.searcher, "retrieval": self.retrieval}
        if self.generator is not None:
            checks["generator"] = self.generator
        out = {}
        for name, handle in checks.items():
            try:
                out[name] = await asyncio.wait_for(handle.ready.remote(), _READY_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - any failure means not ready
                raise UnavailableError(f"{name}: not ready ({type(e).__name__})") from None
        return {"deployments": out}

    async def retrieve(self, request):
        from actors.retrieval.http import retrieve_response

        return await retrieve_response(request, self.retrieval.search.remote, self.retrieval_cfg)


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000, **_STOP_QUICK)
@serve.ingress()
class Ingress:
    """The HTTP routes (`serving.api.make_api`) over `HandleBackend`. `settings`: `ApiSettings`
    fields but the token, which the replica reads from its environment (`SEARCHRL_API_TOKEN`)."""

    def __init__(self, searcher: Any, retrieval: Any, generator: Any, model: dict, settings: dict, retrieval_cfg: dict):
        self.backend = HandleBackend(searcher, retrieval, generator, ModelOut(**model), retrieval_cfg)
        self.settings = ApiSettings(**{**settings, "limits": Limits(**settings["limits"])}, token=token_from_env())

    def __serve_build_asgi_app__(self):
        return make_api(self.backend, self.settings)


def compose(cfg: Any, served: Served) -> Any:
    """The application (`serve.run(app)`) serving `served` under `cfg` (`configs.Config`).

    Raises:
        ValueError: an unknown recipe or option (checked when the config loads, so not in practice).
    """
    from recipes import get_recipe

    sv, ro, fr = cfg.serve, cfg.rollout, cfg.frozen
    from pipelines.evaluate import eval_frozen_config, eval_sampling

    # One resolved set of episode settings with evaluation (pipelines.evaluate.plan_methods), so a served
    # answer is the answer evaluation gives: recipe options with eval.topk / eval.max_turns / the last
    # stage's options, eval.temperature / top_p, the same token limits and the generator on eval.frozen_backend.
    options = cfg.eval_recipe_config()
    recipe = get_recipe(cfg.train.recipe, options)
    model = ModelOut(name=sv.model_name or served.name, checkpoint=served.checkpoint, step=served.step,
                     recipe=cfg.train.recipe).model_dump()
    rcfg = cfg.retrieval.model_dump()
    retrieval = Retrieval.bind(cfg.index.dir, rcfg)
    generator = None
    if recipe.generator_answers:
        generator = Generator.options(ray_actor_options={"num_cpus": fr.num_cpus, "num_gpus": fr.num_gpus}).bind(
            engine_spec(eval_frozen_config(cfg), "generator").model_dump(), max_answer_tokens=fr.max_answer_tokens)
    scale: dict[str, Any] = ({"autoscaling_config": sv.autoscaling_config} if sv.autoscaling_config
                             else {"num_replicas": sv.replicas})
    searcher = Searcher.options(
        ray_actor_options={"num_cpus": ro.cpus_per_worker, "num_gpus": ro.gpus_per_worker},
        max_ongoing_requests=sv.max_ongoing_requests, max_queued_requests=sv.max_queued_requests, **scale,
    ).bind(engine_spec(cfg, "policy", served.model).model_dump(), cfg.train.recipe, options,
           eval_sampling(cfg), cfg.searcher_limits(), ro.chat, model, sv.max_question_tokens,
           sv.request_timeout_s, retrieval, generator)
    settings = {"max_body_bytes": sv.max_body_bytes, "request_timeout_s": sv.request_timeout_s,
                "retry_after_s": sv.retry_after_s,
                "limits": {"max_turns": sv.max_turns, "max_topk": cfg.retrieval.max_topk,
                           "max_timeout_s": sv.request_timeout_s}}
    token = token_from_env()
    ingress = Ingress.options(ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": {TOKEN_ENV: token}}}) \
        if token else Ingress  # the token reaches the replica wherever it runs (a joined cluster too)
    return ingress.bind(searcher, retrieval, generator, model, settings, rcfg)


def build_app(args: Mapping[str, Any]) -> Any:
    """Application builder (`serve run serving.app:build_app checkpoint=PATH [config=FILE]
    [overrides="serve.replicas=2 retrieval.topk=5"]`, `serve deploy`, KubeRay `import_path`).

    Raises:
        CheckpointError, ConfigError: a PATH or config that cannot be served (see `load_serving`).
    """
    from serving.config import load_serving

    overrides = args.get("overrides") or []
    overrides = overrides.split() if isinstance(overrides, str) else list(overrides)
    served, cfg = load_serving(str(args["checkpoint"]), args.get("config"), overrides)
    return compose(cfg, served)
