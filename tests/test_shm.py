"""The /dev/shm sweep removes unmapped vLLM / DeepSpeed files of this user and keeps mapped ones."""

import mmap
import os

from actors.learner.shm import sweep_stale_shm


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
