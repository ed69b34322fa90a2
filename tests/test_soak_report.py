"""scripts.ops.soak_report: the soak's samples, summaries and pass/fail checks on short synthetic series."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from scripts.ops import soak_report as report
from scripts.ops.soak import app_processes, checkpoints_on_disk, disk_mb, measure, stop_and_check


def _procs(rss=1000.0, shm=100.0, fds=50):
    return {"rss_mb": rss, "rss_by_name_mb": {"x": rss}, "fds": fds, "shm_mb": shm, "object_store_mb": None}


def _serve_series(minutes=20, p99_growth=1.0, rss_growth=0.0, shm_growth=0.0, fds_growth=0, statuses=None):
    series = []
    for m in range(1, minutes + 1):
        late = 1.0 + (p99_growth - 1.0) * (m > minutes - 10)
        reqs = [(1.0 * late, 200, False)] * 97 + [(5.0 * late, 200, False)] * 2 + [(0.1, 422, False)]
        reqs += statuses or []
        frac = max(0, m - 10) / max(1, minutes - 10)
        series.append(report.serve_sample(m, reqs, _procs(1000 + rss_growth * frac, 100 + shm_growth * frac,
                                                          50 + round(fds_growth * frac))))
    return series


def test_serve_sample_percentiles_and_statuses():
    s = report.serve_sample(3, [(float(i), 200, False) for i in range(1, 101)] + [(9.0, 503, True), (9.0, 500, False)],
                            _procs())
    assert (s["p50_s"], s["p95_s"], s["p99_s"]) == (50.0, 95.0, 99.0)  # 5xx latencies are left out
    assert s["statuses"] == {200: 100, 503: 1, 500: 1} and s["retry_after_503"] == 1 and s["requests"] == 102
    assert math.isnan(report.serve_sample(1, [], _procs())["p99_s"])
    assert report.percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and report.percentile([1.0, 2.0], 0.0) == 1.0


def test_steady_serve_passes():
    summary = report.summarize_serve(_serve_series(), stop_s=12.0, left_behind=[])
    assert report.check_serve(summary) == []
    assert summary["requests"] == 20 * 100 and summary["errors_5xx"] == 0
    line = report.serve_line(summary)
    assert line.startswith("soak: kind=serve minutes=20 requests=2000 errors_5xx=0 p99_first10=5.00 p99_last10=5.00")
    assert line.endswith("rss_growth_mb=0 shm_growth_mb=0 fds_growth=0 stop_s=12.0")


@pytest.mark.parametrize("kwargs, stop_s, left, expect", [
    ({"p99_growth": 1.6}, 5.0, [], "p99 grew"),
    ({"rss_growth": 150.0}, 5.0, [], "RSS grew 15.0%"),
    ({"shm_growth": 64.0}, 5.0, [], "/dev/shm grew 64 MiB"),
    ({"fds_growth": 40}, 5.0, [], "open descriptors grew by 40"),
    ({"statuses": [(1.0, 500, False)]}, 5.0, [], "20 responses were 5xx"),
    ({}, 75.0, [], "stop took 75.0 s"),
    ({}, 5.0, ["VLLM::EngineCore (123)"], "left behind after the stop: VLLM::EngineCore (123)"),
])
def test_each_serve_condition_fails_alone(kwargs, stop_s, left, expect):
    failed = report.check_serve(report.summarize_serve(_serve_series(**kwargs), stop_s, left))
    assert len(failed) == 1 and expect in failed[0]


def test_503_with_retry_after_is_not_an_error():
    summary = report.summarize_serve(_serve_series(statuses=[(0.0, 503, True)]), 5.0, [])
    assert summary["errors_5xx"] == 0 and report.check_serve(summary) == []


def _train_series(steps=40, slow_last=1.0, rss_growth=0.0, checkpoints=2):
    return [{"step": s, "step_s": (50.0 if s > 1 else 90.0) * (slow_last if s > steps - 10 else 1.0),
             "rss_mb": 8000 + rss_growth * s / steps, "shm_mb": 500.0, "disk_mb": 4096.0 * min(s // 10, checkpoints),
             "checkpoints": min(s // 10, checkpoints)} for s in range(1, steps + 1)]


def test_train_summary_and_checks():
    summary = report.summarize_train(_train_series(), keep_checkpoints=2)
    assert summary["s_per_step_first10"] == 50.0  # step 1's warm-up left out
    assert report.check_train(summary) == []
    assert report.train_line(summary) == ("soak: kind=train steps=40 s_per_step_first10=50.0 s_per_step_last10=50.0 "
                                          "rss_growth_mb=0 shm_growth_mb=0 disk_gb=8.00 checkpoints_kept=2")
    assert "step time grew" in report.check_train(report.summarize_train(_train_series(slow_last=1.3), 2))[0]
    assert "RSS grew" in report.check_train(report.summarize_train(_train_series(rss_growth=2000.0), 2))[0]
    assert "4 checkpoints" in report.check_train(report.summarize_train(_train_series(checkpoints=4), 2))[0]
    assert report.check_train(report.summarize_train(_train_series(checkpoints=3), 2)) == []  # + the best


def test_control_run_separates_the_machine_drift_from_the_run_own_growth():
    """Steps 2-6 of a fresh control run take 1.4x those of the long run's start: a long run whose last 10
    steps are 1.4x slower fails the plain check but has grown 1.0x on its own; one 1.4x slower while the
    machine held fails both."""
    slow_end = _train_series(slow_last=1.4)
    machine_slowed = [dict(r, step_s=r["step_s"] * 1.4) for r in _train_series()[:6]]
    summary = report.summarize_train(slow_end, 2, machine_slowed)
    assert summary["machine_drift"] == pytest.approx(1.4) and summary["step_time_growth_own"] == pytest.approx(1.0)
    failed = report.check_train(summary)
    assert len(failed) == 1 and "step time grew" in failed[0] and "1.00x is this run's own" in failed[0]
    assert report.train_line(summary).endswith("s_per_step_control=70.0 machine_drift=1.40")
    steady = report.summarize_train(slow_end, 2, _train_series()[:6])
    failed = report.check_train(steady)
    assert len(failed) == 2 and "1.40x is this run's own" in failed[0] and "beyond the machine's" in failed[1]
    assert report.machine_drift(slow_end, _train_series()[:1]) == {}


def test_soak_rejects_a_control_run_of_one_step():
    from scripts.ops.soak import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--steps", "10", "--control-steps", "1"])
    assert e.value.code == 2


def test_plot_writes_a_png(tmp_path):
    path = report.plot(_serve_series(minutes=3), "minute", [("p99_s", "p99"), ("object_store_mb", "store")],
                       tmp_path / "s.png", "serve")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_measure_and_stop_see_the_whole_process_tree(tmp_path):
    """A parent with a child that ignores nothing: both are measured, and the stop reports none left."""
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(app_processes(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        figures = measure(proc.pid, with_object_store=False)
        assert figures["rss_mb"] > 0 and figures["fds"] > 0 and figures["shm_mb"] >= 0
        pids = {p.pid for p in app_processes(proc.pid)}
        assert len(pids) == 2
        stop_s, left = stop_and_check(proc, pids)
        # SIGTERM ends the parent; its orphaned child lives on and is reported by pid
        assert stop_s < 5 and len(left) == 1 and str(max(pids - {proc.pid})) in left[0]
    finally:
        for pid in pids:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, 9)


_APP = """
import pathlib, signal, sys, time
def stop(signum, frame):
    time.sleep(1)  # a cleanup that takes a while
    pathlib.Path(sys.argv[1]).write_text("stopped cleanly")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(120)
"""

_SOAK = """
import subprocess, sys, time
from scripts.ops import soak as soak
soak.stop_on_sigterm()
app = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE,
                       start_new_session=True)
with soak.stopping_child_on_exit(app, 30):
    app.stdout.readline()
    print(app.pid, flush=True)
    time.sleep(120)
"""


def test_sigterm_to_the_soak_stops_its_app_cleanly_first(tmp_path):
    """SIGTERM to the soak reaches the app (in its own session) as SIGTERM; the soak exits only after
    the app's own cleanup has run, and leaves no process behind."""
    import psutil

    marker = tmp_path / "stopped"
    soak = subprocess.Popen([sys.executable, "-c", _SOAK, _APP, str(marker)], stdout=subprocess.PIPE,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), text=True)
    app_pid = int(soak.stdout.readline())
    try:
        soak.send_signal(15)
        soak.wait(20)
        assert marker.read_text() == "stopped cleanly"
        assert not psutil.pid_exists(app_pid) or psutil.Process(app_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        for pid in (soak.pid, app_pid):
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_run_dir_figures(tmp_path):
    (tmp_path / "checkpoints" / "step-10").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-20").mkdir()
    (tmp_path / "checkpoints" / "step-20" / "w.bin").write_bytes(b"0" * 2 * 1024 * 1024)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    assert checkpoints_on_disk(tmp_path) == 2
    assert disk_mb(tmp_path) == pytest.approx(2.0, abs=0.01)


def test_drive_mixes_the_request_kinds_and_samples_each_minute():
    """scripts.ops.soak's clients against a stub app: every kind is sent, bad requests get 4xx, a 503 with
    Retry-After is told apart, and each (here one-second) minute becomes one sample."""
    import asyncio
    import io
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from scripts.ops.soak import drive

    seen = []

    class App(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status, body=b"{}", headers=()):
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(200, json.dumps({"data": [{"id": "policy"}]}).encode())

        def do_POST(self):
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            try:
                body = json.loads(raw)
            except ValueError:
                return self._send(400)
            seen.append((self.path, body))
            if body.get("question") == "" or body.get("topk") == 0 or body.get("messages") == []:
                return self._send(422)
            if len(seen) % 7 == 0:
                return self._send(503, headers=[("Retry-After", "1")])
            self._send(200)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), App)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        series, by_kind = asyncio.run(drive(url, ["q1", "q2"], clients=4, minutes=2, root_pid=os.getpid(),
                                            timeout_s=10, log=io.StringIO(), minute_s=1.5, object_store=False))
    finally:
        server.shutdown()
    assert [s["minute"] for s in series] == [1, 2] and all(s["rss_mb"] > 0 for s in series)
    assert set(by_kind) == {"search", "chat_stream", "chat", "retrieve", "bad"}
    assert all(400 <= status < 500 for status in by_kind["bad"])
    assert {p for p, _ in seen} >= {"/v1/search", "/v1/chat/completions", "/retrieve"}
    assert any(b.get("stream") for p, b in seen if p == "/v1/chat/completions")
    statuses = {}
    for s in series:
        for k, n in s["statuses"].items():
            statuses[k] = statuses.get(k, 0) + n
    assert statuses.get(503, 0) > 0 and sum(s["retry_after_503"] for s in series) == statuses[503]
    assert report.summarize_serve(series, 1.0, [])["errors_5xx"] == 0


def test_serve_soak_serves_the_run_s_own_config(tmp_path, data_dir, monkeypatch):
    """Without --config the soak serves what scripts.serve picks for the checkpoint (a run's own
    config.yaml), not a fixed Search-R1 config: an s3 run is soaked as s3, with its generator."""
    import argparse
    from types import SimpleNamespace

    import serving.config
    from configs.loader import load_config, save_config
    from scripts.ops.soak import serve_command

    run = tmp_path / "run"
    run.mkdir()
    save_config(load_config("configs/s3_main_cpu.yaml", [f"data.dir={data_dir}"]), run / "config.yaml")
    monkeypatch.setattr(serving.config, "resolve_served", lambda path: SimpleNamespace(config=run / "config.yaml"))
    args = argparse.Namespace(checkpoint=str(run), config=None, overrides=[], port=8020)
    cfg, cmd = serve_command(args)
    assert cfg.train.recipe == "s3" and "--config" not in cmd and cmd[cmd.index("--checkpoint") + 1] == str(run)
    args.config = "configs/search_r1_main_cpu.yaml"  # an explicit --config still wins
    cfg, cmd = serve_command(args)
    assert cfg.train.recipe == "search_r1" and cmd[cmd.index("--config") + 1] == args.config
