"""Serve a trained searcher (or a base model) with its retriever over HTTP on Ray Serve, until Ctrl-C / SIGTERM.

    .venv/bin/python -m scripts.serve --checkpoint PATH [--config FILE] [key=value ...]

PATH: a run directory (its newest checkpoint), a `checkpoints/step-N` directory, a Hugging Face
model directory or a model name (`gemma3-270m`). The config defaults to the run's `config.yaml`
(`configs/main_cpu.yaml`, the main job's, for a model with no run); `serve.*` keys set host, port, replicas and limits.
Starts a local Ray cluster (or joins one with `ray.address=auto`); on exit removes the application
and stops only the cluster it started. A missing index is built first (resuming). Exit status 2 for a
bad checkpoint, config or an unreadable index.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from scripts.cli import announce_machine, parse_config, serve_until_interrupted, sigterm_as_interrupt, user_errors


def _checkpoint_arg(argv: list[str] | None) -> tuple[str | None, str | None]:
    """`--checkpoint` and `--config` as given (before the full parse picks the config's default)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--checkpoint")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    return known.checkpoint, known.config


def served_config(parser: argparse.ArgumentParser, argv: list[str] | None):
    """`--checkpoint PATH` added to `parser`, then (served policy, config): the config is `--config`,
    else the run's `config.yaml`, else `serving.config.DEFAULT_CONFIG`, with the overrides. Exits 2
    with an `error:` line for a PATH that names nothing servable or a bad config."""
    from serving.checkpoint import CheckpointError, resolve_served
    from serving.config import config_path

    parser.add_argument("--checkpoint", required=True, metavar="PATH",
                        help="run directory, checkpoints/step-N directory, Hugging Face model directory or model name")
    checkpoint, config = _checkpoint_arg(argv)
    served = None
    if checkpoint:
        try:
            served = resolve_served(checkpoint)
        except CheckpointError as e:
            parser.exit(2, f"error: {e}\n")
    default = str(config_path(served, config)) if served else None
    args, cfg = parse_config(parser, argv, **({"default_config": default} if default else {}))
    return args, served, cfg


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve `--checkpoint PATH` until Ctrl-C or SIGTERM (exit 2: bad checkpoint, config or index)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.serve", description=__doc__.splitlines()[0])
    _, served, cfg = served_config(parser, argv)
    announce_machine(cfg)
    from cluster.ray_init import init_ray
    from pipelines.build_index import ensure_index
    from serving.launch import start_app, stop_app

    local = init_ray(cfg.ray)
    signal.signal(signal.SIGTERM, sigterm_as_interrupt)
    try:
        t0 = time.perf_counter()
        with user_errors():
            ensure_index(cfg)  # built (resuming) when missing
        try:
            url = start_app(cfg, served)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        name = cfg.serve.model_name or served.name
        auth = " -H \"Authorization: Bearer $SEARCHRL_API_TOKEN\"" if _token() else ""
        body = json.dumps({"question": "who wrote hamlet?"})
        return serve_until_interrupted([
            f"searcher {name} ({cfg.train.recipe}, {served.model}) ready in {time.perf_counter() - t0:.0f} s at {url}",
            f"routes: POST {url}/v1/search  POST {url}/v1/search/stream  POST {url}/v1/chat/completions  "
            f"GET {url}/v1/models  GET {url}/health  POST {url}/retrieve",
            f"example: curl -s {url}/v1/search -H 'Content-Type: application/json'{auth} -d '{body}'",
            f"playground: open {url}/ in a browser" + (" (enter SEARCHRL_API_TOKEN in its token field)" if auth else ""),
        ])
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while still starting
        return 0
    finally:
        stop_app(local)  # our own cluster: Serve and Ray stop; a joined one: only our app is removed


def _token() -> bool:
    from serving.auth import token_from_env

    return token_from_env() is not None


if __name__ == "__main__":
    sys.exit(main())
