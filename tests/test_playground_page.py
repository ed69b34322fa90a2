"""The playground of the served searcher on the searcher's FastAPI app over a scripted engine (no
Ray, no model): the page and its files are served, the limits route answers behind the token, and the
routes the page's script calls exist and answer what it reads."""

from __future__ import annotations

import re

from serving.api import ApiSettings, make_api
from serving.playground import STATIC_DIR
from serving.schemas import Limits
from tests.scripted_engine import turn_policy
from tests.serve_fakes import MODEL, LocalBackend, make_service
from tests.test_serve_api import call, parse_sse

Q = "Who wrote the novel <b>Zorblax</b> Rising?"
TURNS = {Q: ["<think>I need the author.</think>\n<search> Zorblax <script>x</script> author </search>",
             "<think>Found it.</think>\n<answer> Mira Tolven </answer>"]}
SETTINGS = ApiSettings(request_timeout_s=10.0, limits=Limits(max_turns=4, max_topk=10, max_timeout_s=10.0),
                       token="s3cret")
AUTH = {"Authorization": "Bearer s3cret"}


def app_for(tokenizer, settings=SETTINGS):
    service, _ = make_service(tokenizer, turn_policy(TURNS))
    return make_api(LocalBackend(service), settings)


def test_the_page_and_its_files_are_served_without_the_token(gemma_tokenizer):
    """The HTML, script and style hold no data: public, so a browser can open the URL; the API calls it makes
    carry the token."""
    app = app_for(gemma_tokenizer)
    page = call(app, "GET", "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "searchrl playground" in page.text and 'id="token"' in page.text
    files = re.findall(r'(?:src|href)="(static/[^"]+)"', page.text)  # relative: the app may sit under a prefix
    assert len(files) == 3
    for src in files:
        r = call(app, "GET", "/" + src)
        assert r.status_code == 200, src
    js = call(app, "GET", "/static/playground/playground.js")
    assert "javascript" in js.headers["content-type"]
    assert call(app, "GET", "/static/common/dom.js").status_code == 200
    assert call(app, "GET", "/static/nope.js").status_code == 404


def test_limits_answer_behind_the_token(gemma_tokenizer):
    app = app_for(gemma_tokenizer)
    r = call(app, "GET", "/v1/limits")
    assert r.status_code == 401 and "bearer token" in r.json()["detail"]
    r = call(app, "GET", "/v1/limits", headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"max_turns": 4, "max_topk": 10, "max_timeout_s": 10.0, "temperature": [0.0, 2.0],
                        "model": MODEL.model_dump()}
    open_app = app_for(gemma_tokenizer, ApiSettings(limits=Limits(max_turns=4, max_topk=10)))
    assert call(open_app, "GET", "/v1/limits").json()["max_topk"] == 10


def test_the_routes_the_script_calls_answer_what_it_reads(gemma_tokenizer):
    """playground.js asks /v1/limits and streams /v1/search/stream with question, topk, max_turns and
    temperature; it shows `detail` of a 4xx and each event's fields."""
    script = (STATIC_DIR / "playground" / "playground.js").read_text()
    assert set(re.findall(r'"(/?v1/[a-z/]+)"', script)) == {"v1/limits", "v1/search/stream"}  # relative
    assert 'from "../common/dom.js"' in script
    for field in ("topk", "max_turns", "temperature", "question"):
        assert field in script
    app = app_for(gemma_tokenizer)
    r = call(app, "POST", "/v1/search/stream", json={"question": Q, "topk": 2, "max_turns": 2, "temperature": 0},
             headers=AUTH)
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["turn", "turn", "answer", "done"]
    turn = events[0][1]
    assert turn["query"] == "Zorblax <script>x</script> author" and len(turn["docs"]) == 2
    assert {"title", "score", "text"} <= set(turn["docs"][0])
    answer = events[2][1]
    assert answer["answer"] == "Mira Tolven" and {"prompt_tokens", "completion_tokens"} <= set(answer["usage"])
    assert {"total_s", "generate_s"} <= set(answer["timings"])
    r = call(app, "POST", "/v1/search/stream", json={"question": Q, "topk": 11}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"].startswith("topk: got 11; expected an integer in 1..10")
    r = call(app, "POST", "/v1/search/stream", json={"question": Q})
    assert r.status_code == 401


def test_the_playground_leaves_the_other_routes_as_they_were(gemma_tokenizer):
    app = app_for(gemma_tokenizer)
    assert call(app, "GET", "/health").status_code == 200
    assert call(app, "GET", "/v1/models").status_code == 401
    paths = {getattr(r, "path", None) for r in app.routes}
    assert {"/", "/static", "/v1/limits", "/v1/search", "/v1/search/stream", "/retrieve"} <= paths
    assert call(app, "GET", "/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL.name
