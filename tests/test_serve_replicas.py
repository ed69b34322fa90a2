"""`scripts.serve` with two searcher replicas (`serve.replicas=2`, two vLLM CPU engines): one replica
SIGKILLed, and the other keeps answering while Serve restarts the dead one; no 500, each failure a
503 with Retry-After. Slow: it starts Ray, Serve and two engines (about 4 minutes here)."""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest

from tests.test_serve_e2e import AUTH, QUESTIONS, start_server


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


@pytest.fixture(scope="module")
def two_replicas(small_index, tmp_path_factory):
    url, proc, log = start_server(small_index, tmp_path_factory.mktemp("serve2"), "serve.replicas=2")
    yield url, proc, log
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_other_replica_answers_while_the_killed_one_restarts(two_replicas):
    url, proc, log = two_replicas
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
    deadline = time.monotonic() + 420  # Serve brings the killed replica back
    while len(searcher_replicas(proc.pid)) < 2 or httpx.get(f"{url}/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, f"no second replica 420 s after the kill:\n{log.read_text()[-3000:]}"
        time.sleep(2)
    again = [p.pid for p in searcher_replicas(proc.pid)]
    assert replicas[1].pid in again and victim.pid not in again, again  # the survivor was never restarted
    print(f"2 replicas again {time.monotonic() - killed:.1f} s after the kill")
