"""Soak: the served searcher, or a long training run, under steady load, measured until it ends.

    .venv/bin/python -m scripts.ops.soak serve --minutes 60 [--checkpoint gemma3-270m] [--config FILE] [--clients 16]
    .venv/bin/python -m scripts.ops.soak train --steps 40 [--full-steps 10]

`serve` starts `scripts.serve` in its own process group and drives it from `--clients` concurrent
clients: native `/v1/search`, streamed and plain `/v1/chat/completions`, `/retrieve`, and 10% bad
requests (which must get a 4xx). Every minute it records latency percentiles and statuses, the RSS
and open descriptors of every process of the app (the server and all its descendants: Ray's
processes, Serve's proxy and replicas, the vLLM engine core), /dev/shm and Ray's object-store use.
Then SIGTERM: it times the stop and lists any process of the app left behind.
SIGTERM or Ctrl-C to the soak itself is passed on to the app, which gets to stop cleanly before the
soak exits (`stopping_child_on_exit`).

`train` runs `scripts.train` with `configs/soak_train_cpu.yaml` (the main job's model and recipe,
cut to a step of under a minute, checkpoints every 10 steps, learner_recovery: snapshot) for
`--steps`, then `--full-steps` of the main job's own config, recording per step the step time and its
phases, the same memory figures, the run directory's size and the checkpoints kept. Between the two, a
fresh run of `--control-steps` steps repeats the long run's first steps on the same data: how much
slower it is than the long run's start is the machine's own drift, not something the run accumulated.

Each prints one `soak:` line (scripts.ops.soak_report) and writes `<out>/soak.json` (the series, the
summary and the failed checks) and `<out>/soak.png`. Exit status 0 when every check holds,
1 when one does not (they are printed), 2 for bad arguments. Not run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.ops import soak_report as report

MIB = 1024 * 1024
SERVE_STOP_WAIT_S = 120.0  # seconds scripts.serve gets to stop (its own deadline is 60 s) before SIGKILL


def train_stop_wait_s() -> float:
    """Seconds scripts.train gets to stop before SIGKILL: its own exit deadline (it may finish an update
    and a checkpoint first; `pipelines.graceful_stop.STOP_TIMEOUT_S`, SEARCHRL_STOP_TIMEOUT_S) + 30."""
    from cluster.exit_deadline import stop_timeout_s
    from pipelines.graceful_stop import STOP_TIMEOUT_S

    return stop_timeout_s(STOP_TIMEOUT_S) + 30.0


# ----------------------------------------------------------------------------- process figures


def app_processes(root_pid: int) -> list:
    """`psutil.Process`es of the app: the root and all its descendants (empty once it has exited)."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def process_name(proc) -> str:
    """A short, stable name: Ray's worker title (`ray::ServeReplica:...`) or the program and module."""
    with contextlib.suppress(Exception):
        cmd = proc.cmdline()
        if cmd and cmd[0].startswith(("ray::", "VLLM::")):
            return cmd[0].split()[0][:60]
        if "-m" in cmd:
            return cmd[cmd.index("-m") + 1][:60]
        return Path(cmd[0]).name[:60] if cmd else proc.name()
    return "?"


def object_store_mb() -> float | None:
    """Ray's plasma use (MiB) from `ray memory --stats-only` against the newest local cluster (with
    token auth, as a local cluster of this Ray has it, then without); None when it cannot tell (no
    cluster, or the CLI fails within 30 s)."""
    ray = Path(sys.executable).with_name("ray")
    for mode in ("token", None):
        env = {**os.environ, **({"RAY_AUTH_MODE": mode} if mode else {})}
        try:
            out = subprocess.run([str(ray), "memory", "--stats-only"], capture_output=True, text=True, timeout=30,
                                 env=env).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        if match := re.search(r"Plasma memory usage (\d+(?:\.\d+)?) MiB", out):
            return float(match.group(1))
    return None


def measure(root_pid: int, with_object_store: bool = True) -> dict:
    """RSS (MiB, total and by process name), open descriptors, /dev/shm used (MiB) and Ray's object
    store (MiB) of the app rooted at `root_pid`."""
    import psutil

    by_name: dict[str, float] = {}
    fds = 0
    for proc in app_processes(root_pid):
        with contextlib.suppress(psutil.Error):
            rss = proc.memory_info().rss / MIB
            name = process_name(proc)
            by_name[name] = by_name.get(name, 0.0) + rss
            fds += proc.num_fds()
    return {"rss_mb": round(sum(by_name.values()), 1), "rss_by_name_mb": {k: round(v, 1) for k, v in by_name.items()},
            "fds": fds, "shm_mb": round(shutil.disk_usage("/dev/shm").used / MIB, 1),
            "object_store_mb": object_store_mb() if with_object_store else None}


def stop_child(proc: subprocess.Popen, wait_s: float) -> bool:
    """Stop `proc` as `kill PID` would, so its own cleanup stops Ray and the engines: SIGTERM to it alone
    (SIGTERM to its group killed Ray's GCS first and orphaned an engine), then up to `wait_s` seconds;
    past that, SIGKILL to its whole process group. True when it exited within `wait_s`."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
        return True
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


@contextlib.contextmanager
def stopping_child_on_exit(proc: subprocess.Popen, wait_s: float):
    """Inside: any exception (KeyboardInterrupt from Ctrl-C, or from SIGTERM with `stop_on_sigterm`)
    first stops `proc` with `stop_child(proc, wait_s)`, then propagates. `proc` runs in its own session,
    so a signal to the soak does not reach it by itself."""
    try:
        yield
    except BaseException:
        stop_child(proc, wait_s)
        raise


def stop_on_sigterm() -> None:
    """Make SIGTERM stop the soak as Ctrl-C does (KeyboardInterrupt), so `stopping_child_on_exit`
    forwards it to the app. Not `scripts.cli.sigterm_as_interrupt`: the exit deadline it arms (60 s) kills
    this process's children, and scripts.train may take up to its own deadline to stop cleanly. The wait
    in `stopping_child_on_exit` bounds the stop instead."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)


def stop_and_check(proc: subprocess.Popen, pids: set[int],
                   deadline_s: float = SERVE_STOP_WAIT_S) -> tuple[float, list[str]]:
    """SIGTERM the app's main process; seconds until it exited (its whole group is killed after
    `deadline_s`) and `name (pid)` of each process of the app still alive 5 s after that, the
    `cluster.leftovers`-marked ones included."""
    import psutil

    from cluster.leftovers import leftovers

    t = time.perf_counter()
    stop_s = time.perf_counter() - t if stop_child(proc, deadline_s) else float("inf")
    time.sleep(5)
    left = []
    for pid in sorted(pids):
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process_name(p)} ({pid})")
    left += [f"{process_name(p)} ({p.pid})" for p in leftovers() if p.pid not in pids]
    return stop_s, left


# ----------------------------------------------------------------------------- serve


BAD_REQUESTS = [  # (path, raw body): each must get a 4xx
    ("/v1/search", b"{not json"),
    ("/v1/search", b'{"question": ""}'),
    ("/retrieve", b'{"queries": ["x"], "topk": 0}'),
    ("/v1/chat/completions", b'{"model": "?", "messages": []}'),
]


async def one_request(client, kind: str, question: str, model: str, rng: random.Random) -> tuple[int, bool]:
    """Send one request of `kind`; (status, whether a 503 carried Retry-After). Streams are read to the end."""
    if kind == "search":
        r = await client.post("/v1/search", json={"question": question})
    elif kind == "retrieve":
        r = await client.post("/retrieve", json={"queries": [question], "topk": 3})
    elif kind in ("chat", "chat_stream"):
        body = {"model": model, "messages": [{"role": "user", "content": question}], "stream": kind == "chat_stream"}
        if kind == "chat_stream":
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_bytes():
                    pass
        else:
            r = await client.post("/v1/chat/completions", json=body)
    else:
        path, raw = rng.choice(BAD_REQUESTS)
        r = await client.post(path, content=raw, headers={"Content-Type": "application/json"})
    return r.status_code, r.status_code == 503 and "retry-after" in r.headers


KINDS = [("search", 0.4), ("chat_stream", 0.2), ("chat", 0.2), ("retrieve", 0.1), ("bad", 0.1)]


async def drive(url: str, questions: list[str], clients: int, minutes: int, root_pid: int, timeout_s: float,
                log, minute_s: float = 60.0, object_store: bool = True) -> tuple[list[dict], dict]:
    """`clients` concurrent clients for `minutes` (of `minute_s` seconds); one sample a minute
    (`soak_report.serve_sample`) with the figures of the app rooted at `root_pid`. Returns the series
    and, by request kind, the statuses seen."""
    import httpx

    from serving.auth import auth_headers

    done: list[tuple[float, float, int, bool]] = []  # (end time, latency, status, retry-after)
    by_kind: dict[str, dict[int, int]] = {}
    start = time.monotonic()
    end = start + minute_s * minutes

    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, headers=auth_headers()) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def worker(i: int) -> None:
            rng = random.Random(i)
            while time.monotonic() < end:
                kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
                t = time.monotonic()
                try:
                    status, retry_after = await one_request(client, kind, rng.choice(questions), model, rng)
                except httpx.HTTPError:  # a timeout or a dropped connection: counted as a 599
                    status, retry_after = 599, False
                done.append((time.monotonic(), time.monotonic() - t, status, retry_after))
                counts = by_kind.setdefault(kind, {})
                counts[status] = counts.get(status, 0) + 1
                if retry_after:
                    await asyncio.sleep(1.0)

        async def sampler() -> list[dict]:
            series = []
            for minute in range(1, minutes + 1):
                await asyncio.sleep(max(0.0, start + minute_s * minute - time.monotonic()))
                lo, hi = start + minute_s * (minute - 1), start + minute_s * minute
                reqs = [(lat, s, ra) for t, lat, s, ra in done if lo <= t < hi]
                procs = await asyncio.to_thread(measure, root_pid, object_store)
                series.append(report.serve_sample(minute, reqs, procs))
                s = series[-1]
                print(f"minute {minute}: {s['requests']} requests, p50 {s['p50_s']:.2f} s, p99 {s['p99_s']:.2f} s, "
                      f"statuses {s['statuses']}, rss {s['rss_mb']:.0f} MiB, shm {s['shm_mb']:.0f} MiB, "
                      f"fds {s['fds']}, object store {s['object_store_mb']} MiB", file=log, flush=True)
            return series

        workers = [asyncio.create_task(worker(i)) for i in range(clients)]
        series = await sampler()
        _, pending = await asyncio.wait(workers, timeout=timeout_s)  # the last requests end before the stop
        for task in pending:
            task.cancel()
    return series, by_kind


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Until `GET /health` answers 200. Raises RuntimeError when the server exits or `timeout_s` passes."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"scripts.serve exited with status {proc.returncode} before it was healthy")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        time.sleep(3)
    raise RuntimeError(f"scripts.serve was not healthy within {timeout_s:.0f} s")


def serve_command(args) -> tuple[Any, list[str]]:
    """(the config the server runs, its `scripts.serve` command): `--config` when given, else what
    `scripts.serve` picks for `--checkpoint` (a run's own `config.yaml`, else its default), so an s3 run is
    soaked as s3, with its generator.

    Raises:
        CheckpointError: `--checkpoint` names nothing servable. ConfigError: a bad config or override.
    """
    from serving.config import load_serving

    _, cfg = load_serving(args.checkpoint, args.config, args.overrides)
    cmd = [sys.executable, "-m", "scripts.serve", "--checkpoint", args.checkpoint,
           *(["--config", args.config] if args.config else []),
           f"serve.port={args.port}", "serve.host=127.0.0.1", *args.overrides]
    return cfg, cmd


def soak_serve(args) -> int:
    """The serve soak (see the module docstring)."""
    from pipelines.evaluate import load_questions

    cfg, cmd = serve_command(args)
    questions = [e["question"] for e in load_questions(cfg.data.test, cfg.data.dir, 64, sample_seed=cfg.seed)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"
    with open(out / "serve.log", "w") as server_log:
        proc = subprocess.Popen(cmd, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
        with stopping_child_on_exit(proc, SERVE_STOP_WAIT_S):
            wait_healthy(url, proc, args.start_timeout_s)
            print(f"serving at {url}; {args.clients} clients for {args.minutes} min", flush=True)
            series, by_kind = asyncio.run(drive(url, questions, args.clients, args.minutes, proc.pid,
                                                cfg.serve.request_timeout_s + 30, sys.stdout))
        pids = {p.pid for p in app_processes(proc.pid)}
        stop_s, left = stop_and_check(proc, pids)
    summary = report.summarize_serve(series, stop_s, left)
    panels = [("p50_s", "p50 s"), ("p99_s", "p99 s"), ("requests", "requests/min"), ("rss_mb", "RSS MiB"),
              ("shm_mb", "/dev/shm MiB"), ("object_store_mb", "object store MiB"), ("fds", "open fds")]
    return finish(out, series, summary, report.check_serve(summary), report.serve_line(summary), "minute", panels,
                  {"statuses_by_kind": by_kind, "command": cmd})


# ----------------------------------------------------------------------------- train


def checkpoints_on_disk(run_dir: Path) -> int:
    """`checkpoints/step-*` directories under the run directory."""
    return len(list((run_dir / "checkpoints").glob("step-*"))) if (run_dir / "checkpoints").is_dir() else 0


def disk_mb(path: Path) -> float:
    """Bytes under `path` (`pipelines.checkpoints.dir_bytes`), in MiB."""
    from pipelines.checkpoints import dir_bytes

    return dir_bytes(path) / MIB


def train_phase(config: str, steps: int, overrides: list[str], out: Path, phase: str) -> list[dict]:
    """Run `scripts.train` for `steps` steps into `out/phase`; one sample per finished step, the memory
    figures taken when its row reaches metrics.jsonl (polled every 2 s)."""
    parent = out / phase
    parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "scripts.train", "--config", config, f"train.total_steps={steps}",
           f"run_dir={parent}", *overrides]
    series: list[dict] = []
    with open(parent / "train.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with stopping_child_on_exit(proc, train_stop_wait_s()):
            seen = 0
            while True:
                running = proc.poll() is None
                runs = sorted(p for p in parent.iterdir() if (p / "metrics.jsonl").is_file())
                if runs:
                    rows = [json.loads(line) for line in (runs[-1] / "metrics.jsonl").read_text().splitlines()
                            if line.strip()]
                    rows = [r for r in rows if "time/step_s" in r]
                    for r in rows[seen:]:
                        sample = {"phase": phase, "step": r["step"], "step_s": r["time/step_s"],
                                  **{k: v for k, v in r.items() if k.startswith("time/") and k != "time/step_s"},
                                  **measure(proc.pid, with_object_store=False),
                                  "disk_mb": round(disk_mb(runs[-1]), 1), "checkpoints": checkpoints_on_disk(runs[-1])}
                        series.append(sample)
                        print(f"{phase} step {sample['step']}: {sample['step_s']:.1f} s, rss {sample['rss_mb']:.0f} "
                              f"MiB, shm {sample['shm_mb']:.0f} MiB, disk {sample['disk_mb']:.0f} MiB, "
                              f"{sample['checkpoints']} checkpoints", flush=True)
                    seen = len(rows)
                if not running:
                    break
                time.sleep(2)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts.train ({phase}) exited with status {proc.returncode}; see {parent}/train.log")
    return series


def soak_train(args) -> int:
    """The training soak (see the module docstring)."""
    from configs.loader import load_config

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    series = train_phase(args.config, args.steps, args.overrides, out, "short")
    extra: dict = {}
    control: list[dict] = []
    if args.control_steps:  # the same steps again, fresh, right away: how much the machine itself drifted
        control = train_phase(args.config, args.control_steps, args.overrides, out, "control")
        extra["control"] = {"series": control}
    summary = report.summarize_train(series, cfg.train.keep_checkpoints, control)
    failed = report.check_train(summary)
    if args.full_steps:
        full = train_phase(args.full_config, args.full_steps, [], out, "full")
        extra["full"] = {"series": full, "summary": report.summarize_train(full, None)}
        print("full size: " + report.train_line(extra["full"]["summary"]))
    panels = [("step_s", "s/step"), ("rss_mb", "RSS MiB"), ("shm_mb", "/dev/shm MiB"), ("disk_mb", "run dir MiB"),
              ("checkpoints", "checkpoints")]
    return finish(out, series, summary, failed, report.train_line(summary), "step", panels, extra)


def finish(out: Path, series: list[dict], summary: dict, failed: list[str], line: str, x: str,
           panels: list[tuple[str, str]], extra: dict) -> int:
    """Write soak.json and soak.png, print the failed checks and the line; 0 when none failed."""
    (out / "soak.json").write_text(json.dumps({"line": line, "summary": summary, "failed": failed,
                                               "series": series, **extra}, indent=1, default=str))
    png = report.plot(series, x, panels, out / "soak.png", line.split(" ", 2)[1])
    for f in failed:
        print(f"check failed: {f}")
    print(f"series: {out / 'soak.json'}  picture: {png}")
    print(line)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point (exit 0: every check holds; 1: one does not; 2: bad arguments; 130: stopped by SIGTERM or
    Ctrl-C, after the app it started has stopped)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.ops.soak", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    serve = sub.add_parser("serve", help="drive scripts.serve from concurrent clients")
    serve.add_argument("--minutes", type=int, default=60)
    serve.add_argument("--checkpoint", default="gemma3-270m", help="what scripts.serve serves (--checkpoint)")
    serve.add_argument("--config", default=None,
                       help="the served config; default: the run's own config.yaml, as scripts.serve picks it")
    serve.add_argument("--clients", type=int, default=16)
    serve.add_argument("--port", type=int, default=8020)
    serve.add_argument("--start-timeout-s", type=float, default=600.0)
    serve.add_argument("--out", default="runs/soak-serve")
    train = sub.add_parser("train", help="a long scripts.train run, then the s3 main job's size (configs/s3_main_cpu.yaml)")
    train.add_argument("--steps", type=int, default=40)
    train.add_argument("--config", default="configs/soak_train_cpu.yaml")
    train.add_argument("--control-steps", type=int, default=6,
                       help="then a fresh run of --config for this many steps, to tell the machine's drift (0: none)")
    train.add_argument("--full-steps", type=int, default=10, help="steps of --full-config after it (0: none)")
    train.add_argument("--full-config", default="configs/s3_main_cpu.yaml")
    train.add_argument("--out", default="runs/soak-train")
    for p in (serve, train):
        p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = parser.parse_args(argv)
    if any("=" not in o for o in args.overrides):
        parser.error("overrides are key=value")
    if (args.kind == "serve" and args.minutes < 1) or (args.kind == "train" and args.steps < 2):
        parser.error("--minutes must be >= 1 and --steps >= 2")
    if args.kind == "train" and args.control_steps and not 2 <= args.control_steps <= args.steps:
        parser.error("--control-steps must be 0 (none) or from 2 to --steps")
    from configs.loader import ConfigError
    from serving.checkpoint import CheckpointError

    stop_on_sigterm()
    try:
        return soak_serve(args) if args.kind == "serve" else soak_train(args)
    except KeyboardInterrupt as e:  # the app has been stopped (stopping_child_on_exit)
        print(f"soak stopped by {e or 'SIGINT'} before its end; no soak line", file=sys.stderr)
        return 130
    except (CheckpointError, ConfigError) as e:  # raised before anything was started
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
