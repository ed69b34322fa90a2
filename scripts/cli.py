"""What every entry point under scripts/ shares: config from `--config` + `key=value` overrides,
and user mistakes (bad config, missing data pack or index) reported as one `error:` line, exit 2."""

from __future__ import annotations

import argparse
import contextlib
import sys

from configs import DEFAULT_CONFIG, Config, ConfigError, add_config_args, config_from_args


def parse_config(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> tuple[argparse.Namespace, Config]:
    """Add `--config`/overrides to `parser`, parse `argv`, load and validate the config.

    Exits with status 2 and an `error:` line naming the dotted key when the config is invalid.
    """
    add_config_args(parser, default_config=str(DEFAULT_CONFIG))
    args = parser.parse_intermixed_args(argv)  # flags may follow key=value overrides
    try:
        return args, config_from_args(args)
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")


@contextlib.contextmanager
def user_errors():
    """Turn the errors a user can fix (missing data pack or index, bad rows, bad config) into
    `error: <message>` on stderr and exit status 2, without a traceback."""
    from actors.index_store import IndexFormatError
    from pipelines.data import BadRowError, DataPackError

    try:
        yield
    except (ConfigError, DataPackError, BadRowError, IndexFormatError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
