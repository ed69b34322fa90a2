"""The /dev/shm sweep removes unmapped vLLM / DeepSpeed files of this user and keeps mapped ones."""

import mmap
import os

from cluster.shm import STOP_SWEEP_MIN_AGE_S, sweep_stale_shm


def test_sweep_removes_orphans_and_keeps_mapped(tmp_path):
    orphan = tmp_path / "psm_orphan"
    orphan.write_bytes(b"x" * 4096)
    other = tmp_path / "unrelated_file"
    other.write_bytes(b"x")
    held = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_1_0"
    held.write_bytes(b"x" * 4096)
    old = os.stat(orphan).st_mtime - 3600
    for f in (orphan, held, other):
        os.utime(f, (old, old))
    with open(held, "r+b") as fh, mmap.mmap(fh.fileno(), 4096):
        removed = sweep_stale_shm(min_age_s=60, shm_dir=str(tmp_path))
    assert removed == [str(orphan)] and held.exists() and other.exists()


def test_end_of_run_sweep_removes_a_segment_written_seconds_ago_and_spares_open_ones(tmp_path):
    """At a run's end an engine's last segment may be seconds old: the default age guard (60 s) keeps
    it, the end-of-run guard removes it. A file some process holds open, even a fresh one, stays."""
    orphan = tmp_path / "psm_recent"
    orphan.write_bytes(b"x" * 4096)
    ten_s_ago = os.stat(orphan).st_mtime - 10
    os.utime(orphan, (ten_s_ago, ten_s_ago))
    opened = tmp_path / "psm_being_created"
    with open(opened, "wb") as fh:  # created, not yet mapped: its creator holds it open
        assert sweep_stale_shm(shm_dir=str(tmp_path)) == []
        removed = sweep_stale_shm(min_age_s=STOP_SWEEP_MIN_AGE_S, shm_dir=str(tmp_path))
        assert sweep_stale_shm(min_age_s=0, shm_dir=str(tmp_path)) == []
        fh.write(b"x")
    assert removed == [str(orphan)] and opened.exists()
