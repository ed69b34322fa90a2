"""`SearchService`: one served question = one evaluation episode (plain asyncio, no Ray).

The policy runs the training recipe through `actors.rollout.agent_loop.AgentLoop` (same prompt,
stop strings, parser, observation format and token limits as training and `pipelines.evaluate`),
at the evaluation's temperature (`eval.temperature`, greedy by default) unless the request sets one,
with the evaluation's recipe options (`Config.eval_recipe_config`), so a served answer is the answer
evaluation gives.
For a recipe whose frozen generator answers (s3), `answer_fn` answers from the selected documents
with the Fig. 12 prompt, as evaluation does. The Serve deployment (`serving.app.Searcher`) is a thin
shell around it; tests run it on a scripted engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from actors.engines.base import Engine, Sampling
from actors.rollout.agent_loop import AgentLoop, RolloutLimits, Searcher
from recipes import get_recipe
from recipes.base import ANSWER_PROMPT, Doc
from serving.errors import DeadlineError, QuestionTooLongError
from serving.schemas import (
    DocOut,
    ModelOut,
    SearchRequest,
    SearchResponse,
    Timings,
    TurnOut,
    Usage,
)

AnswerFn = Callable[[str, str, str], Awaitable[str]]
"""`await answer_fn(question, context, template)` → the frozen generator's answer."""


def _docs(docs: list[Doc] | None, show: bool) -> list[DocOut] | None:
    if docs is None or not show:
        return None
    return [DocOut(id=d.doc_id, title=d.title, text=d.text, score=d.score) for d in docs]


class SearchService:
    """Runs served episodes on one engine.

    Args:
        engine: the policy engine (`actors.engines.spec.make_engine`, or a scripted test engine).
        recipe: the recipe name (`train.recipe`); `recipe_options`: its config (`Config.recipe_config()`).
        searcher: `await searcher(query, k)` → hits (the retrieval pool, through Serve or directly).
        sampling: defaults (seed); temperature is 0 unless a request sets it.
        limits: token limits (`rollout.*`, as evaluation).
        chat: chat template (None = when the tokenizer has one; `rollout.chat`).
        model: what `model` in responses says.
        max_question_tokens: longer questions raise `QuestionTooLongError` (serve.max_question_tokens).
        answer_fn: the frozen generator, required when the recipe's generator answers (s3).
        default_timeout_s: deadline of a request that sets none (seconds).
    Raises:
        ValueError: the recipe needs a generator and `answer_fn` is None.
    """

    def __init__(self, engine: Engine, recipe: str, recipe_options: Mapping[str, Any], searcher: Searcher, *,
                 sampling: Sampling = Sampling(temperature=0.0), limits: RolloutLimits = RolloutLimits(),
                 chat: bool | None = None, model: ModelOut, max_question_tokens: int = 256,
                 answer_fn: AnswerFn | None = None, default_timeout_s: float = 300.0):
        self.engine, self.recipe_name, self.options = engine, recipe, dict(recipe_options)
        self.searcher, self.sampling, self.limits, self.chat = searcher, sampling, limits, chat
        self.model, self.max_question_tokens = model, max_question_tokens
        self.answer_fn, self.default_timeout_s = answer_fn, default_timeout_s
        if get_recipe(recipe, self.options).generator_answers and answer_fn is None:
            raise ValueError(f"recipe {recipe!r} answers with the frozen generator: pass answer_fn")

    def check_question(self, question: str) -> None:
        """Raises `QuestionTooLongError` for a question over `max_question_tokens` policy tokens."""
        n = len(self.engine.tokenizer.encode(question, add_special_tokens=False))
        if n > self.max_question_tokens:
            raise QuestionTooLongError(f"question: {n} tokens; expected at most {self.max_question_tokens} "
                                       f"(serve.max_question_tokens)")

    def _loop(self, req: SearchRequest) -> AgentLoop:
        options = dict(self.options)
        if req.max_turns is not None:
            options["max_turns"] = req.max_turns
        if req.topk is not None:
            options["topk"] = req.topk
        temperature = self.sampling.temperature if req.temperature is None else req.temperature  # eval.temperature
        sampling = replace(self.sampling, temperature=temperature,
                           seed=self.sampling.seed if req.seed is None else req.seed)
        return AgentLoop(self.engine, get_recipe(self.recipe_name, options), self.searcher, sampling, self.limits,
                         chat=self.chat, compute_reward=False)

    async def events(self, req: SearchRequest, request_id: str, received_at: float | None = None
                     ) -> AsyncIterator[tuple[str, dict]]:
        """The episode as it happens: `("turn", TurnOut dict)` per policy turn (s3's initial search
        first, action "InitialSearch"), then `("answer", SearchResponse dict)`.

        Args:
            req: the validated request. request_id: the response id.
            received_at: `time.time()` when the ingress received the request (queue time and the
                deadline count from it; None = now).
        Raises:
            QuestionTooLongError: before any work. DeadlineError: past `req.timeout_s` (or the
                default); the episode is cancelled (vLLM aborts its request).
        """
        self.check_question(req.question)
        t0 = time.time()
        received_at = t0 if received_at is None else received_at
        timeout_s = req.timeout_s or self.default_timeout_s
        loop = self._loop(req)
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(self._episode(loop, req, queue))
        turns: list[dict] = []
        try:
            while True:
                remaining = received_at + timeout_s - time.time()
                if remaining <= 0:
                    raise TimeoutError
                kind, payload = await asyncio.wait_for(queue.get(), remaining)
                if kind == "error":
                    raise payload
                if kind == "turn":
                    turns.append(payload)
                    yield "turn", payload
                else:
                    yield "answer", self._response(payload, turns, request_id, received_at, t0)
                    return
        except TimeoutError:
            raise DeadlineError(f"the search took longer than its deadline of {timeout_s:g} s (timeout_s; "
                                f"default serve.request_timeout_s)") from None
        finally:
            task.cancel()  # a client gone or a deadline passed: stop generating

    async def _episode(self, loop: AgentLoop, req: SearchRequest, queue: asyncio.Queue) -> None:
        """Run the episode and the generator's answer, putting `("turn", TurnOut dict)` as turns end,
        then `("final", (trajectory, answer))`, or `("error", exception)`."""
        shown = req.return_docs
        initial_sent = False

        def send_initial(episode) -> None:
            nonlocal initial_sent
            if not initial_sent and episode.initial_docs:
                queue.put_nowait(("turn", TurnOut(text="", action="InitialSearch", query=episode.question,
                                                  docs=_docs(episode.initial_docs, shown)).model_dump()))
            initial_sent = True

        def on_turn(episode, record) -> None:
            send_initial(episode)
            queue.put_nowait(("turn", TurnOut(text=record.text, action=record.action, query=record.query,
                                              docs=_docs(episode.turns[-1].docs, shown)).model_dump()))

        try:
            # The question is the example id: seeds are per (question, turn), so the same question
            # and seed give the same answer whatever the request id.
            traj = await loop.run_episode({"id": req.question, "question": req.question}, 0, on_turn)
            ep = traj.episode
            send_initial(ep)
            final = ep.final or loop.recipe.final_output(ep)
            answer = final.answer
            if loop.recipe.generator_answers:
                answer = await self.answer_fn(ep.question, loop.recipe.format_docs(final.selected_docs), ANSWER_PROMPT)
            queue.put_nowait(("final", (traj, answer)))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait(("error", e))

    def _response(self, payload: tuple, turns: list[dict], request_id: str, received_at: float, t0: float) -> dict:
        traj, answer = payload
        ep = traj.episode
        completion = sum(traj.loss_mask)
        usage = Usage(prompt_tokens=len(traj.prompt_ids), completion_tokens=completion,
                      observation_tokens=len(traj.loss_mask) - completion,
                      searches=ep.num_searches + int(bool(ep.initial_docs)))
        now = time.time()
        timings = Timings(total_s=now - received_at, queue_s=max(0.0, t0 - received_at),
                          generate_s=traj.timings.get("generate_s", 0.0), search_s=traj.timings.get("search_s", 0.0))
        return SearchResponse(id=request_id, model=self.model, answer=answer, finish_reason=ep.stop_reason or "stop",
                              turns=[TurnOut(**t) for t in turns], usage=usage, timings=timings).model_dump()

    async def search(self, req: SearchRequest, request_id: str, received_at: float | None = None) -> dict:
        """The whole episode as one `SearchResponse` dict (see `events` for the errors)."""
        async for kind, payload in self.events(req, request_id, received_at):
            if kind == "answer":
                return payload
        raise RuntimeError("episode ended without an answer event")  # unreachable: events ends with one

