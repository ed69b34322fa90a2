"""The frozen LLMs' on-disk answer store: shared across FrozenLLMs (methods, runs, restarts), keyed by the
rendered prompt and every setting that decides an answer, so a changed setting misses."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from actors.frozen.answer_store import AnswerStore, answer_key, model_fingerprint, store_path
from actors.frozen.scorer import FrozenLLM
from tests.scripted_engine import ScriptedEngine


def answers(engine, store, questions, **options):
    llm = FrozenLLM(engine, "scripted", chat=False, store=store, **options)

    async def go():
        return [await llm.generate_answer(q, "ctx") for q in questions]

    return asyncio.run(go()), llm.stats


def test_a_second_frozen_llm_reads_the_first_ones_answers(gemma_tokenizer, tmp_path):
    store = AnswerStore(tmp_path / "answers.sqlite")
    first = ScriptedEngine(gemma_tokenizer, lambda context: " Paris\n")
    got, stats = answers(first, store, ["Capital of France?", "Largest city of France?"])
    assert got == ["Paris", "Paris"] and stats["generated"] == 2 and len(store) == 2
    # another run (a new process: a new connection to the same file) with an engine that would answer otherwise
    again = ScriptedEngine(gemma_tokenizer, lambda context: " Lyon\n")
    got, stats = answers(again, AnswerStore(tmp_path / "answers.sqlite"), ["Capital of France?", "Who?"])
    assert got == ["Paris", "Lyon"] and stats["store_hits"] == 1 and stats["generated"] == 1
    assert len(again.requests) == 1  # the stored answer was not generated again


def test_a_changed_setting_misses(gemma_tokenizer, tmp_path):
    store = AnswerStore(tmp_path / "answers.sqlite")
    answers(ScriptedEngine(gemma_tokenizer, lambda context: " Paris\n"), store, ["Capital of France?"])
    other = ScriptedEngine(gemma_tokenizer, lambda context: " Lyon\n")
    got, _ = answers(other, store, ["Capital of France?"], max_answer_tokens=32)  # not the default 64
    assert got == ["Lyon"] and len(other.requests) == 1 and len(store) == 2
    chat = FrozenLLM(other, "scripted", chat=True, store=store)
    base = FrozenLLM(other, "scripted", chat=False, store=store)
    assert answer_key(chat.identity(), [1, 2]) != answer_key(base.identity(), [1, 2])
    assert answer_key(base.identity(), [1, 2]) != answer_key(base.identity(), [1, 3])  # the prompt's tokens


def test_a_model_folder_with_new_weights_is_a_new_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    before = model_fingerprint(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"y" * 11)
    assert model_fingerprint(str(tmp_path)) != before
    assert model_fingerprint("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"


def test_where_the_store_lives(monkeypatch, tmp_path):
    monkeypatch.delenv("SEARCHRL_ANSWER_CACHE")
    assert store_path("auto").name == "frozen-answers.sqlite" and store_path(None) is None
    monkeypatch.setenv("SEARCHRL_ANSWER_CACHE", "off")
    assert store_path("auto") is None
    monkeypatch.setenv("SEARCHRL_ANSWER_CACHE", str(tmp_path / "a.sqlite"))
    assert store_path("auto") == tmp_path / "a.sqlite" and store_path("/x/b.sqlite").name == "b.sqlite"


def test_a_file_that_is_no_database_names_the_key(tmp_path):
    bad = tmp_path / "answers.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(sqlite3.Error, match="frozen.answer_cache"):
        AnswerStore(bad)

