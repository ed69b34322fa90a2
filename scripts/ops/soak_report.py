"""What a soak (`scripts.ops.soak`) records and how it is judged: per-minute (serve) or per-step (train)
samples, their summary, the pass/fail checks, the one-line result and the picture.

Pure functions over lists of dicts, no Ray and no server, so they are tested on short synthetic series.

A serve sample (one a minute): `minute`, `requests`, `p50_s`, `p95_s`, `p99_s` (request latency,
seconds), `statuses` ({status code: count}), `retry_after_503` (503s that carried Retry-After),
`rss_mb` (all the app's processes together, MiB), `rss_by_name_mb`, `shm_mb` (/dev/shm used, MiB),
`object_store_mb` (Ray's plasma use, MiB; None when unknown), `fds` (open file descriptors of the
app's processes).

A train sample (one a step): `step`, `step_s` and the `time/*` phases (seconds), `rss_mb`, `shm_mb`,
`disk_mb` (the run directory, MiB), `checkpoints` (kept on disk).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

# What a soak must show to pass, in numbers.
P99_GROWTH_MAX = 1.5        # p99 of the last 10 minutes over the first 10
RSS_GROWTH_MAX = 0.10       # serve: total RSS growth after minute 10, as a share
STEP_TIME_GROWTH_MAX = 1.2  # train: s/step of the last 10 steps over steps 2-11
STOP_S_MAX = 60.0           # SIGTERM to exit, seconds
SHM_FLAT_MB = 32.0          # "flat": growth within this much /dev/shm (Ray's allocator works in chunks)
FDS_FLAT = 16               # "flat": growth within this many descriptors
TRAIN_RSS_FLAT_MB = 512.0   # train: RSS growth after step 2 within this much (one step's transient buffers)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank (the ceil(q·n)-th smallest); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def serve_sample(minute: int, requests: Sequence[tuple[float, int, bool]], procs: dict) -> dict:
    """One minute of the serve soak.

    Args:
        minute: minutes since the load started (1 = the first full minute).
        requests: (latency_s, status, has_retry_after) of each request that ended in this minute.
        procs: `{"rss_mb", "rss_by_name_mb", "fds", "shm_mb", "object_store_mb"}` measured at its end.
    """
    latencies = [lat for lat, status, _ in requests if status < 500]
    statuses: dict[int, int] = {}
    for _, status, _ in requests:
        statuses[status] = statuses.get(status, 0) + 1
    return {"minute": minute, "requests": len(requests), "p50_s": percentile(latencies, 0.50),
            "p95_s": percentile(latencies, 0.95), "p99_s": percentile(latencies, 0.99), "statuses": statuses,
            "retry_after_503": sum(1 for _, s, ra in requests if s == 503 and ra), **procs}


def _window(series: Sequence[dict], first: bool, n: int = 10) -> list[dict]:
    return list(series[:n] if first else series[-n:])


def _pooled_p99(rows: Sequence[dict]) -> float:
    """p99 of a window: the largest per-minute p99 would overweight one bad minute; the median of
    the minutes' p99 is steadier and still sees a trend."""
    values = [r["p99_s"] for r in rows if r["p99_s"] == r["p99_s"]]
    return statistics.median(values) if values else float("nan")


def summarize_serve(series: Sequence[dict], stop_s: float, left_behind: Sequence[str]) -> dict:
    """The serve soak's figures: requests, 5xx other than 503-with-Retry-After, p99 of the first and
    last 10 minutes, and growth after minute 10 of RSS (MiB and share), /dev/shm (MiB) and descriptors."""
    total = sum(r["requests"] for r in series)
    errors_5xx = sum(n for r in series for s, n in r["statuses"].items() if int(s) >= 500)
    errors_5xx -= sum(r["retry_after_503"] for r in series)
    base = series[min(9, len(series) - 1)] if series else {}
    end = series[-1] if series else {}

    def growth(key: str) -> float:
        return float(end.get(key, 0) - base.get(key, 0)) if series else 0.0

    return {"minutes": len(series), "requests": total, "errors_5xx": errors_5xx,
            "p99_first10": _pooled_p99(_window(series, True)),
            "p99_last10": _pooled_p99(_window(series, False)),
            "rss_growth_mb": growth("rss_mb"),
            "rss_growth_frac": growth("rss_mb") / base["rss_mb"] if series and base.get("rss_mb") else 0.0,
            "shm_growth_mb": growth("shm_mb"), "fds_growth": growth("fds"), "stop_s": stop_s,
            "left_behind": list(left_behind)}


def check_serve(summary: dict) -> list[str]:
    """The serve soak's conditions that do not hold, one line each (empty: all hold)."""
    s, failed = summary, []
    if s["errors_5xx"]:
        failed.append(f"{s['errors_5xx']} responses were 5xx other than 503 with Retry-After")
    if not s["p99_last10"] <= P99_GROWTH_MAX * s["p99_first10"]:
        failed.append(f"p99 grew: last 10 min {s['p99_last10']:.2f} s vs first 10 {s['p99_first10']:.2f} s "
                      f"(limit {P99_GROWTH_MAX}x)")
    if s["rss_growth_frac"] >= RSS_GROWTH_MAX:
        failed.append(f"RSS grew {100 * s['rss_growth_frac']:.1f}% after minute 10 (limit {100 * RSS_GROWTH_MAX:.0f}%)")
    if s["shm_growth_mb"] > SHM_FLAT_MB:
        failed.append(f"/dev/shm grew {s['shm_growth_mb']:.0f} MiB after minute 10 (flat: <= {SHM_FLAT_MB:.0f})")
    if s["fds_growth"] > FDS_FLAT:
        failed.append(f"open descriptors grew by {s['fds_growth']:.0f} after minute 10 (flat: <= {FDS_FLAT})")
    if not s["stop_s"] <= STOP_S_MAX:
        failed.append(f"stop took {s['stop_s']:.1f} s (limit {STOP_S_MAX:.0f})")
    if s["left_behind"]:
        failed.append("left behind after the stop: " + ", ".join(s["left_behind"]))
    return failed


def serve_line(s: dict) -> str:
    """`soak: kind=serve minutes=... requests=... errors_5xx=... p99_first10=... p99_last10=...
    rss_growth_mb=... shm_growth_mb=... fds_growth=... stop_s=...`"""
    return (f"soak: kind=serve minutes={s['minutes']} requests={s['requests']} errors_5xx={s['errors_5xx']} "
            f"p99_first10={s['p99_first10']:.2f} p99_last10={s['p99_last10']:.2f} "
            f"rss_growth_mb={s['rss_growth_mb']:.0f} shm_growth_mb={s['shm_growth_mb']:.0f} "
            f"fds_growth={s['fds_growth']:.0f} stop_s={s['stop_s']:.1f}")


def machine_drift(series: Sequence[dict], control: Sequence[dict]) -> dict:
    """How much the machine itself slowed over the soak. `control` is a fresh run of the same config,
    started right after the long one `series`: its first steps repeat the long run's first steps on the
    same data, with nothing carried over. Returns `control_steps`, `s_per_step_start` and
    `s_per_step_control` (medians of steps 2..N of each, seconds) and `machine_drift` (their ratio; above
    1: the machine was slower at the end); {} when the control has fewer than 2 steps."""
    n = min(len(control), len(series))
    if n < 2:
        return {}
    start = statistics.median(r["step_s"] for r in series[1:n])
    again = statistics.median(r["step_s"] for r in control[1:n])
    return {"control_steps": n, "s_per_step_start": start, "s_per_step_control": again,
            "machine_drift": again / start}


def summarize_train(series: Sequence[dict], keep_checkpoints: int | None,
                    control: Sequence[dict] = ()) -> dict:
    """The train soak's figures: median seconds per step over steps 2-11 and over the last 10, RSS and
    /dev/shm growth from step 2 to the end (MiB), the run's size on disk at the end (GB) and the
    largest number of checkpoints kept at once; with a `control` run, `machine_drift`'s figures and
    `step_time_growth_own` (the last 10's growth over steps 2-11, divided by the machine's drift)."""
    steps = [r["step_s"] for r in series]
    base = series[1] if len(series) > 1 else (series[0] if series else {})
    end = series[-1] if series else {}
    first10 = statistics.median(steps[1:11]) if len(steps) > 1 else float("nan")
    last10 = statistics.median(steps[-10:]) if steps else float("nan")
    drift = machine_drift(series, control)
    if drift:
        drift["step_time_growth_own"] = last10 / first10 / drift["machine_drift"]
    return {**drift, "steps": len(series), "s_per_step_first10": first10, "s_per_step_last10": last10,
            "rss_growth_mb": float(end.get("rss_mb", 0) - base.get("rss_mb", 0)),
            "shm_growth_mb": float(end.get("shm_mb", 0) - base.get("shm_mb", 0)),
            "disk_gb": end.get("disk_mb", 0) / 1024, "checkpoints_kept": max((r["checkpoints"] for r in series),
                                                                              default=0),
            "keep_checkpoints": keep_checkpoints}


def check_train(summary: dict) -> list[str]:
    """The training soak's conditions that do not hold, one line each (empty: all hold). The checkpoint
    bound allows the best checkpoint beside the last `keep_checkpoints`. With a control run, the step time
    must also hold once the machine's own drift is divided out; the plain step-time check stays."""
    s, failed = summary, []
    if not s["s_per_step_last10"] <= STEP_TIME_GROWTH_MAX * s["s_per_step_first10"]:
        why = (f"; a fresh run of the same config right after took {s['machine_drift']:.2f}x as long as this "
               f"run's steps 2-{s['control_steps']}, so {s['step_time_growth_own']:.2f}x is this run's own"
               if "machine_drift" in s else "")
        failed.append(f"step time grew: last 10 {s['s_per_step_last10']:.1f} s vs steps 2-11 "
                      f"{s['s_per_step_first10']:.1f} s (limit {STEP_TIME_GROWTH_MAX}x){why}")
    if s.get("step_time_growth_own", 0) > STEP_TIME_GROWTH_MAX:
        failed.append(f"step time grew {s['step_time_growth_own']:.2f}x beyond the machine's own drift "
                      f"({s['machine_drift']:.2f}x; limit {STEP_TIME_GROWTH_MAX}x)")
    if s["rss_growth_mb"] > TRAIN_RSS_FLAT_MB:
        failed.append(f"RSS grew {s['rss_growth_mb']:.0f} MiB after step 2 (flat: <= {TRAIN_RSS_FLAT_MB:.0f})")
    if s["shm_growth_mb"] > SHM_FLAT_MB:
        failed.append(f"/dev/shm grew {s['shm_growth_mb']:.0f} MiB after step 2 (flat: <= {SHM_FLAT_MB:.0f})")
    if s["keep_checkpoints"] and s["checkpoints_kept"] > s["keep_checkpoints"] + 1:
        failed.append(f"{s['checkpoints_kept']} checkpoints on disk at once; train.keep_checkpoints is "
                      f"{s['keep_checkpoints']} (+ the best)")
    return failed


def train_line(s: dict) -> str:
    """`soak: kind=train steps=... s_per_step_first10=... s_per_step_last10=... rss_growth_mb=...
    shm_growth_mb=... disk_gb=... checkpoints_kept=...`, then `s_per_step_control=... machine_drift=...`
    with a control run."""
    return (f"soak: kind=train steps={s['steps']} s_per_step_first10={s['s_per_step_first10']:.1f} "
            f"s_per_step_last10={s['s_per_step_last10']:.1f} rss_growth_mb={s['rss_growth_mb']:.0f} "
            f"shm_growth_mb={s['shm_growth_mb']:.0f} disk_gb={s['disk_gb']:.2f} "
            f"checkpoints_kept={s['checkpoints_kept']}" + (
                f" s_per_step_control={s['s_per_step_control']:.1f} machine_drift={s['machine_drift']:.2f}"
                if "machine_drift" in s else ""))


def plot(series: Sequence[dict], x: str, panels: Sequence[tuple[str, str]], path: Path, title: str) -> Path:
    """One panel per (key, label) of `series` against `x`, stacked; written as a PNG to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.0 * len(panels)), sharex=True)
    xs = [r[x] for r in series]
    for ax, (key, label) in zip(axes, panels):
        ax.plot(xs, [r.get(key) if r.get(key) is not None else float("nan") for r in series], marker=".")
        ax.set_ylabel(label, fontsize=8)
    axes[0].set_title(title)
    axes[-1].set_xlabel(x)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
