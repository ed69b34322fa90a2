"""Build (or resume) the sharded retrieval index of a config.

    .venv/bin/python -m scripts.build_index [--config configs/retrieval_cpu.yaml] [key=value ...]

e.g. `index.num_shards=8 index.type=hnsw index.dir=indexes/minilm-hnsw-8`. An interrupted build
resumes at the first unfinished shard; the resolved config is written to `<index.dir>/config.yaml`.
"""

from __future__ import annotations

import argparse
import sys
import time

from scripts.cli import parse_config, user_errors


def main(argv: list[str] | None = None) -> int:
    """Entry point: build (or resume) the sharded retrieval index of a config.

    Usage: .venv/bin/python -m scripts.build_index [--config configs/retrieval_cpu.yaml] [key=value ...]
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.build_index", description=__doc__.splitlines()[0])
    _, cfg = parse_config(parser, argv)
    with user_errors():
        from pipelines.data import pack_file

        pack_file(cfg.data.corpus, cfg.data.dir)  # a missing pack fails before Ray starts

        import ray

        from cluster.ray_init import init_ray
        from pipelines.build_index import build_index

        init_ray(cfg.ray)
        try:
            t0 = time.perf_counter()
            manifest = build_index(cfg)
            sizes = ", ".join(str(s.count) for s in manifest.shards)
            print(
                f"index: {cfg.index.dir} type={manifest.index_type} docs={manifest.num_docs} "
                f"shards={len(manifest.shards)} [{sizes}] dim={manifest.dim} "
                f"build_seconds={time.perf_counter() - t0:.1f}"
            )
        finally:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
