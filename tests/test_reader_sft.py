"""A reader fine-tuned to serve as s3's frozen generator: its contexts, rows and training."""

from __future__ import annotations

import multiprocessing
import random

import pytest

from actors.frozen.scorer import FrozenLLM, answer_prompt_ids
from pipelines.reader_sft import answer_in, reader_contexts, reader_rows
from recipes import get_recipe
from recipes.base import ANSWER_PROMPT, Doc

RANKED = [Doc("1", "Lyon", "Lyon is a city on the Rhone."), Doc("2", "Nice", "Nice lies on the coast."),
          Doc("3", "Paris", "Paris is the capital of France."), Doc("4", "Berlin", "Berlin is in Germany."),
          Doc("5", "Paris (band)", "Paris were a rock band."), Doc("6", "Rome", "Rome is old.")]


def test_every_context_holds_a_gold_answer_and_the_selection_holds_one_gold_document():
    for seed in range(20):
        contexts = reader_contexts(RANKED, ["Paris"], 3, random.Random(seed))
        assert contexts[0] == RANKED[:3]  # the top-3 holds the answer: naive RAG's context comes first
        selection = contexts[1]
        holding = [d for d in selection if answer_in([d], ["Paris"])]
        assert holding == [RANKED[2]] and 1 <= len(selection) <= 3  # the first gold document, no other
        assert len({d.doc_id for d in selection}) == len(selection)
    sizes = {len(reader_contexts(RANKED, ["Paris"], 3, random.Random(s))[1]) for s in range(40)}
    assert sizes == {1, 2, 3}  # selections of every size s3 allows


def test_a_top_k_without_the_answer_gives_only_the_selection_and_no_gold_gives_nothing():
    contexts = reader_contexts(RANKED, ["Germany"], 3, random.Random(0))
    assert len(contexts) == 1 and RANKED[3] in contexts[0]
    assert reader_contexts(RANKED, ["Madrid"], 3, random.Random(0)) == []
    assert answer_in(RANKED, ["Madrid", "capital of France"]) == "capital of France"


def test_the_long_context_is_the_top_k_then_more_of_the_ranking_and_always_holds_a_gold_answer():
    for seed in range(20):
        contexts = reader_contexts(RANKED, ["Paris"], 3, random.Random(seed), long_docs=5)
        assert len(contexts) == 3
        long = contexts[2]
        assert long[:3] == RANKED[:3] and len(long) == 5 and len({d.doc_id for d in long}) == 5
        assert set(long[3:]) <= set(RANKED[3:])
        # the top-3 lacks "Germany": the long context must bring the first document that holds it
        long = reader_contexts(RANKED, ["Germany"], 3, random.Random(seed), long_docs=4)[1]
        assert long == [*RANKED[:3], RANKED[3]]
    assert len(reader_contexts(RANKED, ["Paris"], 3, random.Random(0), long_docs=3)) == 2  # not above k: none


def test_rows_are_the_frozen_generators_own_prompt_and_the_answer_it_should_reply(gemma_tokenizer):
    recipe = get_recipe("s3")
    contexts = reader_contexts(RANKED, ["Paris"], 3, random.Random(0))
    rows = reader_rows("What is the capital of France?", "q7", ["Paris"], contexts, recipe.format_docs,
                       gemma_tokenizer, chat=False, max_tokens=1024)
    assert [r["group_id"] for r in rows] == ["q7/0", "q7/1"]
    for r, docs in zip(rows, contexts):
        prompt = ANSWER_PROMPT.format(question="What is the capital of France?", context=recipe.format_docs(docs))
        # What FrozenLLM feeds the engine for this prompt (a base model: the "Answer:" cue, BOS first).
        engine = type("E", (), {"tokenizer": gemma_tokenizer, "max_model_len": 4096})()
        assert r["prompt_ids"] == FrozenLLM(engine, "m", chat=False).render(prompt)
        assert gemma_tokenizer.decode(r["response_ids"]) == " Paris\n"  # the reply, then the newline it stops at
        assert r["loss_mask"] == [1] * len(r["response_ids"]) and r["logprobs"] == [0.0] * len(r["response_ids"])
    short = reader_rows("What is the capital of France?", "q7", ["Paris"], contexts, recipe.format_docs,
                        gemma_tokenizer, chat=False, max_tokens=len(rows[1]["prompt_ids"]) + 2)
    assert [r["group_id"] for r in short] == ["q7/1"]  # the longer top-3 row is dropped


def test_a_chat_readers_reply_is_its_assistant_turn(smollm2_tokenizer):
    rows = reader_rows("Capital of France?", "q1", ["Paris"], [RANKED[2:3]], get_recipe("s3").format_docs,
                       smollm2_tokenizer, chat=True, max_tokens=1024)
    prompt = ANSWER_PROMPT.format(question="Capital of France?", context=get_recipe("s3").format_docs(RANKED[2:3]))
    assert rows[0]["prompt_ids"] == answer_prompt_ids(smollm2_tokenizer, prompt, chat=True)
    reply = smollm2_tokenizer.decode(rows[0]["response_ids"])
    assert reply.startswith("Paris<|im_end|>")


def _train_and_score(cfg, rows, out, model):
    """In a process of its own (it starts torch.distributed): train, then the saved reader's NLL of the reply."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.reader_sft import train_reader

    def nll(path):
        lm = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
        ids = torch.tensor([rows[0]["prompt_ids"] + rows[0]["response_ids"]])
        logits = lm(ids).logits[0, :-1].float()
        n = len(rows[0]["response_ids"])
        logp = torch.log_softmax(logits, -1)[-n:].gather(1, ids[0, -n:, None])
        return float(-logp.mean().detach())

    summary = train_reader(cfg, rows, out, model=model, pad_token_id=0, epochs=4, lr=1e-3, chunk_mini_batches=1)
    return summary, nll(model), nll(summary["model_dir"])


@pytest.mark.slow
def test_train_reader_lowers_the_nll_of_the_answer_and_saves_a_model_the_generator_can_load(
        tiny_gemma_dir, gemma_tokenizer, tmp_path):
    from configs import load_config

    cfg = load_config("configs/s3_main_cpu.yaml", [f"learner.model={tiny_gemma_dir}", "learner.dtype=fp32",
                                                   "learner.mini_batch_size=2", "learner.micro_batch_size=2",
                                                   "learner.freeze_embeddings=false"])
    contexts = reader_contexts(RANKED, ["Paris"], 3, random.Random(0))
    rows = reader_rows("What is the capital of France?", "q", ["Paris"], contexts, get_recipe("s3").format_docs,
                       gemma_tokenizer, chat=False, max_tokens=1024)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        summary, before, after = pool.apply(_train_and_score, (cfg, rows, str(tmp_path / "reader"), tiny_gemma_dir))
    assert summary["rows"] == 8 and summary["optimizer_steps"] == 4  # 2 rows x 4 epochs, mini-batches of 2
    assert summary["model_dir"] == str(tmp_path / "reader" / "policy" / "hf")
    assert summary["nll_last"] < summary["nll_first"] and after < before - 0.5


def test_train_reader_refuses_a_depth_below_the_top_k_before_loading_anything(capsys):
    from scripts.train_reader import main

    with pytest.raises(SystemExit) as e:
        main(["--depth", "2", "retrieval.topk=3"])
    assert e.value.code == 2 and "--depth >= retrieval.topk (3)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--depth", "10", "--long-docs", "12", "retrieval.topk=3"])
    assert e.value.code == 2 and "--long-docs (12)" in capsys.readouterr().err


def _run_script(argv):
    from scripts.train_reader import main

    main(argv)


@pytest.mark.slow
def test_train_reader_script_retrieves_trains_and_writes_a_reader(tiny_gemma_dir, data_dir, tmp_path, capfd):
    """The script end to end: a BM25 index built where the config names it, rows from the questions' top-k, the
    tiny model trained, the override printed and its files written."""
    import json

    out = tmp_path / "reader"
    argv = ["--questions", "6", "--depth", "5", "--epochs", "1", "--model", tiny_gemma_dir, "--out", str(out),
            f"data.dir={data_dir}", f"index.dir={tmp_path / 'bm25'}", "learner.dtype=fp32",
            "learner.mini_batch_size=2", "learner.micro_batch_size=2"]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_run_script, (argv,))
    summary = json.loads((out / "reader.json").read_text())
    assert summary["questions"] == 6 and summary["rows"] >= 1 and summary["questions_with_context"] >= 1
    assert len(json.loads((out / "reader_questions.json").read_text())) == 6
    assert (out / "policy" / "hf" / "config.json").is_file()
    assert f"frozen.model={out}/policy/hf" in capfd.readouterr().out
