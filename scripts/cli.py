"""What every entry point under scripts/ shares: config from `--config` + `key=value` overrides,
`--verbose` and the logging setup (`cluster.logs`), and user mistakes (bad config, missing data pack
or index) reported as one `error:` line, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import sys

from configs import DEFAULT_CONFIG, Config, ConfigError, add_config_args, config_from_args


def parse_config(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    """Add `--config`/overrides and `--verbose` to `parser`, parse `argv`, set up logging
    (`cluster.logs.setup_logging`), load and validate the config.

    Exits with status 2 and an `error:` line naming the dotted key when the config is invalid.
    """
    from cluster.logs import setup_logging

    add_config_args(parser, default_config=str(DEFAULT_CONFIG))
    add_verbose_arg(parser)
    args = parser.parse_intermixed_args(argv)  # flags may follow key=value overrides
    setup_logging(args.verbose)
    try:
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
