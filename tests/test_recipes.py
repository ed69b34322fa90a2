"""Golden tests for the recipes, built from the papers' own worked examples (each cites its source)."""

from __future__ import annotations

import pydantic
import pytest

from recipes import RECIPES, get_recipe
from recipes.base import (
    ANSWER_PROMPT,
    Answer,
    Complete,
    Doc,
    EpisodeDoneError,
    Invalid,
    ScorerRequiredError,
    Search,
    Select,
)
from recipes.r1_searcher import format_errors
from recipes.s3 import filter_training_set, is_yes_no, parse_query


class ScriptedScorer:
    """A frozen-LLM stand-in: answers by the first key found in the context; judges by a fixed set."""

    def __init__(self, answers: dict[str, str] | None = None, default: str = "", judge_yes: set[str] | None = None):
        self.answers = answers or {}
        self.default = default
        self.judge_yes = judge_yes or set()
        self.calls: list[tuple[str, str, str]] = []
        self.judged: list[str] = []

    def generate_answer(self, question: str, context: str, template: str = ANSWER_PROMPT) -> str:
        self.calls.append((question, context, template))
        return next((a for key, a in self.answers.items() if key in context), self.default)

    def judge(self, response: str, golden_answers) -> bool:
        self.judged.append(response)
        return response in self.judge_yes


def run(recipe, episode, turns: list[str], docs: list[list[Doc]] | None = None):
    """Drive an episode with scripted turn texts; each executed search takes the next docs list."""
    docs = list(docs or [])
    for text in turns:
        turn = recipe.step(episode, text)
        if turn.needs_retrieval:
            recipe.observe(episode, docs.pop(0))
    return episode


# ---------------------------------------------------------------------------------------- s3

# s3 Table 7: the Earthship question.
EARTHSHIP_Q = (
    "What year was the film made that was about the inventor of a type of passive solar house that is made of both "
    "natural and upcycled materials such as earth-packed tires?"
)
INITIAL = [
    Doc("e1", "Earthship", "An Earthship is a type of passive solar house… pioneered by architect Michael Reynolds…"),
    Doc("e2", "Mike Reynolds", "Known for Earthship houses using recycled materials like tires…"),
    Doc("e3", "Don Stephens", "Discusses earth-integrated designs and upcycled materials…"),
]
SECOND = [
    Doc("g1", "Garbage Warrior", "Garbage Warrior is a 2007 film about architect Mike Reynolds, inventor of the Earthship style of building…"),
    Doc("g2", "Garbage Warrior", "A 2007 film following Reynolds and his Earthship building…"),
    Doc("e4", "Earthship", "Mentions the film Garbage Warrior and its focus on off-grid housing…"),
]
TABLE7_TURNS = [
    "<search_complete> False </search_complete>",
    '\n<query> What year was the film made about the inventor of Earthship?" </query>',
    "<important_info>[1, 2]</important_info>\n<search_complete> True </search_complete>",
]
RAG_ANSWER = (
    "There is no specific year mentioned for a film made about the inventor of the Earthship, which is a type of "
    "passive solar house made of natural and upcycled materials like earth-packed tires. The information provided "
    "does not include details about a particular film or its release year."
)


def table7_episode(recipe):
    ep = recipe.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    return run(recipe, ep, TABLE7_TURNS, [SECOND])


def test_s3_table7_trajectory_and_final_context():
    """s3 Table 7: one focused query, docs [1, 2] selected, search complete; five searched docs."""
    s3 = get_recipe("s3")
    ep = table7_episode(s3)
    actions = [t.action for t in ep.turns]
    assert actions == [
        Select(None),
        Search("What year was the film made about the inventor of Earthship?"),
        Complete((1, 2)),
    ]
    assert ep.done and ep.stop_reason == "complete"
    # Appendix A.5: the initial block has no <important_info> → all three; the second → docs 1, 2.
    assert [d.doc_id for d in ep.final.selected_docs] == ["e1", "e2", "e3", "g1", "g2"]
    assert ep.turns[0].observation == ""  # a Select inserts nothing
    assert '<information>\nDoc 1(Title: "Garbage Warrior") Garbage Warrior is a 2007 film' in ep.turns[1].observation
    assert 'Doc 1(Title: "Earthship") An Earthship' in ep.prompt.completion  # begin with search


def test_s3_gain_beyond_rag_reward_table7():
    """s3 Eq. 1 on Table 7: the s3 answer "2007" is right, the RAG answer is not → GBR = 1."""
    scorer = ScriptedScorer({"Garbage Warrior": "2007"}, default=RAG_ANSWER)
    s3 = get_recipe("s3")
    ep = table7_episode(s3)
    reward = s3.reward(ep, scorer)
    assert reward.components == {"gen_acc_s3": 1.0, "gen_acc_rag": 0.0, "gain_beyond_rag": 1.0}
    assert reward.total == 1.0
    assert ep.final.answer == "2007"
    assert scorer.judged == [RAG_ANSWER]  # judge only when the span check fails (s3 App. A.4)
    assert scorer.calls[0][2] == ANSWER_PROMPT and "Doc 5(Title: \"Garbage Warrior\")" in scorer.calls[0][1]
    # The baseline term is computed once per question and cached (s3 §3.2).
    s3.reward(table7_episode(s3), scorer)
    rag_calls = [c for c in scorer.calls if "Garbage Warrior" not in c[1]]
    assert len(rag_calls) == 1
    # The released code's variant: (s3 − RAG) + s3.
    code = get_recipe("s3", reward_variant="code")
    assert code.reward(table7_episode(code), scorer).total == 2.0


def test_s3_reward_uses_precomputed_baseline_and_judge():
    scorer = ScriptedScorer(default="Mike Reynolds' film came out that year", judge_yes={"Mike Reynolds' film came out that year"})
    s3 = get_recipe("s3")
    ep = table7_episode(s3)
    ep.meta["rag_gen_acc"] = 1.0
    reward = s3.reward(ep, scorer)
    assert reward.components["gen_acc_s3"] == 1.0  # the judge said yes
    assert reward.total == 0.0  # no gain beyond a RAG that already succeeded
    assert all("Garbage Warrior" in c[1] for c in scorer.calls)  # baseline not recomputed
    no_judge = get_recipe("s3", use_judge=False)
    assert no_judge.reward(table7_episode(no_judge), scorer).components["gen_acc_s3"] == 0.0
    with pytest.raises(ScorerRequiredError, match="s3"):
        s3.reward(ep)


def test_s3_parse_forms():
    s3 = get_recipe("s3")
    assert s3.parse('<query>{"query": "Mike Reynolds film"}</query>') == Search("Mike Reynolds film")
    assert s3.parse("<query> Mike Reynolds film </query>") == Search("Mike Reynolds film")
    # Selection, search_complete False and a query in one turn (no stop at </search_complete>).
    assert s3.parse(
        "<important_info>[2]</important_info>\n<search_complete>False</search_complete>\n<query>next</query>"
    ) == Search("next", (2,))
    assert s3.parse("<important_info>[1, 3]</important_info><search_complete>False</search_complete>") == Select((1, 3))
    assert s3.parse("<search_complete>true</search_complete>") == Complete(None)
    assert s3.parse("<important_info>[]</important_info><search_complete>True</search_complete>") == Complete(())
    assert isinstance(s3.parse("<query>  </query>"), Invalid)
    assert isinstance(s3.parse("<search_complete>maybe</search_complete>"), Invalid)
    assert isinstance(s3.parse("I think the answer is 2007."), Invalid)
    assert parse_query('"quoted"') == "quoted"
    assert parse_query('{"q": 1}') == '{"q": 1}'


def test_s3_selection_window_cap_and_dedupe():
    """A.5: selection applies to the latest block; ids outside it are dropped; ≤ 3 kept; dedupe by content."""
    s3 = get_recipe("s3")
    dup = Doc("x9", INITIAL[0].title, INITIAL[0].text)  # same content as initial doc 1
    block = [dup, *SECOND, Doc("z", "Z", "z text")]
    ep = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    run(s3, ep, [
        "<important_info>[2, 7]</important_info><query>q1</query>",  # selects initial doc 2; 7 is outside
        "<important_info>[5, 4, 3, 2, 1]</important_info><search_complete>True</search_complete>",
    ], [block])
    ids = [d.doc_id for d in ep.final.selected_docs]
    # Block 2 keeps the first three valid ids (5, 4, 3) in document order; none duplicates.
    assert ids == ["e2", "g2", "e4", "z"]
    ep2 = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    run(s3, ep2, ["<query>q1</query>", "<search_complete>True</search_complete>"], [[dup, SECOND[0]]])
    assert [d.doc_id for d in ep2.final.selected_docs] == ["e1", "e2", "e3", "g1"]  # dup dropped


def test_s3_unselected_search_block_none_adds_only_what_is_selected():
    """`unselected_search_block: none`: a search's block without a selection gives the generator nothing, a
    selected one its selection; the initial top-k is still read whole when unselected (App. A.5)."""
    third = [Doc("t1", "T1", "t1 text"), Doc("t2", "T2", "t2 text")]
    turns = ["<query>q1</query>", "<important_info>[2]</important_info><query>q2</query>",
             "<search_complete>True</search_complete>"]
    contexts = {}
    for mode in ("all", "none"):
        s3 = get_recipe("s3", unselected_search_block=mode)
        ep = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
        run(s3, ep, turns, [SECOND, third])
        contexts[mode] = [d.doc_id for d in ep.final.selected_docs]
    assert contexts["all"] == ["e1", "e2", "e3", *(d.doc_id for d in SECOND[1:2]), "t1", "t2"]
    assert contexts["none"] == ["e1", "e2", "e3", SECOND[1].doc_id]
    with pytest.raises(ValueError, match="unselected_search_block"):
        get_recipe("s3", unselected_search_block="some")


def test_s3_initial_block_keep_reads_the_top_k_whole_whatever_is_selected():
    """`initial_block: keep`: a selection on the initial top-k is ignored (the context holds naive RAG's); a
    search's block still gives what is selected of it; `select` (the default) keeps App. A.5."""
    turns = ["<important_info>[]</important_info><query>q1</query>",
             "<important_info>[2]</important_info><search_complete>True</search_complete>"]
    contexts = {}
    for mode in ("select", "keep"):
        s3 = get_recipe("s3", initial_block=mode, unselected_search_block="none")
        ep = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
        run(s3, ep, turns, [SECOND])
        contexts[mode] = [d.doc_id for d in ep.final.selected_docs]
    assert contexts == {"select": [SECOND[1].doc_id], "keep": ["e1", "e2", "e3", SECOND[1].doc_id]}
    with pytest.raises(ValueError, match="initial_block"):
        get_recipe("s3", initial_block="drop")


def test_s3_found_reward_pays_for_keeping_a_gold_answer_the_top_k_lacked():
    """`found_reward`: Eq. 1 plus the term where the context holds a gold answer (span check) that the initial
    top-k lacks; nothing for one that selects nothing of the search, nor where the top-k already held one."""
    scorer = ScriptedScorer({}, default=RAG_ANSWER)  # the generator is wrong everywhere: Eq. 1 gives 0
    s3 = get_recipe("s3", initial_block="keep", unselected_search_block="none", found_reward=0.5)
    totals = {}
    for sel in ("[2]", "[3]", "[]"):  # SECOND: documents 1 and 2 hold "2007", 3 does not
        ep = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
        run(s3, ep, ["<query>q1</query>", f"<important_info>{sel}</important_info><search_complete>True"
                     "</search_complete>"], [SECOND])
        r = s3.reward(ep, scorer)
        totals[sel] = (r.total, r.components["found"], r.components["gain_beyond_rag"])
    assert totals == {"[2]": (0.5, 1.0, 0.0), "[3]": (0.0, 0.0, 0.0), "[]": (0.0, 0.0, 0.0)}
    held = s3.start(EARTHSHIP_Q, ["Earthship"], INITIAL, chat=False)  # the top-k holds the answer already
    run(s3, held, ["<query>q1</query>", "<important_info>[3]</important_info><search_complete>True</search_complete>"],
        [SECOND])
    assert s3.reward(held, scorer).components["found"] == 0.0
    assert "found" not in get_recipe("s3").reward(table7_episode(get_recipe("s3")), scorer).components
    with pytest.raises(ValueError, match="found_reward"):
        get_recipe("s3", found_reward=-1.0)


def test_s3_max_selected_search_caps_a_search_blocks_selection_not_the_top_k():
    """`max_selected_search: 1`: a search's block keeps the id written first, the initial top-k keeps up to
    `max_selected`; the expert selects one answer-holding document of a search's block."""
    s3 = get_recipe("s3", max_selected_search=1, unselected_search_block="none")
    ep = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    run(s3, ep, ["<important_info>[3, 1]</important_info><query>q1</query>",
                 "<important_info>[3, 1]</important_info><search_complete>True</search_complete>"], [SECOND])
    assert [d.doc_id for d in ep.final.selected_docs] == ["e1", "e3", "e4"]
    assert (s3.selection_cap(0), s3.selection_cap(1), get_recipe("s3").selection_cap(1)) == (3, 1, 3)
    expert = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    run(s3, expert, ["<query>q1</query>"], [SECOND])  # SECOND holds "2007" in documents 1 and 2
    assert s3.expert_turn(expert).startswith("<important_info>[1]</important_info>")
    with pytest.raises(ValueError, match="max_selected_search"):
        get_recipe("s3", max_selected_search=0)


def test_s3_turn_limit_and_invalid_feedback():
    s3 = get_recipe("s3", max_turns=2)
    ep = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    turn = s3.step(ep, "Let me think.")
    assert isinstance(turn.action, Invalid) and "<query>" in turn.observation
    run(s3, ep, ["<query>a</query>"], [SECOND])
    last = s3.step(ep, "<query>b</query>")  # steps used: invalid + search = 2 → not executed
    assert ep.done and ep.stop_reason == "max_turns" and last.skipped and not last.needs_retrieval
    with pytest.raises(EpisodeDoneError):
        s3.step(ep, "<query>c</query>")


def test_s3_select_only_one_turn_picks_the_first_selection():
    """max_turns 0: generation stops at </important_info>, the prefilled selection completes the episode
    with the ids written first; a turn without a selection leaves all initial documents (A.5)."""
    s3 = get_recipe("s3", max_turns=0, prefill="<important_info>[")
    assert "</important_info>" in s3.stop_strings and "</important_info>" not in get_recipe("s3").stop_strings
    ep = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    turn = s3.step(ep, "3, 1]</important_info>\n<important_info>[2]</important_info>")
    assert turn.action == Complete((3, 1)) and ep.done and ep.stop_reason == "complete"
    assert [d.doc_id for d in ep.final.selected_docs] == ["e1", "e3"]
    ep2 = s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    s3.step(ep2, "1, 2, 3, 4, 5, 6, 7, 8, 9")  # ran out of tokens before closing the tag
    assert ep2.done and ep2.stop_reason == "max_turns" and len(ep2.turns) == 1
    assert [d.doc_id for d in ep2.final.selected_docs] == ["e1", "e2", "e3"]


def test_s3_no_selection_reward_closes_the_naive_rag_harbour():
    """`no_selection_reward`: an episode that selected nothing (cut at the token limit) is naive RAG by A.5,
    a gain of exactly 0 under Eq. 1; with the option it gets the set reward instead, and a selecting
    episode keeps Eq. 1."""
    scorer = ScriptedScorer({}, default="2007")  # every context gives the same answer: every gain is 0
    paper = get_recipe("s3", max_turns=0, prefill="<important_info>[", reward_metric="f1")
    s3 = get_recipe("s3", max_turns=0, prefill="<important_info>[", reward_metric="f1", no_selection_reward=-0.5)
    cut, picked = (s3.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False) for _ in range(2))
    s3.step(cut, "1, 2, 3, 4, 5, 6, 7, 8, 9")
    s3.step(picked, "2]</important_info>")
    cut_paper = paper.start(EARTHSHIP_Q, ["2007"], INITIAL, chat=False)
    paper.step(cut_paper, "1, 2, 3, 4, 5, 6, 7, 8, 9")
    assert paper.reward(cut_paper, scorer).total == 0.0  # the paper: no selection = naive RAG, gain 0
    r = s3.reward(cut, scorer)
    assert r.total == -0.5 and r.components["no_selection"] == 1.0 and r.components["gain_beyond_rag"] == 0.0
    r = s3.reward(picked, scorer)
    assert r.total == 0.0 and r.components["no_selection"] == 0.0


def test_s3_training_filter():
    """s3 §4.1: drop yes/no/true/false questions and those naive RAG already answers."""

    class Ex:
        def __init__(self, id, golds):
            self.id, self.golden_answers = id, golds

    examples = [Ex("a", ["Yes"]), Ex("b", ["true"]), Ex("c", ["2007"]), Ex("d", ["Paris"]), Ex("e", ["no."])]
    rag = {"c": 0.0, "d": 1.0}
    kept = filter_training_set(examples, lambda ex: rag.get(ex.id, 0.0))
    assert [ex.id for ex in kept] == ["c"]
    assert is_yes_no(["No"]) and not is_yes_no(["Norway"])


def test_begin_with_search_recipes_need_initial_docs():
    for name in ("s3", "naive_rag"):
        with pytest.raises(ValueError, match="initial_docs"):
            get_recipe(name).start("q?", ["a"])


# ------------------------------------------------------------------------------------- R-Search

# R-Search Table 8 (MuSiQue, 2 hops). The extracted PDF lost the slashes of two closing tags
# ("observation>", "<original_evidence>"); the trajectory below restores them.
FLEET_Q = "When was countrywide bought by the company that bought FleetBoston Financial?"
FLEET_TURNS = [
    "To answer this question, we need to follow these steps:\n1. Identify the company that bought FleetBoston "
    "Financial.\n2. Determine when this company bought Countrywide.\nLet's start with step 1.\n"
    "<search> FleetBoston Financial was bought by whom? </search>",
    "From the observations, we can conclude that FleetBoston Financial was bought by Bank of America in 2004. "
    "Now, let's move to step 2.\n<search> When did Bank of America buy Countrywide? </search>",
    "From the observations, we can conclude that Bank of America bought Countrywide on July 1, 2008.\n"
    "<original_evidence>- FleetBoston Financial was bought by Bank of America in 2004.\n"
    "- Bank of America bought Countrywide on July 1, 2008. </original_evidence>\n<answer> July 1, 2008 </answer>",
]
FLEET_DOCS = [
    [Doc("b1", "Bank of America", "In 2004, Bank of America announced it would purchase Boston - based bank FleetBoston Financial for $47 billion in cash and stock."),
     Doc("b2", "Boston", "Boston is an intellectual, technological, and political center")],
    [Doc("b3", "Bank of America Home Loans", "On July 1, 2008, Bank of America Corporation completed its purchase of Countrywide Financial Corporation."),
     Doc("b4", "General Tire", "GenCorp sold General Tire to German tire maker Continental AG in 1987")],
]


def test_r_search_table8_rewards():
    """R-Search Table 8: evidence and answer extracted; format reward γe + γa = 0.4 (Eq. 5)."""
    rs = get_recipe("r_search")
    ep = run(rs, rs.start(FLEET_Q, ["July 1, 2008"], chat=False), FLEET_TURNS, FLEET_DOCS)
    assert ep.stop_reason == "answer" and ep.num_searches == 2
    assert ep.final.answer == "July 1, 2008"
    assert ep.final.evidence.startswith("- FleetBoston Financial was bought by Bank of America in 2004.")
    assert ep.turns[0].observation.startswith("\n\n<observation>Doc 1(Title: \"Bank of America\")")
    # Observations are environment text (masked); the evidence is generated text (not masked).
    assert "<original_evidence>" in ep.generated_text and "<observation>" not in ep.generated_text
    scorer = ScriptedScorer({"Countrywide on July 1, 2008": "July 1, 2008"})
    reward = rs.reward(ep, scorer)
    assert reward.components["format"] == pytest.approx(0.4)
    assert reward.components["answer_f1"] == 1.0 and reward.components["evidence_f1"] == 1.0
    assert reward.total == pytest.approx(2.4)
    # The cross-family model saw the evidence alone, in the Table 5 template.
    question, context, template = scorer.calls[0]
    assert question == FLEET_Q and context == ep.final.evidence and template.startswith("Answer the question based on")


def test_r_search_format_reward_cases():
    rs = get_recipe("r_search")
    scorer = ScriptedScorer(default="1999")
    # Searched but no evidence box: γa only; evidence reward 0 (nothing to judge), no scorer call.
    no_evidence = [FLEET_TURNS[0], "<answer> July 1, 2008 </answer>"]
    ep = run(rs, rs.start(FLEET_Q, ["July 1, 2008"]), no_evidence, FLEET_DOCS)
    reward = rs.reward(ep, scorer)
    assert reward.components == {"answer_f1": 1.0, "evidence_f1": 0.0, "format": pytest.approx(0.2)}
    assert scorer.calls == []
    # No search: the evidence is rightly omitted, γe is granted (Eq. 5's first term).
    ep = run(rs, rs.start(FLEET_Q, ["July 1, 2008"]), ["I know it. <answer> 2008 </answer>"])
    assert rs.reward(ep, scorer).components["format"] == pytest.approx(0.4)
    # Two evidence boxes are not "exactly one".
    twice = FLEET_TURNS[2].replace("<answer>", "<original_evidence>x</original_evidence><answer>")
    ep = run(rs, rs.start(FLEET_Q, ["July 1, 2008"]), [*FLEET_TURNS[:2], twice], FLEET_DOCS)
    assert rs.reward(ep, scorer).components["format"] == pytest.approx(0.2)
    with pytest.raises(ScorerRequiredError):
        rs.reward(run(rs, rs.start(FLEET_Q, ["x"]), FLEET_TURNS, FLEET_DOCS))
    off = get_recipe("r_search", evidence_reward=False)
    assert off.reward(run(off, off.start(FLEET_Q, ["July 1, 2008"]), FLEET_TURNS, FLEET_DOCS)).total == pytest.approx(1.4)


# ------------------------------------------------------------------------------------- Eval-RAR

# Eval-RAR Appendix A.3: "When did the person who gave the Checkers speech die?"
CHECKERS_Q = "When did the person who gave the Checkers speech die?"
CHECKERS_DOCS = [
    [Doc("c1", "Checkers speech", "know why,\"\" which contributed to the failure of his 1960 presidential run ..."),
     Doc("c2", "Checkers speech", "Checkers speech The Checkers speech or Fund speech was an address made on September 23, 1952, by the Republican candidate for Vice President of the United States, California Senator Richard Nixon. ..."),
     Doc("c3", "Checkers speech", "in later years, Hal Bochín (who wrote a book about Nixon's rhetoric) suggests that Nixon succeeded at the time ...")],
    [Doc("n1", "Death and state funeral of Richard Nixon", "Death and state funeral of Richard Nixon On April 22, 1994 ..."),
     Doc("n2", "Death and state funeral of Richard Nixon", "brain ..."),
     Doc("n3", "Richard Nixon", "Hospital–Cornell Medical Center in Manhattan ...")],
]
EVAL_RAR_TURNS = [
    "<think>The target question refers to a historical figure who delivered a speech involving a 'Checkers' "
    "reference. I need to identify this person first and then find out when they passed away.</think>\n"
    "<search>When did the person who gave the Checkers speech die</search>",
    "<evaluate>From the information gathered, the target person delivering the Checkers speech is Richard Nixon. "
    "Now, the main concern is to find the death date of Richard Nixon.</evaluate>\n<search>When did Richard Nixon die</search>",
    "<evaluate> With the target person identified as Richard Nixon and the date of death confirmed, we can now "
    "answer the target question.</evaluate>\n<answer>April 22, 1994</answer>",
]


def test_eval_rar_case_study_em_reward():
    """Eval-RAR A.3: two <evaluate> blocks, the right answer → R_ans = 1 (Eq. 5)."""
    er = get_recipe("eval_rar")
    ep = run(er, er.start(CHECKERS_Q, ["April 22, 1994"]), EVAL_RAR_TURNS, CHECKERS_DOCS)
    assert [type(t.action) for t in ep.turns] == [Search, Search, Answer]
    assert ep.generated_text.count("<evaluate>") == 2
    assert '<information>Doc 1(Title: "Checkers speech")' in ep.turns[0].observation
    reward = er.reward(ep)
    assert reward.total == 1.0 and reward.components["answer_em"] == 1.0


def test_eval_rar_evaluation_reward_when_answer_wrong():
    """Eqs. 3–5: wrong answer, gold inside an evaluation → r_eval = 0.1; not inside → 0."""
    er = get_recipe("eval_rar")
    cited = EVAL_RAR_TURNS[2].replace(
        "the date of death confirmed", "the date of death confirmed (On April 22, 1994)"
    ).replace("<answer>April 22, 1994</answer>", "<answer>September 23, 1952</answer>")
    ep = run(er, er.start(CHECKERS_Q, ["April 22, 1994"]), [*EVAL_RAR_TURNS[:2], cited], CHECKERS_DOCS)
    reward = er.reward(ep)
    assert reward.total == pytest.approx(0.1)
    assert reward.components == {"answer_em": 0.0, "eval_contains_gold": 1.0, "eval_reward": pytest.approx(0.1)}
    wrong = EVAL_RAR_TURNS[2].replace("April 22, 1994", "September 23, 1952")
    ep = run(er, er.start(CHECKERS_Q, ["April 22, 1994"]), [*EVAL_RAR_TURNS[:2], wrong], CHECKERS_DOCS)
    assert er.reward(ep).total == 0.0
    # The gold inside the retrieved documents (not an evaluation) earns nothing.
    assert "April 22, 1994" in ep.response_text


def test_eval_rar_invalid_action_feedback():
    """Algorithm 1, line 22: an action without <search>/<answer> appends the retry sentence."""
    er = get_recipe("eval_rar")
    ep = er.start(CHECKERS_Q, ["April 22, 1994"])
    turn = er.step(ep, "<think>I should look this up.</think>")
    assert isinstance(turn.action, Invalid) and not ep.done
    assert "My action is wrong. Let me try again." in turn.observation


def test_search_r1_on_the_checkers_case():
    """Eval-RAR A.3's Search-R1 trajectory answers the speech date: EM 0."""
    sr = get_recipe("search_r1")
    turns = [
        "<think>The Checkers speech was given by Richard Nixon in 1952.</think>\n<search>person who gave the Checkers speech died</search>",
        "<answer>September 23, 1952</answer>",
    ]
    ep = run(sr, sr.start(CHECKERS_Q, ["April 22, 1994"]), turns, CHECKERS_DOCS[:1])
    assert sr.reward(ep).total == 0.0
    ep = run(sr, sr.start(CHECKERS_Q, ["April 22, 1994"]), [turns[0], "<answer> april 22, 1994. </answer>"], CHECKERS_DOCS[:1])
    assert sr.reward(ep).total == 1.0


def test_search_r1_turn_limit_gives_one_last_turn():
    sr = get_recipe("search_r1", max_turns=2)
    ep = sr.start("q?", ["a"])
    run(sr, ep, ["<search>x</search>", "<search>y</search>"], [[Doc("1", "t", "x")], [Doc("2", "t", "y")]])
    assert not ep.done and ep.num_searches == 2
    turn = sr.step(ep, "<search>z</search>")
    assert ep.done and ep.stop_reason == "max_turns" and turn.skipped and ep.num_searches == 2
    ep = run(sr, sr.start("q?", ["Paris"]), ["<search>x</search>", "<search>y</search>", "<answer>paris</answer>"],
             [[Doc("1", "t", "x")], [Doc("2", "t", "y")]])
    assert ep.stop_reason == "answer" and sr.reward(ep).total == 1.0


def test_search_r1_first_complete_block_is_the_action():
    sr = get_recipe("search_r1")
    assert sr.parse("<think>x</think><search> a </search><answer>b</answer>") == Search("a")
    assert sr.parse("<search>a<answer>b</answer>") == Answer("b")
    assert isinstance(sr.parse("<search></search>"), Invalid)
    assert sr.stop_strings == ("</search>", "</answer>")


# ----------------------------------------------------------------------------------- R1-Searcher

R1_Q = "Who directed the film that won Best Picture in 1998?"


def r1_episode(recipe, turns, docs=None):
    return run(recipe, recipe.start(R1_Q, ["James Cameron"], chat=False), turns, docs)


R1_DOCS = [[Doc("t1", "Titanic (1997 film)", "Titanic is a 1997 film directed by James Cameron. It won Best Picture.")]]
R1_COMPLIANT = [
    " I need the Best Picture winner first. <|begin_of_query|> Best Picture 1998 winner<|end_of_query|>",
    "Titanic won, directed by James Cameron. </think>\n<answer> James Cameron </answer>",
]


def test_r1_searcher_prompt_and_masked_documents():
    r1 = get_recipe("r1_searcher")
    ep = r1_episode(r1, R1_COMPLIANT, R1_DOCS)
    assert ep.prompt.completion.endswith(f"User:{R1_Q}\nAssistant: <think>")
    assert ep.response_text.startswith("<think> I need")
    assert ep.turns[0].action == Search("Best Picture 1998 winner")
    assert ep.turns[0].observation.strip().startswith("<|begin_of_documents|>")
    assert ep.turns[0].observation.strip().endswith("<|end_of_documents|>")
    assert r1.stop_strings == ("<|end_of_query|>", "</answer>")


def test_r1_searcher_format_rules():
    """R1-Searcher §2.2.1: compliant output passes; documents without a query, missing think, two answers fail."""
    r1 = get_recipe("r1_searcher")
    ep = r1_episode(r1, R1_COMPLIANT, R1_DOCS)
    assert format_errors(ep.response_text, ep.generated_text) == []
    fake_docs = r1_episode(r1, [
        " Let me recall. <|begin_of_documents|> Titanic by James Cameron <|end_of_documents|> </think><answer> James Cameron </answer>"
    ])
    assert "documents written without retrieval" in format_errors(fake_docs.response_text, fake_docs.generated_text)
    chat = get_recipe("r1_searcher")
    no_think = run(chat, chat.start(R1_Q, ["James Cameron"], chat=True), ["<answer> James Cameron </answer>"])
    assert "no <think>…</think> block" in format_errors(no_think.response_text, no_think.generated_text)
    two = "</think><answer> a </answer> <answer> James Cameron </answer>"
    assert format_errors("<think>x" + two, "<think>x" + two)
    assert "garbled text" in format_errors("<think>x</think><answer>a\ufffd</answer>", "<think>x</think><answer>a\ufffd</answer>")
    assert "answer is empty or holds tags" in format_errors("<think>x</think><answer> <b>a</b> </answer>", "")


def test_r1_searcher_stage_rewards():
    """Stage 1: 0.5 retrieval (Eq. 1) + 0.5 format (Eq. 2); stage 2: F1 (Eq. 4) + 0 / −2 (Eq. 3)."""
    stage1, stage2 = get_recipe("r1_searcher", stage=1), get_recipe("r1_searcher", stage=2)
    good1 = r1_episode(stage1, R1_COMPLIANT, R1_DOCS)
    assert stage1.reward(good1).components == {"retrieval": 0.5, "format": 0.5}
    good2 = r1_episode(stage2, R1_COMPLIANT, R1_DOCS)
    assert stage2.reward(good2).total == 1.0
    fake = [" <|begin_of_documents|> x <|end_of_documents|> </think><answer> Cameron </answer>"]
    assert stage1.reward(r1_episode(stage1, fake)).total == 0.0
    bad2 = stage2.reward(r1_episode(stage2, fake))
    assert bad2.components["format"] == -2.0 and bad2.total == pytest.approx(2 * 1 / 3 - 2)  # F1("Cameron", "James Cameron") = 2/3
    # A milder penalty than Eq. 3's (docs/main-job.md's base-rate probes of the 270M policy ran with -0.5).
    mild = get_recipe("r1_searcher", stage=2, format_penalty=-0.5)
    assert mild.reward(r1_episode(mild, fake)).components["format"] == -0.5
    # No answer at all: the episode ends (no feedback), F1 0, format penalty.
    dangling = r1_episode(stage2, [" I am not sure."])
    assert dangling.stop_reason == "invalid" and stage2.reward(dangling).total == -2.0
    code = get_recipe("r1_searcher", stage=1, stage1_answer_reward=True)
    assert code.reward(r1_episode(code, R1_COMPLIANT, R1_DOCS)).total == 2.0
    wrong = [R1_COMPLIANT[0], R1_COMPLIANT[1].replace("James Cameron </answer>", "Steven Spielberg </answer>")]
    assert code.reward(r1_episode(code, wrong, R1_DOCS)).total == 0.0


# ------------------------------------------------------------------------------------- baselines


def test_baselines():
    direct = get_recipe("direct")
    ep = run(direct, direct.start("Capital of France?", ["Paris"], chat=False), ["\n Answer: Paris\nQuestion: next"])
    assert ep.final.answer == "Paris" and direct.reward(ep).total == 1.0
    assert ep.prompt.completion.endswith("Answer:")
    rag = get_recipe("naive_rag", metric="f1")
    ep = rag.start("Capital of France?", ["Paris"], [Doc("1", "France", "Paris is the capital.")], chat=False)
    assert ep.prompt.completion.startswith("Use the following contexts (some might be irrelevant) on demand:")
    assert 'Doc 1(Title: "France") Paris is the capital.' in ep.prompt.completion
    run(rag, ep, ["Paris, France"])
    assert rag.reward(ep).total == pytest.approx(2 / 3)
    empty = run(direct, direct.start("q?", ["a"]), ["   "])
    assert empty.stop_reason == "invalid" and direct.reward(empty).total == 0.0
    with pytest.raises(ScorerRequiredError):
        get_recipe("direct", metric="gen_acc").reward(ep)


# ---------------------------------------------------------------------------------- interface


class ChatTokenizer:
    """Stands in for a tokenizer with a chat template (ChatML rendering)."""

    chat_template = "chatml"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + "<|im_start|>assistant\n"


def test_prompt_rendering_chat_and_completion():
    rs = get_recipe("r_search")
    chat = rs.start("Who?", ["x"], chat=True).prompt
    text = chat.render(ChatTokenizer())
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant") and text.endswith("assistant\n")
    assert "<|im_start|>user\nWho?<|im_end|>" in text
    with pytest.raises(ValueError, match="chat template"):
        chat.render(None)
    plain = rs.start("Who?", ["x"], chat=False).prompt
    assert plain.render() == plain.completion and plain.completion.endswith("Who?\n")


def test_registry_and_config_errors():
    assert set(RECIPES) == {"s3", "search_r1", "r1_searcher", "r_search", "eval_rar", "naive_rag", "direct"}
    for name, cls in RECIPES.items():
        recipe = get_recipe(name)
        assert isinstance(recipe, cls) and recipe.name == name
    with pytest.raises(KeyError, match="search_r1"):
        get_recipe("search-r1")
    with pytest.raises(pydantic.ValidationError, match="gamma_x"):
        get_recipe("r_search", gamma_x=0.3)
    with pytest.raises(pydantic.ValidationError, match="topk"):
        get_recipe("s3", topk=0)
    assert get_recipe("eval_rar").config.r_eval == 0.1 and get_recipe("r_search").config.gamma_e == 0.2


def test_step_requires_observe_and_rejects_empty_question():
    sr = get_recipe("search_r1")
    ep = sr.start("q?", ["a"])
    sr.step(ep, "<search>x</search>")
    with pytest.raises(EpisodeDoneError, match="observe"):
        sr.step(ep, "<answer>a</answer>")
    with pytest.raises(EpisodeDoneError):
        sr.observe(sr.start("q?", ["a"]), [])
    with pytest.raises(ValueError, match="question"):
        sr.start("  ", ["a"])
    # Retrieval hits (dicts) are accepted as documents.
    sr.observe(ep, [{"doc_id": 7, "title": "T", "text": "x", "score": 1.5}])
    assert ep.turns[-1].docs == [Doc("7", "T", "x", 1.5)]


@pytest.mark.parametrize("name", ["search_r1", "r1_searcher", "r_search", "eval_rar"])
def test_worked_example_is_a_valid_episode_in_the_recipe_s_own_tags(name):
    """The worked example (off by default) replays as a correct episode of the recipe itself: its
    turns parse to search, search, answer, and it sits before the question."""
    from recipes.tagged import EXAMPLE_QUESTION

    plain = get_recipe(name).start("Who wrote Hamlet?", ["Shakespeare"], chat=False).prompt
    assert EXAMPLE_QUESTION not in plain.completion
    rec = get_recipe(name, worked_example=True)
    prompt = rec.start("Who wrote Hamlet?", ["Shakespeare"], chat=False).prompt
    example = rec.example_block()
    assert example in prompt.completion and prompt.completion.index(example) < prompt.completion.index("Who wrote Hamlet?")
    body = example.split("\n", 2)[2]  # after "Example:" and the question line
    ep = rec.start(EXAMPLE_QUESTION, ["Paris"], chat=False)
    for chunk in body.split(rec.search_tags[1])[:-1]:  # each turn up to its closing search tag
        turn_text = chunk.split(rec.observation_tags[1])[-1].lstrip("\n") + rec.search_tags[1]
        rec.step(ep, turn_text[len(ep.prompt.response_prefix):] if not ep.turns else turn_text)
        assert isinstance(ep.turns[-1].action, Search)
        rec.observe(ep, [Doc("d", "t", "x")])
    rec.step(ep, body.split(rec.observation_tags[1])[-1].lstrip("\n").strip())
    assert isinstance(ep.turns[-1].action, Answer) and ep.turns[-1].action.text == "Paris"


@pytest.mark.parametrize("name", ["search_r1", "r_search", "eval_rar"])
def test_prefilled_search_tag_opens_the_first_turn(name):
    """With `prefill="<search>"` the response starts inside a search tag: the first turn's text is
    parsed together with the prefix, and the prefix counts as response text."""
    rec = get_recipe(name, prefill="<search>")
    ep = rec.start("Who wrote Hamlet?", ["Shakespeare"], chat=False)
    assert ep.prompt.completion.endswith("<search>") and ep.prompt.response_prefix == "<search>"
    rec.step(ep, " Hamlet author </search>")
    assert ep.turns[0].action == Search("Hamlet author") and ep.response_text.startswith("<search> Hamlet author")


def test_search_r1_f1_reward_gives_partial_credit():
    for metric, expected in (("em", 0.0), ("f1", pytest.approx(2 / 3))):
        rec = get_recipe("search_r1", reward_metric=metric)
        ep = rec.start("Who wrote Hamlet?", ["William Shakespeare"], chat=False)
        rec.step(ep, "<answer> Shakespeare </answer>")
        r = rec.reward(ep)
        assert r.total == expected and dict(r.components) == {metric: expected}


def test_a_user_recipe_is_named_by_import_path():
    from configs import ConfigError, load_config
    from recipes import get_recipe, recipe_class
    from tests.scripted_recipe import ParityReward

    assert recipe_class("tests.scripted_recipe:ParityReward") is ParityReward
    recipe = get_recipe("tests.scripted_recipe:ParityReward", {"max_turns": 2})
    assert recipe.config.max_turns == 2 and recipe.trainable
    cfg = load_config("configs/search_r1_cpu.yaml", ["train.recipe=tests.scripted_recipe:ParityReward"])
    assert cfg.train.recipe == "tests.scripted_recipe:ParityReward"
    for bad, match in [("tests.scripted_recipe:Nope", "does not import"), ("no_such_module:X", "does not import"),
                       ("recipes.metrics:f1_score", "not a Recipe subclass"), ("searchr1", "unknown recipe")]:
        with pytest.raises(KeyError, match=match):
            recipe_class(bad)
        with pytest.raises(ConfigError, match="train.recipe"):
            load_config("configs/search_r1_cpu.yaml", [f"train.recipe={bad}"])
