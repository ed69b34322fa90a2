"""Frozen LLMs that score episodes: the s3 generator (Fig. 12), the judge (Fig. 13), R-Search's
cross-family verifier (Table 5). Each is a `FrozenLLM` on the shared engine layer: greedy
(temperature 0), batched by the engine across concurrent calls, with an LRU cache keyed by
(model, prompt) so repeated prompts — the s3 naive-RAG baseline — are generated once, and optionally an
on-disk `AnswerStore` shared across methods and runs (`frozen.answer_cache`).

Recipes' rewards are synchronous and call the `recipes.base.Scorer` interface; `ThreadScorer`
(in-process, for an engine on an asyncio loop) and `ActorScorer` (Ray actor handles) adapt.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from actors.engines.base import Engine, Sampling
from actors.frozen.answer_store import AnswerStore, answer_key, model_fingerprint
from recipes.base import ANSWER_PROMPT, strip_answer_cue
from recipes.metrics import acc_l_prompt, judge_prompt, parse_judge, parse_true_false

TAIL_TOKENS = 160  # kept from the end of an over-long prompt: the question and the answer cue
# A base model's completion after "Answer:" starts with a newline about half the time (measured: 33 of
# 64 dev answers of Gemma 3 270M), and a reply that stopped there was empty. A completion that stops on
# a blank line goes on from it (the same greedy tokens, up to LEADING_BLANK_LINES times), so the reply is
# the first non-empty line, as the naive-RAG baseline reads its own (recipes.baselines). Stopping at
# "\n\n" instead may run on past the answer line up to max_answer_tokens (91 ms a token on hf here).
LEADING_BLANK_LINES = 2


def answer_prompt_ids(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """Token ids of `prompt` as a frozen model reads it, before any cut: a chat model's user turn with the
    generation prompt; a base model's text with the "Answer:" cue after it (BOS added as the tokenizer does).
    Also what a reader fine-tuned to serve as the frozen generator trains on (`pipelines.reader_sft`)."""
    if chat:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                                  add_generation_prompt=True, return_dict=False))
    return list(tokenizer.encode(prompt + "\nAnswer:", add_special_tokens=True))


class FrozenLLM:
    """A frozen model answering prompts greedily.

    Args:
        engine: any `Engine`; its tokenizer renders chat prompts.
        model_name: cache key part (a changed model never hits old entries).
        chat: wrap prompts in the chat template (instruction-tuned models); False = completion
            text with an "Answer:" cue (base models such as Gemma 3 270M).
        max_answer_tokens: new tokens per answer (count).
        cache_size: cached prompts (entries); 0 = no cache.
        store: answers on disk shared across methods, runs and restarts (`AnswerStore`), looked up after the
            in-memory cache by the rendered prompt's token ids and `identity()`; None = none.
    """

    def __init__(self, engine: Engine, model_name: str, chat: bool | None = None, max_answer_tokens: int = 64,
                 cache_size: int = 100_000, store: AnswerStore | None = None):
        self.engine = engine
        self.model_name = model_name
        tok = engine.tokenizer
        self.chat = bool(getattr(tok, "chat_template", None)) if chat is None else chat
        self.sampling = Sampling(max_tokens=max_answer_tokens, temperature=0.0, stop=() if self.chat else ("\n",))
        self.cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self.cache_size = cache_size
        self.stats = {"calls": 0, "cache_hits": 0, "generated": 0}
        self.store = store
        self._identity: dict[str, Any] | None = None
        self._inflight: dict[tuple[str, str], asyncio.Future] = {}  # concurrent identical prompts share one generation

    def render(self, prompt: str) -> list[int]:
        """Token ids of the prompt as this model reads it, cut in the middle to fit the engine's
        context (`max_model_len` − answer tokens): the instructions at the start and the question
        with the answer cue at the end stay; the documents in between lose their tail."""
        ids = answer_prompt_ids(self.engine.tokenizer, prompt, self.chat)
        limit = (getattr(self.engine, "max_model_len", None) or 0) - self.sampling.max_tokens
        if 0 < limit < len(ids):
            tail = min(TAIL_TOKENS, limit // 2)
            ids = ids[: limit - tail] + ids[-tail:]
            self.stats["truncated"] = self.stats.get("truncated", 0) + 1
        return ids

    def identity(self) -> dict[str, Any]:
        """Everything besides the prompt's token ids that decides an answer: the model's weight files, the engine
        backend and dtype, the sampling settings and how a reply is read (`answer_store.answer_key`)."""
        if self._identity is None:
            engine = self.engine
            path = getattr(engine, "model_path", None) or getattr(engine, "model", None)
            dtype = getattr(engine, "model_dtype", None)
            if dtype is None and hasattr(getattr(engine, "model", None), "dtype"):
                dtype = engine.model.dtype  # transformers backend: the loaded model's
            self._identity = {
                "model": model_fingerprint(path) if isinstance(path, str) else self.model_name,
                "name": self.model_name, "backend": type(engine).__name__, "dtype": str(dtype),
                "chat": self.chat, "max_tokens": self.sampling.max_tokens, "temperature": self.sampling.temperature,
                "stop": list(self.sampling.stop), "blank_lines": 0 if self.chat else LEADING_BLANK_LINES,
            }
        return self._identity

    async def _generate(self, ids: list[int]) -> str:
        """Greedy text after `ids`, stripped; a completion that ends on a leading blank line continues
        from it (the generated tokens appended) within the `max_answer_tokens` budget. A base model's
        reply loses a repeated "Answer:" cue, as the naive-RAG baseline's does."""
        budget, rounds = self.sampling.max_tokens, 0 if self.chat else LEADING_BLANK_LINES
        while True:
            gen = (await self.engine.generate(ids, replace(self.sampling, max_tokens=budget)))[0]
            text = self.engine.tokenizer.decode(gen.token_ids, skip_special_tokens=True).strip()
            budget -= len(gen.token_ids)
            if not self.chat:  # the cue repeated, as naive RAG's recipe reads it
                text = strip_answer_cue(text)
            if text or rounds == 0 or budget <= 0 or gen.stop_reason != "\n":
                return text
            ids, rounds = ids + list(gen.token_ids), rounds - 1

    async def complete(self, prompt: str) -> str:
        """The model's greedy answer to `prompt` (stripped; a base model's: its first non-empty line),
        from the in-memory cache, else the answer store, when seen before."""
        self.stats["calls"] += 1
        key = (self.model_name, prompt)
        if key in self.cache:
            self.cache.move_to_end(key)
            self.stats["cache_hits"] += 1
            return self.cache[key]
        if key in self._inflight:
            self.stats["cache_hits"] += 1
            return await asyncio.shield(self._inflight[key])
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            ids = self.render(prompt)
            stored = None
            if self.store is not None:
                store_key = answer_key(self.identity(), ids)
                stored = self.store.get(store_key)
            if stored is not None:
                text = stored
                self.stats["store_hits"] = self.stats.get("store_hits", 0) + 1
            else:
                text = await self._generate(ids)
                if self.store is not None:
                    self.store.put(store_key, text)
            future.set_result(text)
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # mark retrieved: waiters re-raise it, nobody else has to
            raise
        finally:
            del self._inflight[key]
        if stored is None:
            self.stats["generated"] += 1
        if self.cache_size:
            self.cache[key] = text
            if len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return text

    async def generate_answer(self, question: str, context: str, template: str = ANSWER_PROMPT) -> str:
        """Answer `question` from `context` with `template` (s3 Fig. 12 by default; R-Search Table 5)."""
        return await self.complete(template.format(question=question, context=context))

    async def judge(self, response: str, golden_answers: Sequence[str]) -> bool:
        """s3 judge_check (Fig. 13): does the response contain one of the gold answers?"""
        return parse_judge(await self.complete(judge_prompt(response, list(golden_answers))))

    async def acc_l(self, question: str, golden_answers: Sequence[str], prediction: str) -> bool:
        """R1-Searcher's ACC_L (§3.1): does `prediction` fully align with the gold answer? (the paper's Judge Prompt)"""
        return parse_true_false(await self.complete(acc_l_prompt(question, list(golden_answers), prediction)))


class ThreadScorer:
    """The synchronous `Scorer` interface over `FrozenLLM`s running on an asyncio loop in another
    thread (call it from worker threads, e.g. `asyncio.to_thread(recipe.reward, ...)`).

    `judge_llm` defaults to the generator.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, generator: FrozenLLM, judge_llm: FrozenLLM | None = None,
                 timeout_s: float = 600.0):
        self.loop, self.generator, self.judge_llm, self.timeout_s = loop, generator, judge_llm or generator, timeout_s

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s)

    def generate_answer(self, question: str, context: str, template: str = ANSWER_PROMPT) -> str:
        """Blocking `FrozenLLM.generate_answer` on the generator (s3 Fig. 12 template by default).

        Raises:
            TimeoutError: no answer within `timeout_s` seconds; otherwise what the generation raises.
        """
        return self._run(self.generator.generate_answer(question, context, template))

    def judge(self, response: str, golden_answers: Sequence[str]) -> bool:
        """Blocking `FrozenLLM.judge` on the judge LLM (s3 Fig. 13): does `response` contain a gold answer?

        Raises:
            TimeoutError: no verdict within `timeout_s` seconds; otherwise what the generation raises.
        """
        return self._run(self.judge_llm.judge(response, golden_answers))


class ActorScorer:
    """The synchronous `Scorer` interface over FrozenLLM Ray actors (`FrozenLLMWorker` handles).

    A call whose actor died or is restarting (`actors.lifecycle.actor_death_errors`: Ray's `RayActorError` /
    `ActorUnavailableError`, or `OutOfMemoryError` when Ray's memory monitor killed it) is
    retried `retries` times, `backoff_s` * 2**attempt seconds apart (answers are greedy and cached, so
    a retry gives the same answer); `on_retry()` is called before each retry (fault counters).
    """

    def __init__(self, generator: Any, judge_llm: Any | None = None, timeout_s: float = 600.0, retries: int = 3,
                 backoff_s: float = 1.0, on_retry: Any = None):
        self.generator, self.judge_llm, self.timeout_s = generator, judge_llm or generator, timeout_s
        self.retries, self.backoff_s, self.on_retry = retries, backoff_s, on_retry

    def _call(self, method: Any, *args: Any) -> Any:
        import logging
        import time

        import ray

        from actors.lifecycle import actor_death_errors

        for attempt in range(self.retries + 1):
            try:
                return ray.get(method.remote(*args), timeout=self.timeout_s)
            except actor_death_errors() as e:
                if attempt == self.retries:
                    raise
                logging.getLogger(__name__).warning("frozen LLM call failed (%s); retry %d/%d", type(e).__name__,
                                                    attempt + 1, self.retries)
                if self.on_retry is not None:
                    self.on_retry()
                time.sleep(self.backoff_s * 2**attempt)

    def generate_answer(self, question: str, context: str, template: str = ANSWER_PROMPT) -> str:
        """Blocking `generate_answer` on the generator actor (s3 Fig. 12 template by default).

        Raises:
            ray.exceptions.GetTimeoutError: no answer within `timeout_s` seconds.
            RayActorError: the actor stayed down through every retry.
        """
        return self._call(self.generator.generate_answer, question, context, template)

    def judge(self, response: str, golden_answers: Sequence[str]) -> bool:
        """Blocking `judge` on the judge actor (s3 Fig. 13): does `response` contain a gold answer?

        Raises:
            ray.exceptions.GetTimeoutError: no verdict within `timeout_s` seconds.
            RayActorError: the actor stayed down through every retry.
        """
        return self._call(self.judge_llm.judge, response, list(golden_answers))
