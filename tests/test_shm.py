"""The /dev/shm sweep removes unmapped vLLM / DeepSpeed files of this user and keeps mapped ones."""

import mmap
import os
import subprocess
import sys

from cluster.shm import STOP_SWEEP_MIN_AGE_S, remove_unmapped, sweep_stale_shm, tree_segments


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


def test_a_programs_own_segments_are_found_in_its_process_tree_and_removed_once_unmapped(tmp_path):
    """`serving.launch.stop_app`: the segments its processes map before the stop (here a child's), removed
    once no process maps them; files of other kinds and other processes' files are never listed."""
    segment, other = tmp_path / "psm_0a1b2c3d", tmp_path / "unrelated_file"
    for f in (segment, other):
        f.write_bytes(b"x" * 4096)
    child = subprocess.Popen([sys.executable, "-c", (
        "import mmap, sys\n"
        f"files = [open(p, 'r+b') for p in ({str(segment)!r}, {str(other)!r})]\n"
        "maps = [mmap.mmap(f.fileno(), 4096) for f in files]\n"
        "print('mapped', flush=True)\nsys.stdin.read()")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        assert tree_segments(shm_dir=str(tmp_path)) == {str(segment)}  # this process's tree: the child's
        assert tree_segments(child.pid, shm_dir=str(tmp_path)) == {str(segment)}
        assert remove_unmapped({str(segment)}, shm_dir=str(tmp_path)) == [] and segment.exists()  # still mapped
    finally:
        child.communicate("")  # stdin closed: the child exits
    assert tree_segments(child.pid, shm_dir=str(tmp_path)) == set()  # gone: nothing of its own any more
    assert remove_unmapped({str(segment)}, shm_dir=str(tmp_path)) == [str(segment)]
    assert not segment.exists() and other.exists()
