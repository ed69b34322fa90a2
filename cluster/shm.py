"""Remove shared-memory files that vLLM and DeepSpeed leave in /dev/shm when a process dies without
shutting down (killed, out of memory): vLLM's message-queue segments (`psm_*`, 160-250 MB each),
DeepSpeed's CPU all-reduce buffers (`deepspeed_allreduce_buffer_*`, 66 MB each) and the named semaphores
joblib's loky makes in vLLM's worker processes (`sem.loky-<pid>-*`, 32 bytes; unlinked by a finalizer that
a killed process never runs). A clean shutdown removes them itself; this sweeps what a crash left."""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path

PATTERNS = ("psm_*", "deepspeed_allreduce_buffer_*", "sem.loky-*")

# Age (s) below which the sweep at the end of a run keeps a file. Every engine of the run has stopped by then,
# and a live engine of another run maps or holds open its segments from their creation on (the sweep spares
# those), so a short guard suffices. With the default 60 s, a segment an engine wrote to in its last minute
# stayed behind: 160 MiB after a 10-step soak run.
STOP_SWEEP_MIN_AGE_S = 5.0


def mapped_shm_files(shm_dir: str = "/dev/shm") -> set[str]:
    """Paths under `shm_dir` some live process maps or holds open (readable /proc entries only)."""
    prefix = str(Path(shm_dir)) + "/"
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                path = line.split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if path.startswith(prefix):
                    used.add(path.removesuffix(" (deleted)"))
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(prefix):
                    used.add(target)
        except OSError:
            continue
    return used


def segments_mapped_by(pids: list[int], shm_dir: str = "/dev/shm") -> set[str]:
    """Paths under `shm_dir` that the processes `pids` map now (not yet unlinked); unreadable or gone
    processes give none."""
    prefix = str(Path(shm_dir)) + "/"
    found: set[str] = set()
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            path = line.split(None, 5)[-1] if line.count(" ") >= 5 else ""
            if path.startswith(prefix) and not path.endswith("(deleted)"):
                found.add(path)
    return found


def tree_segments(root_pid: int | None = None, shm_dir: str = "/dev/shm") -> set[str]:
    """The vLLM / DeepSpeed segments (`PATTERNS`) under `shm_dir` that process `root_pid` (None: this
    process) or any of its descendants maps now: what a program's own engines hold, to remove with
    `remove_unmapped` once it stopped them. Empty when `root_pid` is gone; unreadable processes give none."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        pids = [root.pid] + [p.pid for p in root.children(recursive=True)]
    except psutil.Error:
        return set()
    return {path for path in segments_mapped_by(pids, shm_dir)
            if any(fnmatch.fnmatch(Path(path).name, pattern) for pattern in PATTERNS)}


def remove_unmapped(paths: set[str], shm_dir: str = "/dev/shm") -> list[str]:
    """Delete those of `paths` that still exist and that no live process maps or holds open (what a
    force-killed process left). Returns the removed paths."""
    used, removed = mapped_shm_files(shm_dir), []
    for f in sorted(paths - used):
        try:
            os.unlink(f)
            removed.append(f)
        except FileNotFoundError:
            continue
        except OSError:
            continue
    return removed


def sweep_stale_shm(min_age_s: float = 60.0, shm_dir: str = "/dev/shm") -> list[str]:
    """Delete this user's vLLM / DeepSpeed / loky shared-memory files (`PATTERNS`) that no live process maps or holds
    open and that are older than `min_age_s` seconds (a starting engine may not have mapped its
    segment yet). Returns the removed paths."""
    used, now, removed = mapped_shm_files(shm_dir), time.time(), []
    for pattern in PATTERNS:
        for f in Path(shm_dir).glob(pattern):
            try:
                st = f.stat()
                if st.st_uid != os.getuid() or str(f) in used or now - st.st_mtime < min_age_s:
                    continue
                f.unlink()
                removed.append(str(f))
            except OSError:
                continue
    return removed
