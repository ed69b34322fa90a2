"""Build (or resume) the sharded retrieval index of a config.

    .venv/bin/python -m scripts.build_index [--config configs/retrieval_cpu.yaml] [key=value ...]

e.g. `index.num_shards=8 index.type=hnsw index.dir=indexes/minilm-hnsw-8`. An interrupted build
resumes at the first unfinished shard; the resolved config is written to `<index.dir>/config.yaml`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from configs import DEFAULT_CONFIG, ConfigError, add_config_args, config_from_args, save_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.build_index", description=__doc__.splitlines()[0])
    add_config_args(parser, default_config=str(DEFAULT_CONFIG))
    try:
        cfg = config_from_args(parser.parse_args(argv))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from pipelines.data import DataPackError, pack_file

    try:
        pack_file(cfg.data.corpus, cfg.data.dir)
    except DataPackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import ray

    from cluster.ray_init import init_ray
    from pipelines.build_index import build_index

    init_ray(cfg.ray)
    try:
        t0 = time.perf_counter()
        manifest = build_index(cfg)
        Path(cfg.index.dir).mkdir(parents=True, exist_ok=True)
        save_config(cfg, Path(cfg.index.dir) / "config.yaml")
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
