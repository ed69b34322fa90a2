"""The web pages in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright for
Python) opens the run viewer, started as a user starts it (`python -m scripts.view_run RUN --port 0`) on a
small run of its own, and the playground, served by the searcher's FastAPI app over a scripted engine (no
Ray, no model), and checks what a person sees: the episodes, a document's title, the answer, two methods
side by side, the turns in order, a 4xx message for a bad input, and a passage holding `<script>` shown as
text and not run. `SEARCHRL_SCREENSHOTS=DIR` saves each page's screenshot there (docs/img holds the README's).

Needs /usr/bin/chromium (`apt-get install chromium`; scripts/setup.sh does it where apt-get is) and the
`playwright` package (requirements); skips, saying which is missing, without them."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fake_run import XSS, XSS_TITLE, write_pack, write_run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
START_TIMEOUT_S = 90.0  # the viewer imports FastAPI and the config on a busy 2-core machine


def _browser_or_skip():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no {CHROMIUM}: install Debian's chromium (scripts/setup.sh does where apt-get is)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("no playwright package: pip install -r requirements-cpu.txt (scripts/setup.sh)")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        # --no-sandbox: Chromium's sandbox refuses to run as root, as CI's containers do
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def _screenshot(page, name: str) -> None:
    out = os.environ.get("SEARCHRL_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(out) / name), full_page=False)


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    """`python -m scripts.view_run RUN --port 0` on a fresh run; yields (url, process, output lines)."""
    _browser_or_skip()
    root = tmp_path_factory.mktemp("browser")
    run, pack = write_run(root / "runs" / "s3-20261129-000000"), write_pack(root / "pack")
    env = {**os.environ, "SEARCHRL_DATA": str(pack), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "scripts.view_run", str(run), "--port", "0"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    seen, url, deadline = [], None, time.monotonic() + START_TIMEOUT_S
    while url is None and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if line.startswith("open http://127.0.0.1:"):
            url = line.split()[1]
    if url is None:
        proc.kill()
        pytest.fail(f"the viewer did not print its URL in {START_TIMEOUT_S:.0f} s:\n{''.join(seen)}")
    yield url, proc, seen
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_the_run_viewer_in_a_browser(browser, viewer):
    url, proc, _ = viewer
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)

    rows = page.locator("#episodes-table tbody tr")
    assert rows.count() == 3 and page.locator("#f-method").input_value() == "policy"  # the trained searcher first
    assert page.get_by_text("Who wrote the novel Zorblax Rising?").first.is_visible()
    page.select_option("#f-method", "")
    page.click("#filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#episodes-table tbody tr').length === 12")
    assert page.locator("#episodes-count").inner_text() == "episodes 1–12 of 12"

    # An episode of the trained searcher beside the untrained one on the same question.
    rows.filter(has_text="policy").filter(has_text="hotpotqa").first.click()
    page.wait_for_selector("#sbs-left .episode")
    assert page.locator("#sbs-left h3").first.inner_text() == "policy"
    assert page.locator("#sbs-right h3").first.inner_text() == "untrained"
    left = page.locator("#sbs-left")
    assert [t.split(" · ")[1] for t in left.locator(".turn-head").all_inner_texts()] == ["Search", "Complete"]
    assert "Zorblax Rising author" in left.locator(".query").first.inner_text()
    assert left.locator(".doc-title").first.inner_text() == "Zorblax Rising"
    assert left.locator(".answer").inner_text() == "answer: Mira Tolven"
    assert left.locator("mark.gold").first.inner_text() == "Mira Tolven"
    assert "holds gold: Mira Tolven" in left.locator(".gold-badge").first.inner_text()
    assert page.locator("#sbs-right .answer").inner_text() == "answer: Kelm"

    # HTML in a document and in the model's output shows as text and does not run.
    assert XSS_TITLE in left.locator(".doc-title").all_inner_texts()
    assert any(XSS in t for t in left.locator(".doc-text").all_inner_texts())
    assert any("<b>not bold</b>" in t for t in left.locator("pre.model").all_inner_texts())
    assert page.evaluate("window.__xss") is None
    assert page.locator("img[src='x'], pre.model b, .doc-text script").count() == 0
    _screenshot(page, "run-viewer.png")

    # Another method on the right: naive RAG, whose line keeps only its answer.
    page.select_option("#sbs-b", "naive_rag")
    page.wait_for_function("document.querySelector('#sbs-right h3').textContent === 'naive_rag'")
    assert page.locator("#sbs-right .answer").inner_text() == "answer: Mira Tolven"
    assert "only a baseline's answer" in page.locator("#sbs-right").inner_text()

    # Filters, and a bad one answered with the server's 4xx message.
    page.select_option("#f-method", "naive_rag")
    page.click("#filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#episodes-table tbody tr').length === 3")
    page.fill("#f-f1-min", "2")
    page.click("#filters button[type=submit]")
    page.wait_for_selector("#episodes-error:not(:empty)")
    assert page.locator("#episodes-error").inner_text() == "422: f1_min: got 2; expected a number in 0..1 (answer F1)"

    # Training rollouts of step 2 with their reward components; the dev curve and the PNG.
    page.select_option("#r-step", "2")
    page.click("#rollout-form button[type=submit]")
    page.wait_for_function("document.querySelector('#rollouts-count').textContent.startsWith('step 2')")
    first = page.locator(".rollout").first
    assert "gain_beyond_rag" in first.locator(".components").inner_text()
    assert first.locator(".answer").inner_text() == "answer: Mira Tolven"
    assert page.locator("#dev-curve tbody tr").count() == 2
    page.wait_for_function("document.querySelector('#reward-curves img').complete "
                           "&& document.querySelector('#reward-curves img').naturalWidth > 0")
    assert page.evaluate("window.__xss") is None and errors == []
    page.close()


def test_the_viewer_stops_on_sigterm(viewer):
    _, proc, _ = viewer
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert time.monotonic() - t0 < 5.0


@pytest.fixture(scope="module")
def playground(gemma_tokenizer):
    """The searcher's FastAPI app (`serving.api.make_api`, the playground included) over a scripted engine
    whose turns take 0.3 s, served by uvicorn in a thread; yields its URL."""
    _browser_or_skip()
    import uvicorn

    from scripts.view_run import bind
    from serving.api import ApiSettings, make_api
    from serving.schemas import Limits
    from tests.scripted_engine import turn_policy
    from tests.serve_fakes import LocalBackend, make_service

    turns = {PLAY_Q: ["<think>I need the author.</think>\n<search> Zorblax Rising author </search>",
                      f"<think>Odd page.</think>\n<search> {XSS} </search>",
                      "<think>Found it.</think>\n<answer> Mira Tolven </answer>"]}
    service, _ = make_service(gemma_tokenizer, turn_policy(turns), delay_s=0.3)
    settings = ApiSettings(request_timeout_s=30.0, limits=Limits(max_turns=4, max_topk=10, max_timeout_s=30.0),
                           token="s3cret")
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(make_api(LocalBackend(service), settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    server.should_exit = True
    thread.join(10)
    sock.close()


PLAY_Q = "Who wrote the novel Zorblax Rising?"


def test_the_playground_in_a_browser(browser, playground):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(playground)
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("#error").inner_text().startswith("401: authorization: missing or wrong bearer token")
    page.fill("#token", "s3cret")
    page.dispatch_event("#token", "change")
    page.wait_for_function("document.querySelector('#limits').textContent.includes('top-k 1..10')")
    assert page.locator("#error").inner_text() == "" and "searcher-test" in page.locator("#model").inner_text()

    # A bad input: the endpoint's own 422 message.
    page.fill("#question", PLAY_Q)
    page.fill("#topk", "99")
    page.click("#ask-button")
    page.wait_for_selector("#error:not(:empty)")
    assert page.locator("#error").inner_text().startswith("422: topk: got 99; expected an integer in 1..10")

    # The episode arrives turn by turn: queries, documents, then the answer with tokens and seconds.
    page.fill("#topk", "2")
    t0 = time.monotonic()
    page.click("#ask-button")
    page.wait_for_selector("#turns li.turn")
    first_turn_s = time.monotonic() - t0
    assert page.locator("#answer .answer").count() == 0  # the first turn shows before the answer exists
    page.wait_for_selector("#answer .answer")
    heads = page.locator("#turns .turn-head").all_inner_texts()
    assert [h.split(" · ")[1].split("+")[0].strip() for h in heads] == ["Search", "Search", "Answer"]
    queries = page.locator("#turns .query").all_inner_texts()
    assert queries == ["query: Zorblax Rising author", f"query: {XSS}"]
    assert page.locator("#turns li.turn").first.locator(".doc-title").all_inner_texts() == ["T1", "T2"]
    assert any(XSS in t for t in page.locator(".doc-text").all_inner_texts())
    assert page.evaluate("window.__xss") is None and page.locator("#turns script").count() == 0
    assert page.locator("#answer .answer").inner_text() == "answer: Mira Tolven"
    usage = page.locator("#answer").inner_text()
    assert "finish answer" in usage and "generated" in usage and "seconds: total" in usage
    page.wait_for_function("document.querySelector('#status').textContent.startsWith('done')")
    print(f"playground: first turn on the page {first_turn_s:.2f} s after Ask (scripted turns of 0.3 s)")
    _screenshot(page, "playground.png")
    assert errors == []
    page.close()
