"""What every entry point under scripts/ shares: config from `--config` + `key=value` overrides,
`--verbose` and the logging setup (`cluster.logs`), and user mistakes (bad config, missing data pack
or index) reported as one `error:` line, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time

from configs import DEFAULT_CONFIG, Config, ConfigError, add_config_args, config_from_args


def parse_config(parser: argparse.ArgumentParser, argv: list[str] | None = None, *,
                 default_config: str = str(DEFAULT_CONFIG), resume: bool = False) -> tuple[argparse.Namespace, Config]:
    """The one command-line parser of the entry points: add `--config`, `key=value` overrides,
    `--verbose` and (with `resume`) `--resume RUN_DIR` to `parser`; parse `argv` (flags and
    overrides in any order; `--resume DIR` and `--resume=DIR` alike); set up logging
    (`cluster.logs.setup_logging`); load and validate the config. SIGTERM then acts as Ctrl-C
    (`sigterm_as_interrupt`), so the entry point's `finally` blocks stop what it started (its Ray
    cluster, engines) in bounded time; training installs its own handlers over it (`pipelines.graceful_stop`).

    Without `--resume` the config is `--config` (default `default_config`; `args.config` is set to
    it). With `--resume` it is the run's own `config.yaml` with the overrides on top, and overrides
    may change only what `configs.resume.RESUME_KEYS` allows.

    Exits with status 2 and an `error:` line naming the dotted key when the config is invalid, a
    resume override changes what the run is, or `--config` and `--resume` are both given.
    """
    from cluster.logs import setup_logging
    from configs.resume import load_resume_config

    add_config_args(parser, default_config=default_config)
    parser.set_defaults(config=None)  # None = not given (the help still names the default)
    if resume:
        parser.add_argument("--resume", default=None, metavar="RUN_DIR",
                            help="continue this run from its last checkpoint with its own config.yaml; overrides "
                                 "may change only the step count, evaluation/saving cadence, logging and Ray settings")
    add_verbose_arg(parser)
    args = parser.parse_intermixed_args(argv)  # flags may follow key=value overrides
    setup_logging(args.verbose)
    if threading.current_thread() is threading.main_thread():  # Python delivers signals to the main thread only
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, sigterm_as_interrupt)
    try:
        if getattr(args, "resume", None):
            if args.config is not None:
                parser.exit(2, "error: --config and --resume: a resumed run uses its own config.yaml; drop --config\n")
            cfg, changed = load_resume_config(args.resume, args.overrides)
            args.resume_changes = changed
            return args, cfg
        args.config = args.config or default_config
        return args, config_from_args(args)
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")


def add_verbose_arg(parser: argparse.ArgumentParser) -> None:
    """`--verbose`: Ray's, vLLM's and the actors' messages on the console too (else only in the logs)."""
    parser.add_argument("--verbose", action="store_true",
                        help="show Ray's, vLLM's and the actors' messages on the console (default: only in the logs)")


@contextlib.contextmanager
def user_errors():
    """Turn the errors a user can fix (missing data pack or index, bad rows, bad config) into
    `error: <message>` on stderr and exit status 2, without a traceback."""
    from actors.retrieval.index_store import IndexFormatError
    from pipelines.data import BadRowError, DataPackError

    try:
        yield
    except (ConfigError, DataPackError, BadRowError, IndexFormatError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


STOP_TIMEOUT_S = 60.0  # after SIGTERM/SIGINT, seconds the cleanup of a server, build or evaluation may take


def sigterm_as_interrupt(signum, frame):
    """Signal handler: SIGTERM (and SIGINT) stop a program like Ctrl-C, so its `finally` cleanup runs
    (raises KeyboardInterrupt). The first signal also arms `cluster.exit_deadline`: a cleanup still
    running `STOP_TIMEOUT_S` seconds later (`SEARCHRL_STOP_TIMEOUT_S`), e.g. stuck on a Ray cluster
    whose raylet died, ends with status 128 + signum after killing this process's children."""
    from cluster.exit_deadline import arm, stop_timeout_s

    arm(stop_timeout_s(STOP_TIMEOUT_S), 128 + int(signum), signal.Signals(signum).name)
    raise KeyboardInterrupt


def serve_until_interrupted(lines: list[str]) -> int:
    """Print `lines` (the server's URL and examples) and block until Ctrl-C or SIGTERM (with
    `sigterm_as_interrupt` installed); then print `stopping` and return exit status 0. The caller's
    `finally` removes what it started."""
    for line in lines:
        print(line)
    print("Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopping", file=sys.stderr)
        return 0


def announce_machine(cfg: Config) -> None:
    """Print the CPU's instruction sets and each role's resolved dtype (`configs.dtype_choice.machine_line`):
    the first line of `scripts.main`, `scripts.train`, `scripts.evaluate` and `scripts.serve`."""
    from configs.dtype_choice import machine_line

    print(machine_line(cfg), flush=True)
