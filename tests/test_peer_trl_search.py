"""TRL's multi-turn loop for scripts.bench.peer (scripts/peer/trl_search.py), without TRL: a scripted model and
a stub `/retrieve` server check the turns, the env_mask over observation tokens, the limits and the reward."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from recipes import get_recipe
from scripts.peer.trl_search import SearchRollout, retrieve

DOC = {"id": "wiki-1", "contents": '"Hamlet"\nHamlet is a tragedy by William Shakespeare.'}


@pytest.fixture
def retrieval_url():
    """A Search-R1 `/retrieve` stub that answers every query with DOC and records the request bodies."""
    bodies = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            out = json.dumps({"result": [[{"document": DOC, "score": 1.5}] * body["topk"]
                                         for _ in body["queries"]]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    server.shutdown()


class ScriptedModel:
    """`generate` answers turn k of every row with `turns[k]`'s tokens, padded like HF's generate."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tok, self.turns, self.calls = tokenizer, turns, []

    def generate(self, input_ids, attention_mask, generation_config, max_new_tokens, stop_strings, tokenizer):
        turn = len(self.calls)
        self.calls.append(input_ids.shape[0])
        ids = self.tok.encode(self.turns[turn], add_special_tokens=False)[:max_new_tokens]
        pad = generation_config.pad_token_id
        new = torch.tensor([ids + [pad] * (max_new_tokens - len(ids))] * input_ids.shape[0])
        return torch.cat([input_ids, new], dim=1)


@pytest.fixture
def gen_config(gemma_dir):
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    return tok, GenerationConfig(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)


def _rollout(tok, url, **limits):
    recipe = get_recipe("search_r1", reward_metric="f1", max_turns=2)
    timing = dict.fromkeys(("generate_s", "search_s", "tokens", "searches"), 0)
    lim = {"max_new_tokens_per_turn": 64, "max_observation_tokens": 256, "max_total_tokens": 1536, **limits}
    return SearchRollout(recipe, {}, tok, url, lim, timing), timing


def test_search_then_answer_masks_the_observation(gen_config, retrieval_url):
    tok, gc = gen_config
    url, bodies = retrieval_url
    rollout, timing = _rollout(tok, url)
    model = ScriptedModel(tok, ["<search> hamlet author </search>", "<answer> William Shakespeare </answer>"])
    rows = [{"question": "who wrote hamlet", "golden_answers": ["William Shakespeare"]}] * 2
    runs = rollout.run(model, rows, gc)
    assert model.calls == [2, 2]  # every turn is one batched generate call over the unfinished episodes
    assert bodies == [{"queries": ["hamlet author"] * 2, "topk": 3, "return_scores": True}]  # one request a turn
    for r in runs:
        assert r.episode.stop_reason == "answer"
        assert rollout.recipe.reward(r.episode).total == 1.0
        assert len(r.env_mask) == len(r.response_ids)
        observation = tok.decode([t for t, m in zip(r.response_ids, r.env_mask) if m == 0])
        policy = tok.decode([t for t, m in zip(r.response_ids, r.env_mask) if m == 1])
        assert "<information>" in observation and "Hamlet is a tragedy" in observation
        assert "<search> hamlet author </search>" in policy and "<answer> William Shakespeare </answer>" in policy
        assert "tragedy" not in policy
    assert timing["searches"] == 2 and timing["tokens"] == sum(sum(r.env_mask) for r in runs)


def test_turn_budget_cuts_and_the_turn_limit_ends(gen_config, retrieval_url):
    tok, gc = gen_config
    url, _ = retrieval_url
    rollout, _ = _rollout(tok, url, max_new_tokens_per_turn=4)
    model = ScriptedModel(tok, ["no tags at all, just a long rambling text"] * 3)
    runs = rollout.run(model, [{"question": "q", "golden_answers": ["a"]}], gc)
    ep = runs[0].episode
    assert [type(t.action).__name__ for t in ep.turns] == ["Invalid"] * 3  # 2 steps + the last turn
    assert all(t.finish_reason == "length" for t in ep.turns) and ep.stop_reason == "max_turns"
    assert sum(runs[0].env_mask) == 12  # 3 turns x the 4-token budget; the feedback is not policy text
    assert rollout.recipe.reward(ep).total == 0.0


def test_total_token_limit_ends_the_episode(gen_config, retrieval_url):
    tok, gc = gen_config
    url, _ = retrieval_url
    prompt_len = len(_rollout(tok, url)[0].loop.encode(
        get_recipe("search_r1").start("q", ["a"], [], chat=False).prompt.render(None), special=True))
    rollout, _ = _rollout(tok, url, max_total_tokens=prompt_len + 20)
    model = ScriptedModel(tok, ["<search> hamlet author </search>"] * 3)
    r = rollout.run(model, [{"question": "q", "golden_answers": ["a"]}], gc)[0]
    assert r.episode.stop_reason == "max_total_tokens" and r.num_tokens <= prompt_len + 20


def test_retrieve_parses_search_r1_items(retrieval_url):
    url, _ = retrieval_url
    docs = retrieve(url, ["x"], 2)
    assert len(docs) == 1 and len(docs[0]) == 2
    assert (docs[0][0].doc_id, docs[0][0].title, docs[0][0].score) == ("wiki-1", "Hamlet", 1.5)
    assert docs[0][0].text == "Hamlet is a tragedy by William Shakespeare."
