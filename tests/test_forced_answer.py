"""The forced answer turn (`force_answer`, recipes/tagged.py): an episode that would end without an
answer (invalid turn, turn limit) gets one last turn opened with the answer tag; the record says so,
format rewards count it as an error, and the loop caps that turn's tokens."""

from __future__ import annotations

from actors.rollout.agent_loop import RolloutLimits
from recipes import get_recipe
from recipes.base import Answer
from tests.test_agent_loop import Q1, check_alignment, ex, run_loop

FORCED = {"force_answer": True, "forced_answer_tokens": 8}


def r1(**options):
    return get_recipe("r1_searcher", {"stage": 2, "max_turns": 1, **options})


def test_invalid_turn_opens_an_answer_instead_of_ending():
    recipe = r1(**FORCED)
    ep = recipe.start(Q1, ["Mira Tolven"], chat=False)
    turn = recipe.step(ep, " I ramble without any tag at all")
    assert not ep.done and ep.answer_forced and ep.forced_reason == "invalid"
    assert turn.observation == "\n<answer>"
    recipe.step(ep, " Mira Tolven </answer>")
    assert ep.done and ep.stop_reason == "answer" and ep.final.answer == "Mira Tolven"
    reward = recipe.reward(ep)
    assert reward.components["answer_f1"] == 1.0 and reward.components["format"] == -2.0  # forced: format error


def test_without_the_option_an_invalid_turn_ends_the_episode():
    recipe = r1()
    ep = recipe.start(Q1, ["Mira Tolven"], chat=False)
    recipe.step(ep, " I ramble without any tag at all")
    assert ep.done and ep.stop_reason == "invalid" and ep.final.answer is None and not ep.answer_forced


def test_search_past_the_turn_limit_is_skipped_and_the_answer_forced():
    recipe = r1(**FORCED)
    ep = recipe.start(Q1, ["Mira Tolven"], chat=False)
    recipe.step(ep, "<|begin_of_query|> Zorblax author <|end_of_query|>")
    recipe.observe(ep, [{"doc_id": "d1", "title": "Z", "text": "Zorblax Rising is by Mira Tolven."}])
    second = recipe.step(ep, "<|begin_of_query|> more <|end_of_query|>")
    assert second.skipped and not second.needs_retrieval and ep.answer_forced and ep.forced_reason == "max_turns"
    assert ep.num_searches == 1
    # The forced turn's answer is its text up to the closing tag, or all of it when cut by the token limit.
    recipe.step(ep, " Mira Tolven and more words")
    assert ep.final.answer == "Mira Tolven and more words"


def test_a_well_formed_answer_is_not_forced():
    recipe = r1(**FORCED)
    ep = recipe.start(Q1, ["Mira Tolven"], chat=False)
    recipe.step(ep, " I know it. </think>\n<answer> Mira Tolven </answer>")
    assert ep.done and not ep.answer_forced
    assert recipe.reward(ep).components["format"] == 0.0


def test_forced_answer_parse_ignores_search_tags():
    recipe = get_recipe("search_r1", force_answer=True)
    action = recipe.parse_forced_answer(" <search> x </search> Paris </answer> tail")
    assert isinstance(action, Answer) and "Paris" in action.text and "tail" not in action.text


def test_loop_caps_the_forced_turn_and_masks_the_opener(gemma_tokenizer):
    turns = {Q1: ["I am thinking without tags and never close anything.",
                  " Mira Tolven </answer>"]}
    recipe = r1(**FORCED)
    (traj,), engine = run_loop(gemma_tokenizer, recipe, turns, [ex("1", Q1, ["Mira Tolven"])],
                               limits=RolloutLimits(max_new_tokens_per_turn=64))
    assert [r.action for r in traj.turns] == ["Invalid", "Answer"]
    assert traj.final["answer"] == "Mira Tolven" and traj.final["answer_forced"] is True
    assert traj.finish_reason == "answer"
    assert [s.max_tokens for _, s in engine.requests] == [64, FORCED["forced_answer_tokens"]]
    check_alignment(gemma_tokenizer, traj)  # the opener is environment text: loss mask 0


def test_initial_search_puts_the_top_k_after_the_question():
    docs = [{"doc_id": "d1", "title": "Zorblax Rising", "text": "A novel by Mira Tolven."}]
    for name in ("r1_searcher", "search_r1", "r_search", "eval_rar"):
        recipe = get_recipe(name, initial_search=True)
        assert recipe.initial_search and not get_recipe(name).initial_search
        ep = recipe.start(Q1, ["Mira Tolven"], docs, chat=False)
        text = ep.prompt.completion
        assert "A novel by Mira Tolven." in text and text.index(Q1) < text.index("A novel by Mira Tolven.")
        assert recipe.observation_tags[0] in text.split(Q1, 1)[1]
        chat = recipe.start(Q1, ["Mira Tolven"], docs, chat=True)
        assert "A novel by Mira Tolven." in chat.prompt.messages[-1]["content"]


ROOM_TURNS = {Q1: ["<think>I need the author.</think>\n<search> Zorblax Rising author </search>",
                   "<think>More.</think>\n<search> Zorblax Rising novel </search>",
                   " Mira Tolven </answer>"]}


def test_answer_room_opens_the_answer_where_a_search_s_documents_would_reach_the_token_limit(gemma_tokenizer):
    """`answer_room`: the second search's documents would leave fewer tokens than the answer opener and
    `forced_answer_tokens`, so the search is skipped and the answer opened; without it the same limit ends the
    episode with no answer. The trajectory never exceeds `max_total_tokens`."""
    options = {**FORCED, "forced_answer_tokens": 16}
    wide = RolloutLimits(max_new_tokens_per_turn=64, max_total_tokens=4000)
    (full,), _ = run_loop(gemma_tokenizer, get_recipe("search_r1", **options), ROOM_TURNS, [ex("1", Q1, ["M"])],
                          limits=wide)
    assert [r.action for r in full.turns][:2] == ["Search", "Search"] and full.turns[1].doc_ids  # both shown
    first, second = full.turns[0], full.turns[1]
    limit = (len(full.prompt_ids) + first.generated_tokens + first.observation_tokens + second.generated_tokens
             + second.observation_tokens - 1)  # the second search's documents no longer fit
    limits = RolloutLimits(max_new_tokens_per_turn=64, max_total_tokens=limit)

    (ended,), _ = run_loop(gemma_tokenizer, get_recipe("search_r1", **options), ROOM_TURNS, [ex("1", Q1, ["M"])],
                           limits=limits)
    assert ended.finish_reason == "max_total_tokens" and ended.final["answer"] is None

    (roomy,), engine = run_loop(gemma_tokenizer, get_recipe("search_r1", answer_room=True, **options), ROOM_TURNS,
                                [ex("1", Q1, ["Mira Tolven"])], limits=limits)
    assert [r.action for r in roomy.turns] == ["Search", "Search", "Answer"] and roomy.turns[1].doc_ids == []
    assert roomy.finish_reason == "answer" and roomy.final["answer"] == "Mira Tolven"
    assert roomy.episode.forced_reason == "max_total_tokens" and roomy.final["search"]["own_searches"] == 1
    assert roomy.num_tokens <= limit and engine.requests[-1][1].max_tokens == 16
    check_alignment(gemma_tokenizer, roomy)


def test_answer_room_cuts_a_turn_short_of_the_answer_s_tokens(gemma_tokenizer):
    """A turn's token budget stops `answer_room` short of the limit; the cut turn (no closing tag) is invalid, and
    its feedback would eat into the room, so the answer is opened in its place."""
    import asyncio

    from actors.engines.base import Sampling
    from actors.rollout.agent_loop import AgentLoop
    from tests.scripted_engine import ScriptedEngine

    def run(limits):
        engine = ScriptedEngine(gemma_tokenizer, lambda context: " Mira Tolven </answer>" if context.endswith(
            "<answer>") else " ".join(["word"] * 80))
        recipe = get_recipe("search_r1", {**FORCED, "forced_answer_tokens": 16, "answer_room": True})
        loop = AgentLoop(engine, recipe, lambda q, k: None, Sampling(), limits, chat=False, compute_reward=False)
        return asyncio.run(loop.run_batch([ex("1", Q1, ["Mira Tolven"])], 1))[0], engine

    prompt = len(run(RolloutLimits(500, 1400, 10_000))[0].prompt_ids)
    opener = len(gemma_tokenizer.encode("\n<answer>", add_special_tokens=False))
    limit = prompt + 40 + opener + 16
    traj, engine = run(RolloutLimits(500, 1400, limit))
    assert engine.requests[0][1].max_tokens == 40  # the budget less the answer's room
    assert [r.action for r in traj.turns] == ["Invalid", "Answer"] and traj.final["answer"] == "Mira Tolven"
    assert traj.episode.forced_reason == "max_total_tokens" and traj.num_tokens <= limit


def test_answer_room_without_force_answer_fails_naming_both_fields():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="force_answer"):
        get_recipe("search_r1", answer_room=True)
