"""Where DeepSpeed JIT-builds its CPU ops, and what a killed build leaves behind.

DeepSpeed compiles its CPU shm-comm op on first use (~26 s here, ../shared/CPU-STACK.md) into
`TORCH_EXTENSIONS_DIR`, guarded by a `lock` file (torch's `FileBaton`). A build killed mid-way (a stopped run)
leaves that file, and every later `deepspeed.init_distributed` then waits on it forever. Two checkouts sharing
the default `~/.cache/torch_extensions` rebuild the same .so under each other's running processes.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

# A build takes under a minute here; a lock this old has no builder left.
STALE_LOCK_S = 600.0


def default_extensions_dir() -> None:
    """Set `TORCH_EXTENSIONS_DIR` to `<sys.prefix>/torch_extensions` (the running .venv's) unless the environment
    already names one, as `scripts/main.sh` does: a direct `python -m scripts.X` then builds per checkout too.
    Call it before Ray starts, so the local cluster's actors inherit it."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))


def clear_stale_build_locks(root: str | Path | None = None, max_age_s: float = STALE_LOCK_S) -> list[Path]:
    """Remove build `lock` files older than `max_age_s` seconds under `root` (default: `TORCH_EXTENSIONS_DIR`,
    else torch's default `~/.cache/torch_extensions`), so a build a killed process left never blocks this one.

    Returns:
        The lock files removed (each logged as a warning).
    """
    root = Path(root or os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    removed = []
    # <TORCH_EXTENSIONS_DIR>/<op>/lock when the variable is set; ~/.cache/torch_extensions/py311_cpu/<op>/lock if not
    locks = [*root.glob("*/lock"), *root.glob("*/*/lock")] if root.is_dir() else []
    for lock in locks:
        try:
            age = time.time() - lock.stat().st_mtime
            if age > max_age_s:
                lock.unlink()
                removed.append(lock)
                log.warning("removed %s, a build lock %.0f s old (a killed build left it; it would block this "
                            "one forever)", lock, age)
        except FileNotFoundError:  # its builder finished meanwhile
            continue
    return removed
