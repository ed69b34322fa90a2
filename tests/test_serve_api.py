"""The searcher's HTTP routes over a scripted engine (no Ray, no model): answers, strict schemas,
every bad input, auth, deadlines, a full queue, SSE framing and the `openai` client."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from serving.api import ApiSettings, make_api
from serving.schemas import Limits
from tests.scripted_engine import turn_policy
from tests.serve_fakes import MODEL, LocalBackend, make_service

Q = "Who wrote the novel Zorblax Rising?"
TURNS = {Q: ["<think>I need the author.</think>\n<search> Zorblax Rising author </search>",
             "<think>Found it.</think>\n<answer> Mira Tolven </answer>"]}
SETTINGS = ApiSettings(max_body_bytes=2048, request_timeout_s=10.0, limits=Limits(max_turns=8, max_topk=20,
                                                                                   max_timeout_s=10.0))


def app_for(tokenizer, turns=TURNS, delay_s=0.0, capacity=100, settings=SETTINGS, ready=True, **kwargs):
    service, engine = make_service(tokenizer, turn_policy(turns), delay_s, **kwargs)
    backend = LocalBackend(service, capacity, ready)
    return make_api(backend, settings), engine


def call(app, method, url, **kwargs) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            return await c.request(method, url, **kwargs)

    return asyncio.run(go())


def test_search_answers_with_turns_usage_and_timings(gemma_tokenizer):
    app, _ = app_for(gemma_tokenizer)
    r = call(app, "POST", "/v1/search", json={"question": Q})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "Mira Tolven" and body["finish_reason"] == "answer"
    assert body["model"] == MODEL.model_dump() and body["id"].startswith("srch-")
    assert [t["action"] for t in body["turns"]] == ["Search", "Answer"]
    search = body["turns"][0]
    assert search["query"] == "Zorblax Rising author" and search["text"].endswith("</search>")
    assert [d["id"] for d in search["docs"]] == [f"Zorblax Rising author-{i}" for i in (1, 2, 3)]
    assert search["docs"][0]["score"] == 1.0 and body["turns"][1]["docs"] is None
    u = body["usage"]
    assert u["searches"] == 1 and u["prompt_tokens"] > 50 and u["completion_tokens"] > 10 and u["observation_tokens"] > 10
    assert set(body["timings"]) == {"total_s", "queue_s", "generate_s", "search_s"}
    assert body["timings"]["total_s"] >= body["timings"]["generate_s"] >= 0


def test_request_options_reach_the_episode(gemma_tokenizer):
    app, engine = app_for(gemma_tokenizer)
    r = call(app, "POST", "/v1/search", json={"question": Q, "topk": 2, "return_docs": False, "seed": 7,
                                              "temperature": 0.5})
    assert r.status_code == 200, r.text
    assert r.json()["turns"][0]["docs"] is None
    sampling = engine.requests[0][1]
    assert sampling.temperature == 0.5 and sampling.seed is not None
    r = call(app, "POST", "/v1/search", json={"question": Q, "return_docs": True, "topk": 2})
    assert len(r.json()["turns"][0]["docs"]) == 2
    assert engine.requests[-1][1].temperature == 0.0  # greedy by default, as evaluation


def test_malformed_model_output_is_a_finish_reason(gemma_tokenizer):
    app, _ = app_for(gemma_tokenizer, {Q: ["I refuse to use any tags at all."] * 3}, options={"max_turns": 1})
    r = call(app, "POST", "/v1/search", json={"question": Q})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] is None and body["finish_reason"] in ("invalid", "max_turns")
    assert body["turns"][0]["action"] == "Invalid"


BAD = [
    ({"question": Q, "colour": "red"}, "colour", "unknown field"),
    ({"question": 5}, "question", "string"),
    ({"question": "   "}, "question", "empty"),
    ({}, "question", "Field required"),
    ({"question": Q, "topk": 0}, "topk", "1..20"),
    ({"question": Q, "topk": 21}, "topk", "1..20"),
    ({"question": Q, "topk": "3"}, "topk", "integer"),
    ({"question": Q, "max_turns": -1}, "max_turns", "0..8"),
    ({"question": Q, "max_turns": 9}, "max_turns", "0..8"),
    ({"question": Q, "temperature": 2.5}, "temperature", "0..2"),
    ({"question": Q, "temperature": -1}, "temperature", "0..2"),
    ({"question": Q, "timeout_s": 0}, "timeout_s", "serve.request_timeout_s"),
    ({"question": Q, "timeout_s": 11}, "timeout_s", "serve.request_timeout_s"),
    ({"question": Q, "return_docs": "yes"}, "return_docs", "true or false"),
    ([Q], "body", "JSON object"),
]


@pytest.mark.parametrize("route", ["/v1/search", "/v1/search/stream"])
@pytest.mark.parametrize("body, field, words", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_422_naming_the_field(gemma_tokenizer, route, body, field, words):
    app, engine = app_for(gemma_tokenizer)
    r = call(app, "POST", route, json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"{field}") and words in detail, detail
    assert r.json()["error"]["param"] == field and not engine.requests


def test_not_json_too_large_and_too_long(gemma_tokenizer):
    app, engine = app_for(gemma_tokenizer)
    r = call(app, "POST", "/v1/search", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("body:")
    r = call(app, "POST", "/v1/search", json={"question": "x" * 3000})
    assert r.status_code == 413 and "serve.max_body_bytes" in r.json()["detail"]
    r = call(app, "POST", "/v1/search", json={"question": "word " * 300})
    assert r.status_code == 422 and r.json()["detail"].startswith("question: 30") and "tokens; expected at most 256" in r.json()["detail"]
    assert "serve.max_question_tokens" in r.json()["detail"] and not engine.requests


def test_bearer_token(gemma_tokenizer):
    settings = ApiSettings(**{**SETTINGS.__dict__, "token": "s3cret"})
    app, _ = app_for(gemma_tokenizer, settings=settings)
    for route, method, body in [("/v1/search", "POST", {"question": Q}), ("/v1/models", "GET", None),
                                ("/v1/chat/completions", "POST", {"model": MODEL.name, "messages": []}),
                                ("/retrieve", "POST", {"queries": ["x"]})]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = call(app, method, route, json=body, headers=headers)
            assert r.status_code == 401, (route, headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
    assert call(app, "GET", "/health").status_code == 200
    r = call(app, "POST", "/v1/search", json={"question": Q}, headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200 and r.json()["answer"] == "Mira Tolven"


def test_clients_send_the_environment_token(gemma_tokenizer, monkeypatch):
    """The project's clients (scripts.bench.serve, the soak) authenticate with SEARCHRL_API_TOKEN."""
    from serving.auth import TOKEN_ENV, auth_headers

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert auth_headers() == {}
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    app, _ = app_for(gemma_tokenizer, settings=ApiSettings(**{**SETTINGS.__dict__, "token": "s3cret"}))
    r = call(app, "POST", "/retrieve", json={"queries": ["x"]}, headers=auth_headers())
    assert r.status_code == 200, r.text
    assert call(app, "POST", "/retrieve", json={"queries": ["x"]}, headers=auth_headers("other")).status_code == 401


def test_deadline_is_504_and_cancels_the_episode(gemma_tokenizer):
    app, engine = app_for(gemma_tokenizer, delay_s=0.4)
    t = time.monotonic()
    r = call(app, "POST", "/v1/search", json={"question": Q, "timeout_s": 0.2})
    assert r.status_code == 504 and "deadline of 0.2 s" in r.json()["detail"], r.text
    assert time.monotonic() - t < 1.5 and engine.cancelled == 1


def test_full_queue_is_503_with_retry_after(gemma_tokenizer):
    app, _ = app_for(gemma_tokenizer, delay_s=0.2, capacity=2)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            return await asyncio.gather(*(c.post("/v1/search", json={"question": Q}) for _ in range(5)))

    codes = sorted(r.status_code for r in asyncio.run(go()))
    assert codes == [200, 200, 503, 503, 503]
    r = next(r for r in asyncio.run(go()) if r.status_code == 503)
    assert r.headers["retry-after"] == "2" and "queue is full" in r.json()["detail"]


def test_health_is_503_until_ready(gemma_tokenizer):
    app, _ = app_for(gemma_tokenizer, ready=False)
    r = call(app, "GET", "/health")
    assert r.status_code == 503 and "engine still loading" in r.json()["detail"]
    app, _ = app_for(gemma_tokenizer)
    r = call(app, "GET", "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["model"]["step"] == 8


def parse_sse(text: str) -> list[tuple[str, dict]]:
    """(event, data) pairs of an SSE body; asserts the framing (event + data lines, blank line)."""
    assert text.endswith("\n\n")
    out = []
    for block in text.strip("\n").split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def test_search_stream_sse_framing(gemma_tokenizer):
    app, _ = app_for(gemma_tokenizer)
    r = call(app, "POST", "/v1/search/stream", json={"question": Q})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["turn", "turn", "answer", "done"]
    assert events[0][1]["query"] == "Zorblax Rising author" and len(events[0][1]["docs"]) == 3
    assert events[2][1]["answer"] == "Mira Tolven" and events[2][1]["turns"] == [events[0][1], events[1][1]]


def test_search_stream_deadline_mid_stream_is_an_error_event(gemma_tokenizer):
    app, _ = app_for(gemma_tokenizer, delay_s=0.3)
    r = call(app, "POST", "/v1/search/stream", json={"question": Q, "timeout_s": 0.45})
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["turn", "error"]
    assert events[1][1]["error"]["code"] == 504
    r = call(app, "POST", "/v1/search/stream", json={"question": Q, "timeout_s": 0.1})
    assert r.status_code == 504  # nothing sent yet: a plain HTTP answer


def test_models_and_retrieve(gemma_tokenizer):
    app, _ = app_for(gemma_tokenizer)
    r = call(app, "GET", "/v1/models")
    assert r.json()["data"][0] | {} == {"id": MODEL.name, "object": "model", "created": 0, "owned_by": "searchrl",
                                        "checkpoint": MODEL.checkpoint, "step": 8, "recipe": "search_r1"}
    r = call(app, "POST", "/retrieve", json={"queries": ["a b"], "topk": 2})
    assert r.status_code == 200
    assert r.json() == {"result": [[{"document": {"id": "a b-1", "contents": '"T1"\nPassage 1 about a b.'},
                                     "score": 1.0},
                                    {"document": {"id": "a b-2", "contents": '"T2"\nPassage 2 about a b.'},
                                     "score": 0.5}]]}
    r = call(app, "POST", "/retrieve", json={"queries": ["a"], "topk": 99})
    assert r.status_code == 422 and r.json()["detail"].startswith("topk: ")
    r = call(app, "POST", "/retrieve", json={"queries": ["a" * 5000]})
    assert r.status_code == 413 and "retrieval.max_body_bytes" in r.json()["detail"]


CHAT_BAD = [
    ({"model": MODEL.name, "messages": [{"role": "user", "content": Q}], "tools": []}, "tools", "unknown field"),
    ({"model": MODEL.name, "messages": []}, "messages", "at least 1"),
    ({"model": MODEL.name, "messages": [{"role": "system", "content": "be brief"}]}, "messages", "no user message"),
    ({"model": MODEL.name, "messages": [{"role": "user", "content": Q}], "n": 2}, "n", "expected 1"),
    ({"model": MODEL.name, "messages": [{"role": "wizard", "content": Q}]}, "messages[0].role", "user"),
    ({"messages": [{"role": "user", "content": Q}]}, "model", "Field required"),
]


@pytest.mark.parametrize("body, field, words", CHAT_BAD, ids=[b[1] for b in CHAT_BAD])
def test_chat_bad_input(gemma_tokenizer, body, field, words):
    app, _ = app_for(gemma_tokenizer)
    r = call(app, "POST", "/v1/chat/completions", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(field) and words in r.json()["detail"], r.json()["detail"]


def test_chat_other_model_is_404(gemma_tokenizer):
    app, _ = app_for(gemma_tokenizer)
    r = call(app, "POST", "/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user", "content": Q}]})
    assert r.status_code == 404 and MODEL.name in r.json()["error"]["message"]


def test_openai_client_plain_and_stream(gemma_tokenizer):
    openai = pytest.importorskip("openai")
    app, _ = app_for(gemma_tokenizer)

    async def go():
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t")
        client = openai.AsyncOpenAI(api_key="unused", base_url="http://t/v1", http_client=http, max_retries=0)
        models = await client.models.list()
        plain = await client.chat.completions.create(
            model=models.data[0].id, messages=[{"role": "system", "content": "x"}, {"role": "user", "content": Q}],
            extra_body={"topk": 2})
        stream = await client.chat.completions.create(model=MODEL.name, messages=[{"role": "user", "content": Q}],
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        try:
            await client.chat.completions.create(model=MODEL.name, messages=[{"role": "user", "content": Q}],
                                                 extra_body={"topk": 0})
        except openai.UnprocessableEntityError as e:
            error = e
        await http.aclose()
        return plain, chunks, error

    plain, chunks, error = asyncio.run(go())
    assert plain.choices[0].message.content == "Mira Tolven" and plain.choices[0].finish_reason == "stop"
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens > 0
    trace = plain.model_extra["search"]
    assert trace["finish_reason"] == "answer" and len(trace["turns"][0]["docs"]) == 2
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Mira Tolven"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert sum("search_turn" in (c.model_extra or {}) for c in chunks) == 2
    assert error.status_code == 422 and "topk" in str(error)


S3_TURNS = {Q: [" <important_info>[1]</important_info><search_complete>False</search_complete>",
                '\n<query>{"query": "Zorblax Rising novel author"}</query>',
                "<important_info>[2]</important_info><search_complete>True</search_complete>"]}


def test_s3_answer_comes_from_the_generator_reading_the_selected_documents(gemma_tokenizer):
    asked = []

    async def generator(question, context, template):
        asked.append((question, context, template))
        return "Mira Tolven"

    app, _ = app_for(gemma_tokenizer, S3_TURNS, recipe="s3", answer_fn=generator)
    r = call(app, "POST", "/v1/search", json={"question": Q})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "Mira Tolven" and body["finish_reason"] == "complete"
    assert body["turns"][0]["action"] == "InitialSearch" and body["turns"][0]["query"] == Q
    assert [d["id"] for d in body["turns"][0]["docs"]] == [f"{Q}-{i}" for i in (1, 2, 3)]
    assert body["usage"]["searches"] == 2  # the initial top-k counts as one, as in evaluation
    (question, context, template), = asked
    assert question == Q and "Passage 1 about " + Q in context and "Passage 2 about Zorblax Rising novel author" in context
    assert "Passage 3" not in context and "{context}" in template
    with pytest.raises(ValueError, match="answer_fn"):
        make_service(gemma_tokenizer, turn_policy(S3_TURNS), recipe="s3")
