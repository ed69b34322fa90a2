"""End to end: `scripts.serve` on Gemma 3 270M (vLLM CPU) over a real 2-shard index with two searcher
replicas (`serve.replicas=2`), driven by the `openai` client (plain and streamed), concurrent native
requests mixed with bad ones, one replica SIGKILLed while the other keeps answering, 100 clients with
both replicas killed mid-load, `/retrieve`, auth, and SIGTERM. One server for the module: its tests run
in file order, each leaving both replicas up for the next. Slow: it starts Ray, Serve and two engines
(about 4 minutes here)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from cluster.shm import tree_segments
from tests.test_retrieval_http import free_port

REPO = Path(__file__).resolve().parents[1]
TOKEN = "e2e-token"
QUESTIONS = ["who wrote the declaration of independence", "what is the largest planet in the solar system",
             "who painted the mona lisa", "when did the second world war end", "what is the capital of france",
             "who discovered penicillin"]


def start_server(small_index, log_dir: Path, *overrides: str) -> tuple[str, subprocess.Popen, Path]:
    """(base URL, process, log) of `scripts.serve` on the base Gemma model with the search_r1 recipe, once
    it printed its ready line; `overrides` are extra config keys (e.g. "serve.replicas=2")."""
    port = free_port()
    log = log_dir / "serve.log"
    cmd = [sys.executable, "-m", "scripts.serve", "--checkpoint", "gemma3-270m",
           "--config", "configs/search_r1_learn_cpu.yaml", f"index.dir={small_index}", f"serve.port={port}",
           "ray.num_cpus=4", "rollout.max_new_tokens_per_turn=48", "train.recipe_options.max_turns=1",
           "serve.max_ongoing_requests=4", "serve.max_queued_requests=32", "retrieval.query_encoders=1", *overrides]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"SEARCHRL_API_TOKEN": TOKEN}  # own cluster
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    url = None
    while url is None:
        text = log.read_text()
        for line in text.splitlines():
            if line.startswith("searcher ") and " ready in " in line:
                url = line.rsplit(" at ", 1)[1].strip()
        status = proc.poll()
        if status is not None or time.monotonic() > deadline:
            proc.kill()
            why = f"exited with {status}" if status is not None else "was not ready after 600 s"
            pytest.fail(f"scripts.serve {why}:\n{text[-3000:]}")
        time.sleep(1)
    return url, proc, log


def searcher_replicas(server_pid: int) -> list[psutil.Process]:
    """The live searcher replica processes under the `scripts.serve` process (Ray titles them
    `ray::ServeReplica:<app>:Searcher`)."""
    out = []
    for p in psutil.Process(server_pid).children(recursive=True):
        try:
            title = " ".join(p.cmdline())
            if "ServeReplica" in title and "Searcher" in title and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def wait_for_two_replicas(url: str, proc: subprocess.Popen, log: Path, since: float, timeout_s: float = 420) -> list[int]:
    """The pids of both searcher replicas once Serve has brought the killed ones back and /health answers."""
    deadline = time.monotonic() + timeout_s
    while len(searcher_replicas(proc.pid)) < 2 or httpx.get(f"{url}/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, f"no second replica {timeout_s} s after the kill:\n{log.read_text()[-3000:]}"
        time.sleep(2)
    print(f"2 replicas again {time.monotonic() - since:.1f} s after the kill")
    return [p.pid for p in searcher_replicas(proc.pid)]


@pytest.fixture(scope="module")
def server(small_index, tmp_path_factory):
    """(base URL, process, log) of `scripts.serve` with two searcher replicas."""
    url, proc, log = start_server(small_index, tmp_path_factory.mktemp("serve"), "serve.replicas=2")
    assert "example: curl -s " in log.read_text() and "Authorization: Bearer" in log.read_text()
    yield url, proc, log
    if proc.poll() is None:
        proc.kill()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_openai_client_plain_and_stream(server):
    import openai

    url, _, _ = server
    client = openai.OpenAI(api_key=TOKEN, base_url=f"{url}/v1", max_retries=0, timeout=300)
    model = client.models.list().data[0]
    assert model.id == "gemma3-270m" and model.model_extra["recipe"] == "search_r1"
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    plain = client.chat.completions.create(model=model.id, messages=messages)
    trace = plain.model_extra["search"]
    assert plain.choices[0].finish_reason in ("stop", "length") and trace["finish_reason"]
    assert plain.usage.completion_tokens > 0 and plain.usage.prompt_tokens > 100
    assert trace["turns"] and all(t["action"] for t in trace["turns"])
    chunks = list(client.chat.completions.create(model=model.id, messages=messages, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == (plain.choices[0].message.content or "")  # greedy: the same answer streamed
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="wrong", base_url=f"{url}/v1", max_retries=0).models.list()


def test_concurrent_native_requests_with_bad_ones(server):
    url, _, _ = server

    async def go():
        async with httpx.AsyncClient(base_url=url, timeout=300, headers=AUTH) as c:
            good = [c.post("/v1/search", json={"question": q}) for q in QUESTIONS]
            bad = [c.post("/v1/search", json={"question": QUESTIONS[0], "topk": 0}),
                   c.post("/v1/search", json={"question": "x" * 70000}),
                   c.post("/v1/search", json={"question": QUESTIONS[0], "colour": 1}),
                   c.post("/v1/search", json={"question": "word " * 400}),
                   c.post("/v1/search", json={"question": QUESTIONS[1]}, headers={"Authorization": "Bearer no"})]
            stream = c.post("/v1/search/stream", json={"question": QUESTIONS[2]})
            return await asyncio.gather(*good, *bad, stream)

    t = time.monotonic()
    *good, r422, r413, r422b, r422c, r401, stream = asyncio.run(go())
    assert time.monotonic() - t < 240
    for r in good:
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["finish_reason"] in ("answer", "max_turns", "invalid", "max_total_tokens")
        assert body["usage"]["completion_tokens"] > 0 and body["timings"]["generate_s"] > 0
        for turn in body["turns"]:
            if turn["query"] is not None:
                assert 1 <= len(turn["docs"]) <= 3 and all(d["title"] and d["text"] for d in turn["docs"])
    assert any(b.json()["usage"]["searches"] > 0 for b in good)  # the prefilled <search> makes it search
    assert (r422.status_code, r413.status_code, r422b.status_code, r422c.status_code, r401.status_code) == \
        (422, 413, 422, 422, 401)
    assert r422.json()["detail"].startswith("topk") and r422b.json()["detail"].startswith("colour")
    assert r422c.json()["detail"].startswith("question: ")
    assert stream.status_code == 200
    events = [block.split("\n")[0] for block in stream.text.strip().split("\n\n")]
    assert events[-2:] == ["event: answer", "event: done"] and set(events[:-2]) <= {"event: turn"}


BAD_REQUESTS = [  # (body, extra headers, the statuses it may get)
    ({"question": QUESTIONS[0], "topk": 0}, {}, (422,)),
    ({"question": "x" * 70000}, {}, (413,)),
    ({"question": QUESTIONS[0], "colour": 1}, {}, (422,)),
    ({"question": "word " * 400}, {}, (422, 503)),  # the replica counts its tokens: 503 while it is dead
    ({"question": QUESTIONS[1]}, {"Authorization": "Bearer no"}, (401,)),
]


def test_the_other_replica_answers_while_the_killed_one_restarts(server):
    """One of the two replicas SIGKILLed: the other answers (never a 500; a 503 has Retry-After), and
    Serve brings the killed one back without restarting the survivor."""
    url, proc, log = server
    replicas = searcher_replicas(proc.pid)
    assert len(replicas) == 2, [r.cmdline() for r in replicas]
    victim = replicas[0]
    victim.kill()
    killed = time.monotonic()
    codes, first_200_s = [], None
    with httpx.Client(base_url=url, headers=AUTH, timeout=300) as c:
        # One at a time, no pause after a 503: with no replica left to answer (one replica) all 20 would
        # be quick 503s while the dead one restarts, and the test fails.
        for i in range(20):
            r = c.post("/v1/search", json={"question": QUESTIONS[i % len(QUESTIONS)], "max_turns": 0})
            codes.append(r.status_code)
            assert r.status_code in (200, 503), r.text  # never a 500
            if r.status_code == 503:
                assert r.headers.get("retry-after"), r.text
            elif first_200_s is None:
                first_200_s = time.monotonic() - killed
    assert first_200_s is not None, codes
    print(f"2 replicas, one SIGKILLed: first 200 {first_200_s:.1f} s after the kill; 20 sequential requests "
          f"{codes.count(200)} x 200, {codes.count(503)} x 503")
    again = wait_for_two_replicas(url, proc, log, killed)
    assert replicas[1].pid in again and victim.pid not in again, again  # the survivor was never restarted


@pytest.mark.heavy  # CI keeps a killed replica (above) and concurrent bad requests (test_concurrent_native_...)
def test_hundred_clients_with_both_replicas_killed_mid_load(server):
    """100 concurrent clients, 60 good and 40 bad requests, and both searcher replicas SIGKILLed while
    they are in flight: no 500 and no hang; every request is answered (200) or refused with a clear
    code (its 4xx, or 503 with Retry-After for a full queue or no live replica); then the endpoint
    answers again, from restarted replicas (new pids)."""
    url, proc, log = server
    pids = [p.pid for p in searcher_replicas(proc.pid)]
    assert len(pids) == 2, pids

    async def go():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=url, timeout=300, headers=AUTH, limits=limits) as c:
            plan = []
            for i in range(100):
                if i % 5 < 3:
                    plan.append(({"question": QUESTIONS[i % len(QUESTIONS)], "max_turns": 0}, {}, (200, 503)))
                else:
                    plan.append(BAD_REQUESTS[(i // 5 * 2 + i % 5 - 3) % len(BAD_REQUESTS)])
            tasks = [asyncio.create_task(c.post("/v1/search", json=body, headers=headers)) for body, headers, _ in plan]
            await asyncio.sleep(3)
            for pid in pids:  # no replica left: every request waits for a restarted one or gets a 503
                os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            responses = await asyncio.gather(*tasks)
            load_s = time.monotonic() - killed
            while True:  # the endpoint comes back: 503 + Retry-After until a replica is up again
                r = await c.post("/v1/search", json={"question": QUESTIONS[4], "max_turns": 0})
                if r.status_code == 200:
                    break
                assert r.status_code == 503 and r.headers.get("retry-after"), r.text
                assert time.monotonic() - killed < 300, "no answer 300 s after the replicas were killed"
                await asyncio.sleep(1)
            return plan, responses, load_s, time.monotonic() - killed

    plan, responses, load_s, back_s = asyncio.run(go())
    codes: dict[int, int] = {}
    for (_, _, allowed), r in zip(plan, responses, strict=True):
        codes[r.status_code] = codes.get(r.status_code, 0) + 1
        assert r.status_code in allowed, r.text
        if r.status_code == 503:
            assert r.headers.get("retry-after") and "retry" in r.json()["detail"], r.text
        assert r.json().get("detail" if r.status_code != 200 else "finish_reason")
    assert sum(codes.values()) == 100 and not any(code >= 500 and code != 503 for code in codes), codes
    after = httpx.get(f"{url}/health", timeout=30).json()["deployments"]["searcher"]["pid"]
    assert after not in pids
    print(f"100 clients, both replicas killed at 3 s: statuses {dict(sorted(codes.items()))}; all answered "
          f"{load_s:.1f} s after the kill; 200 again {back_s:.1f} s after it")


def test_health_retrieve_and_sigterm(server):
    url, proc, log = server
    wait_for_two_replicas(url, proc, log, time.monotonic())  # the restarted replicas, both
    r = httpx.get(f"{url}/health", timeout=30)  # no token needed
    assert r.status_code == 200, r.text
    assert set(r.json()["deployments"]) == {"searcher", "retrieval"} and r.json()["deployments"]["retrieval"]["num_shards"] == 2
    r = httpx.post(f"{url}/retrieve", json={"queries": QUESTIONS[:2], "topk": 2}, headers=AUTH, timeout=30)
    assert r.status_code == 200 and [len(row) for row in r.json()["result"]] == [2, 2]
    assert httpx.post(f"{url}/retrieve", json={"queries": ["a"]}, timeout=30).status_code == 401
    segments = tree_segments(proc.pid)  # the engines' vLLM message queues (psm_*, 160 MB each)
    assert segments, "no psm_* segment mapped by the server's processes: the check below would prove nothing"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    print(f"stopped {time.monotonic() - t0:.1f} s after SIGTERM")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=5)
    # A stop used to leave a psm_* segment every time, after Serve's controller ran past its 30 s.
    assert "Controller failed to shut down" not in log.read_text(), log.read_text()[-3000:]
    assert [p for p in segments if os.path.exists(p)] == [], log.read_text()[-3000:]
