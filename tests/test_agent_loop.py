"""The agent loop with a scripted policy (real Gemma tokenizer) on every recipe: token exactness,
loss-mask alignment, limits, truncation, stop strings, async vs turn-synchronous equivalence."""

from __future__ import annotations

import asyncio

import pytest

from actors.engines.base import Sampling
from actors.rollout.agent_loop import TRUNCATION_MARKER, AgentLoop, RolloutLimits
from recipes import get_recipe
from recipes.base import Doc
from scripts.bench.rollout import tokens_after_stop
from tests.scripted_engine import LOGPROB, ScriptedEngine, turn_policy
from tests.test_recipes import ScriptedScorer

Q1 = "Who wrote the novel Zorblax Rising?"
Q2 = "Which river flows through Quentaria city?"


def docs_for(query: str, n: int = 3, words: int = 12) -> list[Doc]:
    filler = " ".join(["lorem"] * max(0, words - 4))
    return [Doc(f"{abs(hash(query)) % 997}-{i}", f"Title {i} {query[:20]}", f"Passage {i} about {query}. {filler}") for i in range(1, n + 1)]


def make_searcher(words: int = 12, calls: list | None = None):
    async def search(query: str, k: int):
        if calls is not None:
            calls.append((query, k))
        await asyncio.sleep(0)
        return [{"doc_id": d.doc_id, "title": d.title, "text": d.text, "score": 1.0} for d in docs_for(query, k, words)]

    return search


def run_loop(tokenizer, recipe, turns_by_q, examples, n=1, limits=RolloutLimits(), scorer=None, sync=False, eos=False,
             words=12, chat=False):
    engine = ScriptedEngine(tokenizer, turn_policy(turns_by_q), eos=eos)
    loop = AgentLoop(engine, recipe, make_searcher(words), Sampling(temperature=1.0, seed=3), limits, chat=chat,
                     scorer=scorer)
    coro = loop.run_batch_turn_sync(examples, n) if sync else loop.run_batch(examples, n)
    return asyncio.run(coro), engine


def ex(qid, question, golds, dataset="nq"):
    return {"id": qid, "question": question, "golden_answers": golds, "dataset": dataset}


SEARCH_R1_TURNS = {
    Q1: ["<think>I need the author.</think>\n<search> Zorblax Rising author </search>",
         "<think>Found it.</think>\n<answer> Mira Tolven </answer>"],
    Q2: ["<answer> Quent </answer>"],
}


def check_alignment(tokenizer, traj):
    """Mask-1 tokens decode to exactly the policy's text; mask-0 tokens to the inserted text."""
    ep = traj.episode
    policy_ids = [t for t, m in zip(traj.response_ids, traj.loss_mask) if m == 1]
    env_ids = [t for t, m in zip(traj.response_ids, traj.loss_mask) if m == 0]
    assert tokenizer.decode(policy_ids, skip_special_tokens=True) == "".join(t.text for t in ep.turns)
    assert tokenizer.decode(env_ids, skip_special_tokens=True) == "".join(t.observation for t in ep.turns)
    assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert all(lp == (LOGPROB if m else 0.0) for lp, m in zip(traj.logprobs, traj.loss_mask))


def test_search_r1_episode_is_token_exact(gemma_tokenizer):
    trajs, engine = run_loop(gemma_tokenizer, get_recipe("search_r1"), SEARCH_R1_TURNS,
                             [ex("1", Q1, ["Mira Tolven"]), ex("2", Q2, ["Quent River"])])
    t1, t2 = trajs
    assert [r.action for r in t1.turns] == ["Search", "Answer"] and t1.finish_reason == "answer"
    assert t1.turns[0].query == "Zorblax Rising author" and len(t1.turns[0].doc_ids) == 3
    assert t1.reward == 1.0 and t2.reward == 0.0 and t1.final["answer"] == "Mira Tolven"
    check_alignment(gemma_tokenizer, t1)
    check_alignment(gemma_tokenizer, t2)
    # Token-in: the second turn was generated from exactly prompt + first turn + observation ids.
    second = [ids for ids, _ in engine.requests if len(ids) > len(t1.prompt_ids) and ids[: len(t1.prompt_ids)] == t1.prompt_ids]
    assert second[-1] == t1.prompt_ids + t1.response_ids[: len(second[-1]) - len(t1.prompt_ids)]
    assert t1.loss_mask.count(0) == t1.turns[0].observation_tokens > 0
    assert gemma_tokenizer.decode(t1.prompt_ids[:1], skip_special_tokens=False) == "<bos>"  # base-model prompt has BOS
    assert engine.requests[0][1].stop == ("</search>", "</answer>")
    # Each (question, sample, turn) draws from its own seed: two questions never share a stream.
    seeds = [sampling.seed for _, sampling in engine.requests]
    assert None not in seeds and len(set(seeds)) == len(seeds)
    assert t1.group_id == "nq/1" and t1.timings["search_s"] >= 0 and t1.timings["generate_s"] >= 0


def test_stop_string_ends_the_turn_with_no_tokens_after(gemma_tokenizer):
    turns = {Q1: ["<search> Zorblax author </search> and then I keep talking about it for a while",
                  "<answer> Mira Tolven </answer> trailing text"]}
    (traj,), engine = run_loop(gemma_tokenizer, get_recipe("search_r1"), turns, [ex("1", Q1, ["Mira Tolven"])])
    # The bench's measure: no token after the one completing a closing tag (the script went on).
    assert tokens_after_stop(gemma_tokenizer, traj.to_json(), get_recipe("search_r1").stop_strings) == 0
    assert traj.episode.turns[0].text.rstrip().endswith("</search>")
    assert "trailing" not in gemma_tokenizer.decode(traj.response_ids)


def test_invalid_action_feedback_and_turn_limit(gemma_tokenizer):
    turns = {Q1: ["I am thinking without tags.", "<search> one </search>", "<search> two </search>", "<search> three </search>"]}
    recipe = get_recipe("eval_rar", max_turns=2)
    (traj,), _ = run_loop(gemma_tokenizer, recipe, turns, [ex("1", Q1, ["Mira Tolven"])], eos=True)
    ep = traj.episode
    assert [r.action for r in traj.turns] == ["Invalid", "Search", "Search"]
    assert "My action is wrong. Let me try again." in ep.turns[0].observation
    assert traj.finish_reason == "max_turns" and ep.num_searches == 1 and traj.reward == 0.0
    check_alignment(gemma_tokenizer, traj)


def test_turn_token_limit_and_total_limit(gemma_tokenizer):
    long_turn = "<think>" + "very " * 80 + "long</think><search> never reached </search>"
    turns = {Q1: [long_turn, "<answer> Mira Tolven </answer>"]}
    recipe = get_recipe("search_r1", max_turns=3)
    limits = RolloutLimits(max_new_tokens_per_turn=20, max_observation_tokens=400, max_total_tokens=10_000)
    (traj,), _ = run_loop(gemma_tokenizer, recipe, turns, [ex("1", Q1, ["x"])], limits=limits)
    first = traj.turns[0]
    assert first.generated_tokens == 20 and first.finish_reason == "length" and first.action == "Invalid"
    check_alignment(gemma_tokenizer, traj)
    # A total budget just above the prompt: the episode ends by the limit, never past it.
    recipe = get_recipe("search_r1")
    prompt_len = len(gemma_tokenizer.encode(recipe.start(Q1, ["x"], chat=False).prompt.completion))
    limits = RolloutLimits(max_new_tokens_per_turn=50, max_total_tokens=prompt_len + 30)
    (traj,), _ = run_loop(gemma_tokenizer, recipe, SEARCH_R1_TURNS, [ex("1", Q1, ["x"])], limits=limits)
    assert traj.finish_reason == "max_total_tokens" and traj.num_tokens <= prompt_len + 30
    assert traj.turns[-1].action == "Search" and traj.turns[-1].observation_tokens == 0  # no room: dropped
    check_alignment(gemma_tokenizer, traj)


def test_long_documents_are_truncated_with_marker(gemma_tokenizer):
    limits = RolloutLimits(max_observation_tokens=120)
    (traj,), _ = run_loop(gemma_tokenizer, get_recipe("search_r1"), SEARCH_R1_TURNS, [ex("1", Q1, ["Mira Tolven"])],
                          limits=limits, words=400)
    obs = traj.episode.turns[0].observation
    assert traj.turns[0].observation_tokens <= 120
    assert TRUNCATION_MARKER in obs and obs.rstrip().endswith("</information>")  # wrapper intact
    assert obs.count("Doc ") == 3
    check_alignment(gemma_tokenizer, traj)


def test_every_recipe_runs_end_to_end(gemma_tokenizer):
    gold = ["Mira Tolven"]
    scripts = {
        "s3": [" <important_info>[1]</important_info><search_complete>False</search_complete>",
               '\n<query>{"query": "Zorblax Rising novel author"}</query>',
               "<important_info>[2, 3]</important_info><search_complete>True</search_complete>"],
        "r1_searcher": [" I should search. <|begin_of_query|> Zorblax Rising author<|end_of_query|>",
                        " It is Mira Tolven. </think>\n<answer> Mira Tolven </answer>"],
        "r_search": ["Step 1. <search> Zorblax Rising author </search>",
                     "<original_evidence>Passage 1 about Zorblax Rising author.</original_evidence>\n<answer> Mira Tolven </answer>"],
        "eval_rar": ["<think>Search.</think><search> Zorblax Rising author </search>",
                     "<evaluate>Mira Tolven wrote it.</evaluate><answer> M. Tolven </answer>"],
        "search_r1": SEARCH_R1_TURNS[Q1],
        "naive_rag": [" Mira Tolven\n"],
        "direct": [" Mira Tolven\n"],
    }
    scorer = ScriptedScorer({"Rising novel author": "Mira Tolven", "Passage 1 about Zorblax Rising author": "Mira Tolven"}, default="unknown")
    expected = {"s3": 1.0, "r1_searcher": 1.0, "r_search": 2.4, "eval_rar": 0.1, "search_r1": 1.0, "naive_rag": 1.0, "direct": 1.0}
    for name, turns in scripts.items():
        recipe = get_recipe(name)
        (traj,), _ = run_loop(gemma_tokenizer, recipe, {Q1: turns}, [ex("1", Q1, gold)], scorer=scorer)
        assert traj.reward == pytest.approx(expected[name]), (name, traj.reward_components, [t.text for t in traj.turns])
        assert traj.episode.done and traj.finish_reason in {"answer", "complete"}, name
        check_alignment(gemma_tokenizer, traj)
    (s3_traj,), _ = run_loop(gemma_tokenizer, get_recipe("s3"), {Q1: scripts["s3"]}, [ex("1", Q1, gold)], scorer=scorer)
    assert len(s3_traj.final["selected_doc_ids"]) == 3  # initial doc 1 + second block docs 2, 3


def test_async_and_turn_sync_loops_agree_and_groups_are_unique(gemma_tokenizer):
    examples = [ex("1", Q1, ["Mira Tolven"], "nq"), ex("1", Q2, ["Quent"], "hotpotqa")]
    a, _ = run_loop(gemma_tokenizer, get_recipe("search_r1"), SEARCH_R1_TURNS, examples, n=2)
    s, _ = run_loop(gemma_tokenizer, get_recipe("search_r1"), SEARCH_R1_TURNS, examples, n=2, sync=True)
    assert [t.response_ids for t in a] == [t.response_ids for t in s]
    assert [t.group_id for t in a] == ["nq/1", "nq/1", "hotpotqa/1", "hotpotqa/1"]
    assert [t.sample_index for t in a] == [0, 1, 0, 1]
    assert a[0].to_json()["turns"][0]["action"] == "Search" and "episode" not in a[0].to_json()


def test_papers_baseline_generates_past_the_tag_and_cuts_to_the_same_trajectory(gemma_tokenizer):
    """`engine_stops=False` (the seed papers' loop) generates the whole turn, cuts after the closing
    tag and counts the cut tokens; the kept trajectory equals the one the engine stopped itself."""
    junk = " and then the model keeps talking about other things"

    def policy(context: str) -> str:
        turn = "<answer> Mira </answer>" if "Zorblax author </search>" in context else "<search> Zorblax author </search>"
        return turn + junk

    examples = [ex("1", Q1, ["Mira"])]
    out = {}
    for stops in (True, False):
        engine = ScriptedEngine(gemma_tokenizer, policy)
        loop = AgentLoop(engine, get_recipe("search_r1"), make_searcher(), Sampling(seed=3), chat=False)
        (out[stops],) = asyncio.run(loop.run_batch_turn_sync(examples, engine_stops=stops))
        assert all(s.stop == (tuple(loop.recipe.stop_strings) if stops else ()) for _, s in engine.requests)
    assert out[False].response_ids == out[True].response_ids and out[False].reward == 1.0
    assert [t.finish_reason for t in out[False].turns] == ["stop", "stop"]
    junk_tokens = len(gemma_tokenizer.encode(junk, add_special_tokens=False))
    assert out[False].timings["wasted_tokens"] == pytest.approx(2 * junk_tokens, abs=2)
    assert out[True].timings["wasted_tokens"] == 0


def test_chat_model_path_is_token_exact(smollm2_tokenizer):
    """An instruct model (SmolLM2, ChatML) takes the chat path: the prompt is the tokenizer's chat
    template, turns end at the recipe's stop strings, and the loss mask covers exactly the policy's
    text across turns with observations between them."""
    trajs, _ = run_loop(smollm2_tokenizer, get_recipe("search_r1"), SEARCH_R1_TURNS,
                        [ex("1", Q1, ["Mira Tolven"])], chat=True)
    (t,) = trajs
    prompt = smollm2_tokenizer.decode(t.prompt_ids)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert Q1 in prompt and [r.action for r in t.turns] == ["Search", "Answer"] and t.reward == 1.0
    check_alignment(smollm2_tokenizer, t)
    assert t.loss_mask.count(0) == t.turns[0].observation_tokens > 0


class _FlakyPool:
    """A RetrievalPool handle whose first `failures` searches raise ShardUnavailableError."""

    def __init__(self, failures: int):
        from actors.retrieval.shard import ShardUnavailableError

        self.calls, self.failures, self.error = 0, failures, ShardUnavailableError

        async def remote(queries, k):
            self.calls += 1
            if self.calls <= self.failures:
                raise self.error("shard 1 unavailable after 3 retries")
            return [[{"doc_id": 7, "title": "t", "text": queries[0], "score": 1.0}][:k]]

        self.search = type("Method", (), {"remote": staticmethod(remote)})()


def test_pool_searcher_retries_a_down_shard_then_raises():
    import asyncio

    from actors.retrieval.shard import ShardUnavailableError
    from actors.rollout.agent_loop import pool_searcher

    pool = _FlakyPool(failures=2)
    hits = asyncio.run(pool_searcher(pool, retries=3, backoff_s=0.0)("q", 1))
    assert hits[0]["doc_id"] == 7 and pool.calls == 3
    pool = _FlakyPool(failures=10)
    with pytest.raises(ShardUnavailableError, match="shard 1"):
        asyncio.run(pool_searcher(pool, retries=2, backoff_s=0.0)("q", 1))
    assert pool.calls == 3  # the first try and 2 retries, then the error reaches the step


def test_tokens_carry_the_weight_version_that_sampled_them(gemma_tokenizer):
    """An in-flight weight update during the first turn's request: that turn's tokens keep the version its
    request started on (the oldest that can have sampled them) and the turn records both; the next turn
    samples from the new version only (`train.async_mode: fully`'s partial rollout)."""
    from pipelines.rollout_stream import version_span

    class UpdatedInFlight(ScriptedEngine):
        async def generate(self, prompt_token_ids, sampling):
            version = self.weight_version
            gens = await super().generate(prompt_token_ids, sampling)
            if len(self.requests) == 1:
                self.weight_version = 7  # the learner's new weights arrive while this request runs
            for g in gens:
                g.meta["weight_version"] = version
            return gens

    engine = UpdatedInFlight(gemma_tokenizer, turn_policy(SEARCH_R1_TURNS))
    engine.weight_version = 6
    loop = AgentLoop(engine, get_recipe("search_r1"), make_searcher(), Sampling(seed=3), chat=False)
    traj = asyncio.run(loop.run_batch([ex("1", Q1, ["Mira Tolven"])]))[0]
    first, second = traj.turns
    assert (first.weight_version, first.weight_version_end) == (6, 7)
    assert (second.weight_version, second.weight_version_end) == (7, 7)
    assert traj.weight_version == 6 and len(traj.token_versions) == len(traj.response_ids)
    policy = [v for v, m in zip(traj.token_versions, traj.loss_mask) if m]
    assert policy == [6] * first.generated_tokens + [7] * second.generated_tokens
    assert version_span(traj.to_json()) == (6, 7)  # a partial episode, 1 version behind a learner at 7
