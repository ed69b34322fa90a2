"""Submit a job to a Ray cluster (the Jobs API), stream its logs, exit with its final status.

    .venv/bin/python -m scripts.submit --address http://127.0.0.1:8265 [--no-wait] \\
        [--config PATH] [KEY=VALUE ...] [-- COMMAND ...]

Without `-- COMMAND` the job runs `python -m scripts.train --config <config> <overrides>`, where
relative paths of the config (run_dir, index.dir, data.dir, local model folders) are appended as
absolute overrides: the job runs in a temporary copy of the repository (cluster/runtime_env.py).
`--module scripts.ops.cluster_check` runs the cluster check instead. The working dir is this
repository without .venv, .git, runs, indexes, data files and caches; the job uses the cluster's
Python: start the cluster with the project's environment active (`PATH=$PWD/.venv/bin:$PATH
.venv/bin/ray start --head ...`), or name its interpreter with `--python`.

Authentication (Ray 2.60, see cluster/README.md): clusters use token authentication; `ray start`
turns it on when a token exists (~/.ray/auth_token is written by any local `ray.init()`). This
script sends the cluster's token from, in order: `--token-file`, RAY_AUTH_TOKEN,
RAY_AUTH_TOKEN_PATH; otherwise Ray's client sends ~/.ray/auth_token when RAY_AUTH_MODE=token.
With RAY_AUTH_MODE=disabled nothing is sent (only for a throwaway cluster that only this machine
can reach, started with RAY_AUTH_MODE=disabled too). A refused token exits with status 2 and
says how to fix it.

After submitting it prints the job's dashboard page (`<address>/#/jobs/<id>`) and the command that
follows its logs from another shell (`ray job logs --follow <id> --address <address>`).

Exit status: 0 the job SUCCEEDED (or was submitted, with --no-wait); 1 FAILED; 3 STOPPED;
2 bad arguments or config, authentication or connection error; 124 --timeout passed (the job keeps
running); 130 interrupted (the job keeps running).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 3}


class SubmitError(RuntimeError):
    """The job could not be submitted or followed: authentication, connection, rejected request."""


@dataclass
class JobResult:
    """Outcome of `submit_job`. `status`: Ray's JobStatus value ("SUCCEEDED", "FAILED", "STOPPED",
    or "PENDING"/"RUNNING" when not waited for or when `timed_out`)."""

    submission_id: str
    status: str
    timed_out: bool = False

    @property
    def exit_code(self) -> int:
        """0 SUCCEEDED or not waited for, 1 FAILED, 3 STOPPED, 124 timed out."""
        if self.timed_out:
            return 124
        return EXIT_CODES.get(self.status, 0)


def auth_headers(token: str | None = None, token_file: str | os.PathLike | None = None,
                 environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The `Authorization` header for the Jobs API, from the first source that is set: `token`,
    `token_file`, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH. Empty when none is set (Ray's client then
    adds ~/.ray/auth_token itself if RAY_AUTH_MODE=token) or when RAY_AUTH_MODE=disabled and no
    token was passed explicitly.

    Raises:
        SubmitError: a token file cannot be read or is empty.
    """
    environ = os.environ if environ is None else environ
    if token is None and token_file is None:
        if environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
            return {}
        token = environ.get("RAY_AUTH_TOKEN") or None
        token_file = None if token else (environ.get("RAY_AUTH_TOKEN_PATH") or None)
    if token is None and token_file is not None:
        try:
            token = Path(token_file).expanduser().read_text().strip()
        except OSError as e:
            raise SubmitError(f"cannot read the Ray auth token file {token_file}: {e}") from e
        if not token:
            raise SubmitError(f"the Ray auth token file {token_file} is empty")
    return {"Authorization": f"Bearer {token.strip()}"} if token else {}


def job_links(address: str, submission_id: str, token_file: str | os.PathLike | None = None,
              environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Where to watch a submitted job: (its dashboard page, a shell command that follows its logs).

    The page is `<address>/#/jobs/<submission_id>` (http:// added when `address` has no scheme). The
    command is `ray job logs --follow <id> --address <address>`, prefixed with what Ray's CLI needs to
    send the same token as this client: `RAY_AUTH_MODE=token` (plus `RAY_AUTH_TOKEN_PATH=<token_file>`
    when a file was given) unless RAY_AUTH_MODE=disabled in `environ` (default `os.environ`). The token
    itself is never printed.
    """
    environ = os.environ if environ is None else environ
    base = address.rstrip("/")
    if "://" not in base:
        base = f"http://{base}"
    env = []
    if token_file is not None:
        env = ["RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH={Path(token_file).expanduser().resolve()}"]
    elif environ.get("RAY_AUTH_MODE", "").lower() != "disabled":
        env = ["RAY_AUTH_MODE=token"]
    command = shlex.join(["ray", "job", "logs", "--follow", submission_id, "--address", address])
    return f"{base}/#/jobs/{submission_id}", " ".join([*map(shlex.quote, env), command])


def _auth_error(address: str, error: Exception) -> SubmitError:
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return SubmitError(
        f"the Ray cluster at {address} refused the request ({reason}).\n"
        "It uses token authentication (Ray 2.60 turns it on for `ray start` when a token exists). "
        "Give this client the cluster's token: export RAY_AUTH_MODE=token and provide the token as "
        "RAY_AUTH_TOKEN, as a file named by RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (on the head "
        "node `ray get-auth-token` prints it), or pass --token-file PATH. A wrong token means the file "
        "holds another cluster's token. For a throwaway cluster that only this machine can reach you "
        "may instead start it and submit with RAY_AUTH_MODE=disabled (see cluster/README.md)."
    )


def _client(address: str, headers: dict[str, str]):
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address, headers=headers or None)
    except AuthenticationError as e:
        raise _auth_error(address, e) from None
    except ConnectionError as e:
        raise SubmitError(
            f"cannot reach the Ray Jobs API at {address} ({e}); is the cluster running with its "
            "dashboard (`ray start --head --include-dashboard=true`, port --dashboard-port, 8265 by default)?"
        ) from None


async def _follow_logs(client: Any, submission_id: str, out: TextIO) -> None:
    async for chunk in client.tail_job_logs(submission_id):
        out.write(chunk)
        out.flush()


def _wait(client: Any, submission_id: str, out: TextIO, deadline: float | None, poll_s: float = 1.0) -> str | None:
    """Stream logs until the job ends; return its final status, or None at the deadline."""
    timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    try:
        asyncio.run(asyncio.wait_for(_follow_logs(client, submission_id, out), timeout))
    except (asyncio.TimeoutError, TimeoutError):
        return None
    except RuntimeError as e:  # the log stream broke; keep following the status
        out.write(f"\n[submit] log stream interrupted ({e}); full logs: ray job logs {submission_id}\n")
    while True:
        status = str(client.get_job_status(submission_id).value)
        if status in TERMINAL:
            return status
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def submit_job(address: str, entrypoint: str, runtime_env: dict[str, Any] | None = None, *, wait: bool = True,
               token: str | None = None, token_file: str | os.PathLike | None = None,
               submission_id: str | None = None, metadata: dict[str, str] | None = None,
               timeout_s: float | None = None, out: TextIO | None = None) -> JobResult:
    """Submit `entrypoint` (a shell command run on the head node) with `runtime_env`; with `wait`,
    stream the job's logs to `out` (default stdout) until it ends.

    Args:
        address: the Jobs API (dashboard) URL, e.g. "http://127.0.0.1:8265".
        entrypoint: shell command; `build_entrypoint` makes the repository's.
        runtime_env: e.g. `cluster.runtime_env.job_runtime_env(...)`.
        wait: follow the job until SUCCEEDED / FAILED / STOPPED.
        token, token_file: the cluster's auth token (see `auth_headers` for the environment fallbacks).
        submission_id, metadata: passed to Ray.
        timeout_s: stop waiting after this many seconds (the job keeps running; `timed_out` is set).
    Returns:
        JobResult(submission_id, status, timed_out).
    Raises:
        SubmitError: authentication refused (message says how to give the token), cluster
            unreachable, or the request rejected (e.g. a working_dir over Ray's size limit).
    """
    from ray.exceptions import AuthenticationError

    out = out or sys.stdout
    client = _client(address, auth_headers(token, token_file))
    try:
        job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id,
                                   metadata=metadata)
    except AuthenticationError as e:
        raise _auth_error(address, e) from None
    except (RuntimeError, ValueError) as e:
        raise SubmitError(f"the Ray cluster at {address} did not accept the job: {e}") from None
    out.write(f"[submit] job {job_id} submitted to {address}: {entrypoint}\n")
    page, follow = job_links(address, job_id, token_file if token is None else None)
    out.write(f"[submit] dashboard: {page}\n[submit] follow its logs: {follow}\n")
    out.flush()
    if not wait:
        return JobResult(job_id, str(client.get_job_status(job_id).value))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        status = _wait(client, job_id, out, deadline)
    except AuthenticationError as e:
        raise _auth_error(address, e) from None
    if status is None:
        return JobResult(job_id, str(client.get_job_status(job_id).value), timed_out=True)
    return JobResult(job_id, status)


def build_entrypoint(module: str, config: str | os.PathLike | None, overrides: Sequence[str] = (),
                     python: str = "python", repo_root: str | os.PathLike = REPO_ROOT) -> str:
    """`python -m <module> --config <config> <overrides>` as one shell-quoted string.

    A config inside `repo_root` is named relative to it (it is uploaded with the working dir); one
    outside keeps its absolute path, which must then exist on the head node.
    """
    parts = [python, "-m", module]
    if config is not None:
        path = Path(config).resolve()
        try:
            parts += ["--config", path.relative_to(Path(repo_root).resolve()).as_posix()]
        except ValueError:
            parts += ["--config", str(path)]
    return shlex.join([*parts, *overrides])


def _parse_env(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --env expects KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: submit a job to a Ray cluster, stream its logs, return its exit status (see the module docstring).

    Usage: .venv/bin/python -m scripts.submit --address http://127.0.0.1:8265 [--no-wait]
        [--config PATH] [KEY=VALUE ...] [-- COMMAND ...]
    """
    from cluster.runtime_env import WORKING_DIR_LIMIT_BYTES, absolute_path_overrides, job_runtime_env, upload_size
    from scripts.cli import parse_config

    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m scripts.submit", description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=os.environ.get("RAY_API_SERVER_ADDRESS", DEFAULT_ADDRESS),
                        help=f"Jobs API URL (default: $RAY_API_SERVER_ADDRESS or {DEFAULT_ADDRESS})")
    parser.add_argument("--no-wait", action="store_true", help="submit and exit without following the job")
    parser.add_argument("--module", default="scripts.train", help="module of the default command (default scripts.train)")
    parser.add_argument("--python", default="python", help="interpreter of the default command on the cluster (default: python on the PATH of `ray start`)")
    parser.add_argument("--token-file", help="file holding the cluster's auth token (default: RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra job environment variable (repeatable)")
    parser.add_argument("--submission-id", help="job id to use (default: Ray picks one)")
    parser.add_argument("--timeout", type=float, help="seconds to follow the job before giving up (it keeps running)")
    args, cfg = parse_config(parser, argv)

    runtime_env = job_runtime_env(REPO_ROOT, cfg, _parse_env(args.env))
    if command:
        entrypoint = shlex.join(command)
    else:
        absolute = absolute_path_overrides(cfg)
        replaced = {item.partition("=")[0].strip() for item in absolute}
        overrides = [o for o in args.overrides if o.partition("=")[0].strip() not in replaced] + absolute
        entrypoint = build_entrypoint(args.module, args.config, overrides, args.python)
    files, size = upload_size(REPO_ROOT, runtime_env["excludes"])
    print(f"[submit] working dir {REPO_ROOT}: {files} files, {size / 2**20:.1f} MiB before compression")
    if size >= WORKING_DIR_LIMIT_BYTES:
        print(f"error: the working dir is over Ray's {WORKING_DIR_LIMIT_BYTES // 2**20} MiB limit; add "
              "patterns to cluster.runtime_env.BASE_EXCLUDES or move large files out", file=sys.stderr)
        return 2
    try:
        result = submit_job(args.address, entrypoint, runtime_env, wait=not args.no_wait,
                            token_file=args.token_file, submission_id=args.submission_id, timeout_s=args.timeout)
    except SubmitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n[submit] interrupted; the job keeps running (ray job stop --address {args.address} <id>)",
              file=sys.stderr)
        return 130
    if result.timed_out:
        print(f"[submit] job {result.submission_id} still {result.status} after {args.timeout:g} s; it keeps "
              f"running (ray job stop --address {args.address} {result.submission_id})", file=sys.stderr)
    else:
        print(f"[submit] job {result.submission_id}: {result.status}")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
