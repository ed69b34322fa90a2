"""Frozen LLM scorers: prompt rendering, greedy sampling, the (model, prompt) cache, the judge, and
the synchronous Scorer adapter used by rewards inside the async agent loop."""

from __future__ import annotations

import asyncio

from actors.engines.base import Sampling
from actors.frozen.scorer import FrozenLLM, ThreadScorer
from actors.rollout.agent_loop import AgentLoop
from recipes import get_recipe
from recipes.base import ANSWER_PROMPT
from tests.scripted_engine import ScriptedEngine, turn_policy
from tests.test_agent_loop import Q1, ex, make_searcher


def answering_policy(context: str) -> str:
    """A frozen 'generator' that answers from its context and a 'judge' that says yes to Tolven."""
    if "Please check if any of the golden answers" in context:
        return " yes\n" if "Tolven" in context.split("Golden answers")[0] else " no\n"
    return " Mira Tolven\n" if "novel author" in context else " I do not know\n"


def test_frozen_llm_caches_and_judges(gemma_tokenizer):
    engine = ScriptedEngine(gemma_tokenizer, answering_policy)
    llm = FrozenLLM(engine, "scripted", chat=False)

    async def go():
        a1 = await llm.generate_answer("Who?", "Passage about Zorblax Rising novel author")
        a2 = await llm.generate_answer("Who?", "Passage about Zorblax Rising novel author")
        a3 = await llm.generate_answer("Who?", "nothing useful")
        yes = await llm.judge("It was M. Tolven", ["Mira Tolven"])
        no = await llm.judge("Nobody", ["Mira Tolven"])
        return a1, a2, a3, yes, no

    a1, a2, a3, yes, no = asyncio.run(go())
    assert (a1, a2, a3, yes, no) == ("Mira Tolven", "Mira Tolven", "I do not know", True, False)
    assert llm.stats == {"calls": 5, "cache_hits": 1, "generated": 4}
    prompt_ids, sampling = engine.requests[0]
    assert sampling.temperature == 0.0 and sampling.stop == ("\n",)
    text = gemma_tokenizer.decode(prompt_ids, skip_special_tokens=True)
    assert text == ANSWER_PROMPT.format(question="Who?", context="Passage about Zorblax Rising novel author") + "\nAnswer:"


S3_TURNS = {Q1: ['<query>{"query": "Zorblax Rising novel author"}</query>',
                 "<important_info>[1]</important_info><search_complete>True</search_complete>"]}


def test_a_base_model_answer_after_a_blank_line_is_kept(gemma_tokenizer):
    """A completion that opens with a newline (half of Gemma 3 270M's answers) is not an empty answer:
    the reply is the first non-empty line, as the naive-RAG baseline reads its own."""

    def after_a_blank_line(context: str) -> str:  # the reply continues the context it is given
        return " Mira Tolven\nQuestion: who else?" if context.endswith("Answer:\n") else "\n"

    engine = ScriptedEngine(gemma_tokenizer, after_a_blank_line)
    llm = FrozenLLM(engine, "scripted", chat=False)
    assert asyncio.run(llm.generate_answer("Who?", "ctx")) == "Mira Tolven"
    assert len(engine.requests) == 2 and llm.stats["generated"] == 1  # one answer, two engine calls
    cue = ScriptedEngine(gemma_tokenizer, lambda context: " Answer: Mira Tolven\n")
    assert asyncio.run(FrozenLLM(cue, "scripted", chat=False).generate_answer("Who?", "ctx")) == "Mira Tolven"
    blank = ScriptedEngine(gemma_tokenizer, lambda context: "\n")  # never says anything: bounded rounds
    assert asyncio.run(FrozenLLM(blank, "scripted", chat=False).generate_answer("Who?", "ctx")) == ""
    assert len(blank.requests) == 3


def run_s3(gemma_tokenizer, example, n, turns=S3_TURNS, **options):
    """Scripted s3 episodes whose rewards call a scripted frozen generator through ThreadScorer."""

    async def go():
        frozen = FrozenLLM(ScriptedEngine(gemma_tokenizer, answering_policy), "scripted", chat=False)
        scorer = ThreadScorer(asyncio.get_running_loop(), frozen)
        policy = ScriptedEngine(gemma_tokenizer, turn_policy(turns))
        loop = AgentLoop(policy, get_recipe("s3", **options), make_searcher(), Sampling(), chat=False, scorer=scorer)
        return await loop.run_batch([example], n=n), frozen

    return asyncio.run(go())


def test_s3_rewards_inside_the_agent_loop_use_the_frozen_llm(gemma_tokenizer):
    """The s3 reward calls the frozen generator from a worker thread while the loop keeps running."""
    trajs, frozen = run_s3(gemma_tokenizer, ex("1", Q1, ["Mira Tolven"]), n=3)
    for t in trajs:
        assert t.reward == 1.0 and t.reward_components["gen_acc_rag"] == 0.0
        assert t.final["answer"] == "Mira Tolven"
    # Three samples of one question: the naive-RAG baseline and the s3 answer are generated once each
    # (concurrent identical prompts share one generation), the judge once for the RAG answer.
    assert frozen.stats["generated"] == 3 and frozen.stats["calls"] >= 5  # 3 s3 answers + RAG answer(s) + judge


def test_s3_gain_beyond_rag_in_answer_f1(gemma_tokenizer):
    """`reward_metric: f1`: the gain is the generator's answer F1 from the s3 context minus its F1 from
    naive RAG's, with no judge call; a precomputed GenAcc baseline is not used for it."""
    example = {**ex("1", Q1, ["Mira Tolven"]), "meta": {"rag_gen_acc": 1.0}}
    (traj,), frozen = run_s3(gemma_tokenizer, example, n=1, reward_metric="f1")
    assert traj.final["answer"] == "Mira Tolven"
    assert traj.reward_components == {"gen_acc_s3": 1.0, "gen_acc_rag": 0.0, "gain_beyond_rag": 1.0}
    assert traj.reward == 1.0 and frozen.stats["generated"] == 2  # the s3 and the RAG answers; no judge
    assert get_recipe("s3", reward_metric="f1").frozen_roles() == ("generator",)


def test_s3_prefill_starts_the_searchers_selection(gemma_tokenizer):
    """`prefill: "<important_info>["`: the searcher's first turn continues the selection; the ids it
    writes choose the initial documents the generator reads."""
    turns = {Q1: ["2]</important_info><search_complete>True</search_complete>"]}
    (traj,), _ = run_s3(gemma_tokenizer, ex("1", Q1, ["Mira Tolven"]), n=1, turns=turns,
                        prefill="<important_info>[", reward_metric="f1")
    recipe = get_recipe("s3", prefill="<important_info>[")
    assert recipe.build_prompt(Q1, [], chat=False).completion.endswith("</information>\n<important_info>[")
    assert traj.finish_reason == "complete" and len(traj.final["selected_doc_ids"]) == 1


def test_precomputed_rag_baseline_in_question_meta_is_used(gemma_tokenizer):
    """A training set prepared with `meta.rag_gen_acc` (s3 §4.1) reaches the reward: no RAG generation."""
    example = {**ex("1", Q1, ["Mira Tolven"]), "meta": {"rag_gen_acc": 1.0}}
    (traj,), frozen = run_s3(gemma_tokenizer, example, n=1)
    assert traj.reward_components["gen_acc_rag"] == 1.0 and traj.reward == 0.0  # gain over a solved RAG = 0
    assert frozen.stats["generated"] == 1  # only the s3 answer


def test_over_long_prompts_are_cut_in_the_middle_to_fit_the_engine(gemma_tokenizer):
    """A context longer than the frozen model's window loses its middle, never the question or cue."""
    engine = ScriptedEngine(gemma_tokenizer, answering_policy)
    engine.max_model_len = 300
    llm = FrozenLLM(engine, "scripted", chat=False, max_answer_tokens=20)
    context = " ".join(f"Passage {i} about the Zorblax Rising novel author." for i in range(200))
    answer = asyncio.run(llm.generate_answer("Who wrote Zorblax Rising?", context))
    prompt_ids, _ = engine.requests[0]
    text = gemma_tokenizer.decode(prompt_ids, skip_special_tokens=True)
    assert len(prompt_ids) == 280 and llm.stats["truncated"] == 1
    assert text.startswith(ANSWER_PROMPT[:30]) and "Question: Who wrote Zorblax Rising?" in text
    assert text.endswith("without any other text.\nAnswer:")
    assert answer == "Mira Tolven"
