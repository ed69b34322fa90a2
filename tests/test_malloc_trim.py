"""`cluster.malloc_trim`: freed heap pages go back to the OS after a large transient allocation."""

from __future__ import annotations

import pytest

from cluster.malloc_trim import _libc, malloc_trim


@pytest.mark.skipif(_libc() is None, reason="no glibc malloc_trim in this C library")
def test_freed_heap_chunks_are_released():
    chunks = [bytes(2000) + bytes([i % 256]) for i in range(50_000)]  # ~100 MB of malloc'd (not pymalloc) blocks
    assert len(chunks) == 50_000
    del chunks
    assert malloc_trim() is True
