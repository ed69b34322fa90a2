"""See what a run's searcher did, in a browser: its evaluation episodes turn by turn (two methods side by
side on one question), its training rollouts with their reward components, its dev curve and reward
curves. Serves on 127.0.0.1 until Ctrl-C or SIGTERM; reads the run, writes nothing.

    .venv/bin/python -m scripts.view_run runs/<run> [--port N] [--host 127.0.0.1] [key=value ...]

The config is the run's `config.yaml` (else `configs/main_cpu.yaml`); its data pack (`SEARCHRL_DATA` or
`data.dir`) gives the documents' passages, which the run records only by id. Exit status 2 for a path
that is not a directory or a port that cannot be bound.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from pathlib import Path

from scripts.cli import parse_config

DEFAULT_PORT = 8090
STOP_S = 3  # seconds open connections get to finish after Ctrl-C / SIGTERM


def _default_config(run: str | None) -> str | None:
    """The run's config.yaml when it loads under today's schema (else None: the built-in default)."""
    from configs import ConfigError, load_config

    path = Path(run or "") / "config.yaml"
    if not run or not path.is_file():
        return None
    try:
        load_config(str(path), [])
    except (ConfigError, ValueError, OSError) as e:
        print(f"warning: {path} does not load ({str(e).splitlines()[0]}); using the default config", file=sys.stderr)
        return None
    return str(path)


def _run_arg(argv: list[str] | None) -> str | None:
    """RUN as given, before the full parse (which needs the config RUN names): the first positional
    argument that is not a key=value override."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("words", nargs="*")
    for flag in ("--port", "--host", "--config"):
        pre.add_argument(flag)
    known, _ = pre.parse_known_intermixed_args(argv)
    return next((w for w in known.words if "=" not in w), None)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 = any free port.

    Raises:
        OSError: the address cannot be bound (in use, or not this machine's).
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    return sock


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve the viewer of `RUN` until Ctrl-C or SIGTERM; 0 then, 2 for a bad path or port."""
    parser = argparse.ArgumentParser(prog="python -m scripts.view_run", description=__doc__.splitlines()[0])
    parser.add_argument("run", metavar="RUN", help="a run directory (runs/<run>) or an evaluation's --out directory")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free one)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; the viewer has no login)")
    default = _default_config(_run_arg(argv))
    args, cfg = parse_config(parser, argv, **({"default_config": default} if default else {}))

    import uvicorn

    from pipelines.run_docs import corpus_for
    from pipelines.run_view import RunView
    from serving.run_viewer import make_viewer_app

    try:
        view = RunView(args.run, corpus_for(cfg), [cfg.eval_recipe_config().get("doc_template") or ""])
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port} ({e.strerror or e}); pass another --port",
              file=sys.stderr)
        return 2
    # The passages load once (the main job's corpus: seconds): now, not on the first click.
    threading.Thread(target=view.docs.docs, args=([],), daemon=True, name="load-corpus").start()
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    summary = view.summary()
    print(f"run viewer of {view.run_dir}: {summary['eval']['episodes']} evaluation episodes "
          f"({', '.join(m['method'] for m in summary['eval']['methods']) or 'none'}), "
          f"{len(summary['steps'])} steps with rollouts")
    for line in summary["missing"]:
        print(f"  {line}")
    print(f"open http://{host}:{port}/   (Ctrl-C to stop)", flush=True)
    server = uvicorn.Server(uvicorn.Config(make_viewer_app(view), log_level="warning", timeout_graceful_shutdown=STOP_S,
                                           timeout_keep_alive=2))
    try:
        server.run(sockets=[sock])  # uvicorn stops on SIGINT / SIGTERM, then re-raises the signal
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    print("stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
