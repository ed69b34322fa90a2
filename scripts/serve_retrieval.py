"""Serve a built index over HTTP with Search-R1's `/retrieve` protocol (Ray Serve), until Ctrl-C.

    .venv/bin/python -m scripts.serve_retrieval [--config configs/retrieval_cpu.yaml] [key=value ...]

e.g. `index.dir=indexes/minilm-flat-4 serve.port=8001 retrieval.topk=5`. A missing index is built first
(resuming). Exit status 2 for a bad config or an unreadable index.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys

from scripts.cli import parse_config, serve_until_interrupted, sigterm_as_interrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve a built index over HTTP (Search-R1's `/retrieve`) until Ctrl-C (exit 2: bad config or index).

    Usage: .venv/bin/python -m scripts.serve_retrieval [--config configs/retrieval_cpu.yaml] [key=value ...]
    """
    parser = argparse.ArgumentParser(prog="python -m scripts.serve_retrieval", description=__doc__.splitlines()[0])
    _, cfg = parse_config(parser, argv)
    from actors.retrieval.index_store import IndexFormatError

    import ray
    from ray import serve

    from actors.retrieval.http import serve_retrieval
    from actors.retrieval.pool import start_retrieval_pool
    from cluster.ray_init import init_ray
    from pipelines.build_index import ensure_index

    local = init_ray(cfg.ray)
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    try:
        try:
            ensure_index(cfg)  # built (resuming) when missing
            pool = start_retrieval_pool(cfg.index.dir, cfg.retrieval, name="retrieval_pool")
            url = serve_retrieval(pool, cfg.serve, cfg.retrieval, name="retrieval")
        except (IndexFormatError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        body = json.dumps({"queries": ["who wrote hamlet?"], "topk": cfg.retrieval.topk, "return_scores": True})
        return serve_until_interrupted([
            f"retrieval server: POST {url}/retrieve   GET {url}/health",
            f"example: curl -s {url}/retrieve -H 'Content-Type: application/json' -d '{body}'",
        ])
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while still starting
        return 0
    finally:
        # On a shared cluster remove only our app; on our own local cluster stop Serve entirely.
        with contextlib.suppress(Exception):  # nothing to clean up if Serve never started
            serve.shutdown() if local else serve.delete("retrieval")
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
