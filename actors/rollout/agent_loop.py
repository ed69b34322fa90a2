"""The multi-turn agent loop: engine + recipe + retrieval → token-exact trajectories.

Each episode advances on its own coroutine (generate until a stop string → the recipe parses the
action → search → append the observation → generate again), so a fast trajectory never waits for
the slowest one; the engine batches whatever requests are in flight. `run_batch_turn_sync` is the
turn-synchronous loop of the seed papers' code (all generate, then all search), kept as the
benchmark baseline.

Token exactness: the response holds the engine's own ids; observation and feedback text is
tokenized once and appended with loss mask 0; nothing is re-tokenized. Plain asyncio, no Ray: the
RolloutWorker actor (`actors.rollout.worker`) is a thin shell around `AgentLoop`.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from actors.engines.base import Engine, Sampling
from actors.rollout.trajectory import Trajectory, TurnRecord
from recipes.base import Doc, Episode, Recipe, Scorer, Search, as_docs
from recipes.expert import MAX_EXPERT_QUERIES
from recipes.search_metrics import doc_holds_answer, search_record, shown_docs

Searcher = Callable[[str, int], Awaitable[Sequence[Mapping[str, Any] | Doc]]]
"""`await searcher(query, k)` → top-k hits (dicts with doc_id, title, text, score) for one query."""

TRUNCATION_MARKER = " …[truncated]"


@dataclass(frozen=True)
class RolloutLimits:
    """Length limits of an episode (all in tokens). Defaults from s3 Appendix A.1: an 8,000-token
    context with at most 1,400 tokens of documents per turn, and Search-R1's 500-token turns."""

    max_new_tokens_per_turn: int = 500
    max_observation_tokens: int = 1400
    max_total_tokens: int = 8000

    def __post_init__(self) -> None:
        for name in ("max_new_tokens_per_turn", "max_observation_tokens", "max_total_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout limits: {name} must be >= 1, got {getattr(self, name)}")


def example_fields(example: Any) -> tuple[str, str, list[str], str, dict]:
    """(id, question, golden_answers, dataset, meta) of a QAExample-like object or a dict."""
    get = example.get if isinstance(example, Mapping) else lambda k, d=None: getattr(example, k, d)
    return (str(get("id", "")), str(get("question", "")), list(get("golden_answers", ()) or ()),
            str(get("dataset", "") or ""), dict(get("meta", None) or {}))


def group_id_of(example: Any) -> str:
    """The GRPO group id of an example: "<dataset>/<id>" (ids repeat across datasets), or the id."""
    qid, _, _, dataset, _ = example_fields(example)
    return f"{dataset}/{qid}" if dataset else qid


def ep_candidates(recipe: Recipe, episode: Episode) -> list[Any]:
    """The recipe's expert candidates for the episode's next turn, at most `MAX_EXPERT_QUERIES`."""
    return list(recipe.expert_queries(episode))[:MAX_EXPERT_QUERIES]


NO_DEMONSTRATION = "no_demonstration"
"""Stop reason of an expert episode (`AgentLoop(expert=True)`) whose recipe expert had no turn to write."""
EXPERT_TURN_OVER_LIMIT = "expert_turn_over_limit"
"""Stop reason of an expert episode whose next turn is longer than the turn may be (`rollout.max_new_tokens_per_turn`,
or what `rollout.max_total_tokens` leaves): a policy could not have written it, so it demonstrates nothing."""
UNDEMONSTRATED = (NO_DEMONSTRATION, EXPERT_TURN_OVER_LIMIT)


class _EpisodeRun:
    """One episode's state between engine calls."""

    def __init__(self, loop: AgentLoop, example: Any, sample_index: int):
        self.loop = loop
        qid, self.question, self.golds, dataset, self.meta = example_fields(example)
        self.group_id = group_id_of(example)
        self.qid = qid
        self.sample_index = sample_index
        self.episode: Episode | None = None
        self.traj: Trajectory | None = None
        self.t0 = time.perf_counter()
        self.generate_s = 0.0
        self.search_s = 0.0
        self.wasted_tokens = 0  # generated after a stop string (the baseline without engine stops only)
        self.room_tokens: int | None = None  # `answer_room`, once known

    def turn_seed(self, turn: int) -> int | None:
        """A reproducible seed per (question, sample, turn): distinct questions never share a random
        stream (crc32, unlike hash(), is the same in every process)."""
        base = self.loop.sampling.seed
        if base is None:
            return None
        return (base * 1_000_003 + zlib.crc32(self.group_id.encode()) * 7919 + self.sample_index * 101 + turn) % 2**31

    @property
    def done(self) -> bool:
        """Whether the episode has started and the recipe has ended it."""
        return self.episode is not None and self.episode.done

    async def start(self) -> None:
        """Run the recipe's initial search (if it has one), start the episode and its trajectory from
        the tokenized prompt; end the episode at once if the prompt alone reaches `max_total_tokens`."""
        lp = self.loop
        docs: list[Doc] = []
        if lp.recipe.initial_search:
            t = time.perf_counter()
            docs = as_docs(await lp.searcher(self.question, lp.recipe.config.topk))
            self.search_s += time.perf_counter() - t
        self.episode = lp.recipe.start(
            self.question, self.golds, docs, chat=lp.chat, qid=self.qid, group_id=self.group_id, meta=self.meta
        )
        prompt_text = self.episode.prompt.render(lp.tokenizer if lp.chat else None)
        prompt_ids = lp.encode(prompt_text, special=not lp.chat)
        self.traj = Trajectory(
            self.group_id, self.qid, self.sample_index, self.question, self.golds, lp.recipe.name,
            prompt_ids, weight_version=lp.engine.weight_version, episode=self.episode,
        )
        if self.traj.num_tokens >= lp.limits.max_total_tokens:
            lp.recipe.finish(self.episode, "max_total_tokens")

    async def generate(self, engine_stops: bool = True) -> None:
        """One generation turn, recorded in the episode; sets up the search if one is needed.

        `engine_stops=False` is the seed papers' way, kept for the benchmark baseline: generate the
        whole turn budget, then cut after the first stop string (the cut tokens are counted in
        `self.wasted_tokens`, and the trajectory is the same as if the engine had stopped)."""
        lp, ep, traj = self.loop, self.episode, self.traj
        budget = lp.limits.max_total_tokens - traj.num_tokens
        if budget < 1:
            lp.recipe.finish(ep, "max_total_tokens")
            return
        stops = tuple(lp.recipe.stop_strings)
        max_tokens = min(lp.limits.max_new_tokens_per_turn, budget)
        room = self.answer_room()
        if room and budget - room >= 1:  # a turn cut here ends invalid or searching: `act` then opens the answer
            max_tokens = min(max_tokens, budget - room)
        if ep.answer_forced:  # the loop opened the answer: a short span, not another turn of reasoning
            max_tokens = min(max_tokens, getattr(lp.recipe.config, "forced_answer_tokens", max_tokens))
        sampling = replace(
            lp.sampling,
            max_tokens=max_tokens,
            stop=stops if engine_stops else (),
            n=1,
            seed=self.turn_seed(len(ep.turns)),
        )
        t = time.perf_counter()
        version = lp.engine.weight_version
        if lp.expert:  # the recipe's expert writes the turn (warm-start demonstrations); the engine is not asked
            text = lp.recipe.expert_turn(ep, await self.expert_query())
            ids = [] if text is None else lp.encode(text, special=False)
            if text is None or not ids or len(ids) > max_tokens:  # a policy could not have written it here
                lp.recipe.finish(ep, EXPERT_TURN_OVER_LIMIT if ids and len(ids) > max_tokens else NO_DEMONSTRATION)
                return
            logprobs, finish_reason = [0.0] * len(ids), "stop"
        else:
            gen = (await lp.engine.generate(traj.prompt_ids + traj.response_ids, sampling))[0]
            version = int(gen.meta.get("weight_version", version))  # the engine's view when the request started
            ids, logprobs, finish_reason = list(gen.token_ids), list(gen.logprobs), gen.finish_reason
        dt = time.perf_counter() - t
        self.generate_s += dt
        if not engine_stops:
            keep = stop_prefix_length(lp.decode, ids, stops)
            if keep is not None:
                self.wasted_tokens += len(ids) - keep
                ids, logprobs, finish_reason = ids[:keep], logprobs[:keep], "stop"
        text = lp.decode(ids)
        traj.append(ids, policy=True, logprobs=logprobs, version=version)
        turn = lp.recipe.step(ep, text, finish_reason)
        traj.turns.append(TurnRecord(text, type(turn.action).__name__, None, [], len(ids), 0, finish_reason, dt, 0.0,
                                     version, int(lp.engine.weight_version)))

    async def search(self, query: str) -> list[Doc]:
        """The top-k documents of `query` (k = the recipe's `topk`); with the recipe's `fresh_docs`, the top-k
        of those not yet shown in the episode (the searcher is asked for k + the shown count)."""
        lp, ep = self.loop, self.episode
        k = lp.recipe.config.topk
        if not lp.recipe.config.fresh_docs:
            return as_docs(await lp.searcher(query, k))
        shown = {d.doc_id for d in shown_docs(ep)}
        return [d for d in as_docs(await lp.searcher(query, k + len(shown))) if d.doc_id not in shown][:k]

    async def expert_query(self) -> Any:
        """The expert's query for its next turn: the first of the recipe's candidates (`Recipe.expert_queries`)
        whose documents (`search`, as the turn would get them) hold a gold answer not shown yet, or that the
        recipe marks `checked=False`; None when none does. Each candidate checked costs one search call."""
        ep = self.episode
        shown = {d.doc_id for d in shown_docs(ep)}
        for candidate in ep_candidates(self.loop.recipe, ep):
            if not candidate.checked:
                return candidate
            hits = self.loop.fit_observation(await self.search(candidate.query))  # as the turn would show them
            if any(d.doc_id not in shown and doc_holds_answer(d, ep.golden_answers) for d in hits):
                return candidate
        return None

    async def act(self) -> None:
        """Run the pending search (if any) and append the observation or feedback tokens."""
        lp, ep, traj = self.loop, self.episode, self.traj
        if not ep.turns:
            return
        turn, record = ep.turns[-1], traj.turns[-1]
        if turn.needs_retrieval:
            assert isinstance(turn.action, Search)
            t = time.perf_counter()
            hits = lp.fit_observation(await self.search(turn.action.query))
            record.search_s = time.perf_counter() - t
            self.search_s += record.search_s
            record.query = turn.action.query
            if self.leaves_no_room(lp.recipe.observation_text(hits)):
                lp.recipe.end_or_force(ep, "max_total_tokens")  # the search is skipped; its documents never shown
            else:
                record.doc_ids = [d.doc_id for d in hits]
                lp.recipe.observe(ep, hits)
        elif turn.observation and self.leaves_no_room(turn.observation):  # the feedback after an invalid turn
            turn.observation = ""
            lp.recipe.end_or_force(ep, "max_total_tokens")
        if turn.observation:
            ids = lp.encode(turn.observation, special=False)
            if len(ids) > lp.limits.max_observation_tokens:  # last resort after fit_observation
                ids = ids[: lp.limits.max_observation_tokens]
                turn.observation = lp.decode(ids)
            if traj.num_tokens + len(ids) > lp.limits.max_total_tokens:
                # No room for it: the trajectory ends on the policy's turn and never exceeds the limit.
                turn.observation = ""
                lp.recipe.finish(ep, "max_total_tokens")
                return
            traj.append(ids, policy=False)
            record.observation_tokens = len(ids)
        if not ep.done and traj.num_tokens >= lp.limits.max_total_tokens:
            lp.recipe.finish(ep, "max_total_tokens")

    def answer_room(self) -> int:
        """Tokens the episode keeps free before `max_total_tokens` for a forced answer (`Recipe.reserved_answer`:
        the opener's tokens plus the answer's budget); 0 when the recipe keeps none, once the answer is forced,
        and for the expert (its demonstrations answer in their own turns)."""
        reserved = self.loop.recipe.reserved_answer()
        if reserved is None or self.loop.expert or self.episode.answer_forced:
            return 0
        if self.room_tokens is None:  # tokenized once per episode: it is read every turn
            opener, answer_tokens = reserved
            self.room_tokens = len(self.loop.encode(opener, special=False)) + answer_tokens
        return self.room_tokens

    def leaves_no_room(self, observation: str) -> bool:
        """Whether appending `observation` would leave less than `answer_room` + 1 tokens (the answer's room and
        at least one token of a next turn) before `max_total_tokens`."""
        room = self.answer_room()
        if not room:
            return False
        used = self.traj.num_tokens + len(self.loop.encode(observation, special=False))
        return used + room >= self.loop.limits.max_total_tokens

    async def finish(self) -> Trajectory:
        """The finished trajectory: finish reason, final answer / selected doc ids / evidence / the search's
        measures (`final["search"]`, `recipes.search_metrics.SearchRecord` as a dict), the reward
        (computed in a worker thread when `compute_reward`) and timings (seconds)."""
        lp, ep, traj = self.loop, self.episode, self.traj
        traj.finish_reason = ep.stop_reason
        final = ep.final
        traj.final = {
            "answer": final.answer if final else None,
            "selected_doc_ids": [d.doc_id for d in final.selected_docs] if final else [],
            "evidence": final.evidence if final else None,
            "answer_forced": ep.answer_forced,
            # own searches, retrieval and context recall (recipes.search_metrics)
            "search": search_record(ep, lp.recipe.generator_context(ep)).to_json(),
        }
        score_s = 0.0
        if lp.compute_reward and ep.stop_reason not in UNDEMONSTRATED:  # a question left without one is not scored
            t = time.perf_counter()
            reward = await asyncio.to_thread(lp.recipe.reward, ep, lp.scorer)
            score_s = time.perf_counter() - t
            ep.reward = reward
            traj.reward, traj.reward_components = reward.total, dict(reward.components)
            traj.final["answer"] = ep.final.answer if ep.final else traj.final["answer"]
        traj.timings = {
            "total_s": time.perf_counter() - self.t0,
            "generate_s": self.generate_s,
            "search_s": self.search_s,
            "score_s": score_s,  # reward (frozen generator/judge calls included); overlaps other episodes
        }
        return traj


class AgentLoop:
    """Runs a recipe's episodes on an engine against a searcher.

    Args:
        engine: an `actors.engines.base.Engine` (vLLM, transformers fallback, or a scripted test engine).
        recipe: the method (`recipes.get_recipe(name)`).
        searcher: `await searcher(query, k)` → hits; e.g. `pool_searcher(retrieval_pool_handle)`.
        sampling: temperature/top-p/seed; `max_tokens`, `stop` and `n` are set per turn here.
        limits: token limits.
        chat: render prompts with the tokenizer's chat template; None = when it has one.
        scorer: frozen LLMs for rewards that need them (s3, R-Search); None = rule rewards only.
        compute_reward: score each episode as soon as it ends (overlaps with other episodes).
        expert: the recipe's rule-based expert (`Recipe.expert_turn`, which knows the gold answers) writes every
            turn instead of the engine (only its tokenizer is used): demonstrations in the recipe's own prompt,
            tags and tokenization, policy tokens loss-masked in, log-probs 0. An episode the expert cannot
            demonstrate ends with stop reason `NO_DEMONSTRATION`, or `EXPERT_TURN_OVER_LIMIT` when its turn
            does not fit the token limits; neither is scored.
    """

    def __init__(
        self,
        engine: Engine,
        recipe: Recipe,
        searcher: Searcher,
        sampling: Sampling = Sampling(),
        limits: RolloutLimits = RolloutLimits(),
        chat: bool | None = None,
        scorer: Scorer | None = None,
        compute_reward: bool = True,
        expert: bool = False,
    ):
        self.engine, self.recipe, self.searcher = engine, recipe, searcher
        self.expert = expert
        self.sampling, self.limits = sampling, limits
        self.tokenizer = engine.tokenizer
        self.chat = bool(getattr(self.tokenizer, "chat_template", None)) if chat is None else chat
        self.scorer, self.compute_reward = scorer, compute_reward

    def encode(self, text: str, special: bool) -> list[int]:
        """Token ids of `text`; `special` adds the tokenizer's BOS (prompts of base models only)."""
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids, special tokens skipped."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def fit_observation(self, docs: list[Doc]) -> list[Doc]:
        """`fit_documents` with this loop's recipe, tokenizer and `max_observation_tokens`."""
        return fit_documents(self.recipe, docs, self.limits.max_observation_tokens,
                             lambda t: self.encode(t, special=False), self.decode)

    async def run_episode(self, example: Any, sample_index: int = 0,
                          on_turn: Callable[[Episode, TurnRecord], None] | None = None) -> Trajectory:
        """One episode from start to reward; never raises on model output or length limits.

        `on_turn(episode, record)` is called after each turn's search and observation, the turn being
        `episode.turns[-1]` (serving streams turns as they happen with it)."""
        run = _EpisodeRun(self, example, sample_index)
        await run.start()
        while not run.done:
            before = len(run.episode.turns)
            await run.generate()
            await run.act()
            if on_turn is not None and len(run.episode.turns) > before:  # no turn when the budget was spent
                on_turn(run.episode, run.traj.turns[-1])
        return await run.finish()

    async def run_batch(self, examples: Sequence[Any], n: int = 1) -> list[Trajectory]:
        """`n` samples of every example, all episodes concurrent and independent. Order: example-major."""
        return list(await asyncio.gather(*(self.run_episode(ex, i) for ex in examples for i in range(n))))

    async def run_batch_turn_sync(
        self, examples: Sequence[Any], n: int = 1, engine_stops: bool = True
    ) -> list[Trajectory]:
        """The seed papers' loop, kept as the benchmark baseline: every active episode generates, then
        every one searches, turn by turn. `engine_stops=False` also generates each turn's whole
        budget and cuts after the closing tag, as their code does (Search-R1's `_postprocess_responses`);
        the tokens cut off are in each trajectory's `timings["wasted_tokens"]`."""
        runs = [_EpisodeRun(self, ex, i) for ex in examples for i in range(n)]
        await asyncio.gather(*(r.start() for r in runs))
        while active := [r for r in runs if not r.done]:
            await asyncio.gather(*(r.generate(engine_stops) for r in active))
            await asyncio.gather(*(r.act() for r in active))
        trajs = list(await asyncio.gather(*(r.finish() for r in runs)))
        for run, traj in zip(runs, trajs):
            traj.timings["wasted_tokens"] = float(run.wasted_tokens)
        return trajs


def stop_prefix_length(decode: Callable[[Sequence[int]], str], ids: Sequence[int], stops: Sequence[str]) -> int | None:
    """Length (tokens) of the shortest prefix of `ids` whose decoded text contains a stop string;
    None if none does. Binary search: containing a stop string is monotone in the prefix length."""
    def has_stop(n: int) -> bool:
        """Whether the text of the first `n` tokens contains a stop string."""
        text = decode(ids[:n])
        return any(s in text for s in stops)

    if not stops or not has_stop(len(ids)):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if has_stop(mid) else (mid + 1, hi)
    return lo


def pool_searcher(pool: Any, retries: int = 3, backoff_s: float = 1.0,
                  on_retry: Callable[[], Any] | None = None) -> Searcher:
    """A searcher over a RetrievalPool actor handle (one query per call; the pool micro-batches).

    A search that fails because a shard stayed down through the pool's own restart wait
    (`ShardUnavailableError`) or because the pool actor itself is dead or restarting is retried
    `retries` times, waiting `backoff_s` * 2**attempt seconds between tries; the last failure is
    raised (the step fails with it, naming the shard), so no episode is dropped in silence.
    `on_retry()` is called before each retry (fault counters).
    """
    import logging

    from actors.lifecycle import actor_death_errors
    from actors.retrieval.shard import ShardUnavailableError

    async def search(query: str, k: int):
        """Top-`k` hits for `query` from the pool, best first (dicts with doc_id, title, text, score)."""
        for attempt in range(retries + 1):
            try:
                return (await pool.search.remote([query], k))[0]
            except (ShardUnavailableError, *actor_death_errors()) as e:
                if attempt == retries:
                    raise
                logging.getLogger(__name__).warning("search failed (%s: %s); retry %d/%d", type(e).__name__, e,
                                                    attempt + 1, retries)
                if on_retry is not None:
                    on_retry()
                await asyncio.sleep(backoff_s * 2**attempt)

    return search


def fit_documents(recipe: Any, docs: list[Doc], limit: int, encode: Callable[[str], list[int]],
                  decode: Callable[[Sequence[int]], str]) -> list[Doc]:
    """Shorten document texts evenly (each cut ends with `TRUNCATION_MARKER`) so the recipe's observation
    text of `docs` fits `limit` tokens (`max_observation_tokens`); documents that fit are returned
    unchanged. `encode` / `decode`: the policy tokenizer without special tokens. Used by the agent loop
    and by `scripts.bench.serve`'s plain-loop baseline, so both read the same observation."""
    if not docs or len(encode(recipe.observation_text(docs))) <= limit:
        return docs
    overhead = len(encode(recipe.observation_text([replace(d, text="") for d in docs])))
    marker = len(encode(TRUNCATION_MARKER))
    per_doc = max(1, (limit - overhead) // len(docs) - marker)
    out = []
    for d in docs:
        ids = encode(d.text)
        out.append(d if len(ids) <= per_doc else replace(d, text=decode(ids[:per_doc]) + TRUNCATION_MARKER))
    return out
