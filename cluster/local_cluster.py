"""A real multi-node Ray cluster on this machine: one `ray start --head --block` node and any number of
`ray start --address ... --block` worker nodes, each with its own ports and `--temp-dir`, token
authentication, on 127.0.0.1. For the multi-node smoke run (`scripts.ops.multinode_smoke`) and the tests
that submit jobs the way users do.

Each node is stopped by its own command: SIGTERM to its `ray start --block` process, which stops the
node's processes. `LocalCluster.stop()` then ends, by pid, only stragglers of this cluster (processes
whose environment carries its marker), never another Ray cluster's processes on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "SEARCHRL_LOCAL_CLUSTER"  # env var set on every node: its processes carry the cluster's root dir


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class NodeSpec:
    """One node's logical resources: `num_cpus` (Ray CPUs, may exceed the cores), `resources` (custom
    resources, e.g. {"node_b": 1} so placement can be observed), `object_store_bytes` (plasma size)."""

    num_cpus: float = 2
    resources: Mapping[str, float] = field(default_factory=dict)
    object_store_bytes: int = 100 * 2**20


@dataclass
class LocalNode:
    """A started node: its `ray start` process, temp dir and log."""

    name: str
    proc: subprocess.Popen
    temp_dir: Path
    log_path: Path

    def log_text(self, chars: int = 4000) -> str:
        """The tail of the node's `ray start` output."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


class LocalCluster:
    """A head and `workers` worker nodes on 127.0.0.1, started with `bin_dir`'s `ray` (default: this
    interpreter's environment) with that folder first on PATH, so a job's `python` is the same one.

    Attributes after `start()`: `gcs_address` ("127.0.0.1:<port>", for `ray.init`),
    `dashboard_url` (the Jobs and state API), `token_file` (the cluster's auth token), `nodes`.
    Use as a context manager or call `stop()`, which returns the cluster's processes still alive.
    """

    def __init__(self, head: NodeSpec | None = None, workers: Sequence[NodeSpec] = (),
                 bin_dir: str | os.PathLike | None = None, cwd: str | os.PathLike | None = None):
        self.head_spec, self.worker_specs = head or NodeSpec(), list(workers)
        self.bin_dir = Path(bin_dir) if bin_dir else Path(sys.executable).parent
        self.cwd = cwd
        # Short: Ray's Unix socket paths live under the temp dirs and must stay below 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="srl-ray-", dir="/tmp"))
        self.token_file = self.root / "auth_token"
        self.nodes: list[LocalNode] = []
        self.known: dict[int, object] = {}
        self.gcs_address = self.dashboard_url = ""

    # -- start --------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment of every node (and of clients that talk to this cluster): token auth with
        this cluster's token, the marker, and none of the caller's Ray addresses."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN", "WANDB_SERVICE")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file), RAY_USAGE_STATS_ENABLED="0",
                   PATH=f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}", **{MARKER: str(self.root)})
        return env

    def start(self, timeout_s: float = 180.0) -> LocalCluster:
        """Start the head, wait for its dashboard, then each worker node, and wait until the cluster
        lists every node alive. Raises RuntimeError (with the node's log) when a node fails to start."""
        self.token_file.write_text(secrets.token_hex(32))
        self.token_file.chmod(0o600)
        gcs, dash, client = free_ports(3)
        self.gcs_address, self.dashboard_url = f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}"
        self._start_node("head", self.head_spec, ["--head", "--port", str(gcs), "--include-dashboard", "true",
                                                  "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
                                                  "--ray-client-server-port", str(client)])
        deadline = time.monotonic() + timeout_s
        self._wait(deadline, self._dashboard_up, "the head's dashboard")
        for i, spec in enumerate(self.worker_specs, 1):
            self._start_node(f"worker{i}", spec, ["--address", self.gcs_address])
        self._wait(deadline, lambda: self.alive_node_count() == len(self.nodes), f"{len(self.nodes)} alive nodes")
        return self

    def _start_node(self, name: str, spec: NodeSpec, role_args: list[str]) -> None:
        temp_dir = self.root / name
        temp_dir.mkdir()
        agent_http, agent_grpc, env_agent, metrics, node_mgr, obj_mgr = free_ports(6)
        cmd = [str(self.bin_dir / "ray"), "start", "--block", *role_args, "--node-ip-address", "127.0.0.1",
               "--dashboard-agent-listen-port", str(agent_http), "--dashboard-agent-grpc-port", str(agent_grpc),
               "--runtime-env-agent-port", str(env_agent), "--metrics-export-port", str(metrics),
               "--node-manager-port", str(node_mgr), "--object-manager-port", str(obj_mgr),
               "--num-cpus", f"{spec.num_cpus:g}", "--num-gpus", "0",
               "--object-store-memory", str(spec.object_store_bytes), "--temp-dir", str(temp_dir),
               "--disable-usage-stats"]
        if spec.resources:
            cmd += ["--resources", json.dumps(dict(spec.resources))]
        log_path = self.root / f"{name}.log"
        with open(log_path, "w") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(cmd, env=self.env(), cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.nodes.append(LocalNode(name, proc, temp_dir, log_path))

    def _wait(self, deadline: float, ready, what: str) -> None:
        while time.monotonic() < deadline:
            self._remember()
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"`ray start` of the {node.name} exited with {node.proc.returncode}:\n"
                                       f"{node.log_text()}")
            if ready():
                return
            time.sleep(1.0)
        logs = "\n".join(f"--- {n.name}\n{n.log_text(2000)}" for n in self.nodes)
        raise RuntimeError(f"the local Ray cluster did not show {what} in time:\n{logs}")

    def _dashboard_up(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2)
        except urllib.error.HTTPError:  # it answered (e.g. 401 without a token): up
            return True
        except OSError:
            return False
        return True

    def headers(self) -> dict[str, str]:
        """The Authorization header for this cluster's HTTP APIs."""
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}

    def alive_node_count(self) -> int:
        """Alive nodes as the head's state API lists them (0 when it does not answer yet)."""
        return sum(1 for n in self.list_nodes() if n.get("state") == "ALIVE")

    def list_nodes(self) -> list[dict]:
        """The state API's node list (`/api/v0/nodes`: node_id, state, is_head_node, resources_total...)."""
        return self._state("nodes")

    def list_actors(self, job_id: str | None = None) -> list[dict]:
        """The state API's actor list, dead actors included (class_name, node_id, state, job_id...);
        only `job_id`'s when given (hex, as `JobDetails.job_id`)."""
        query = f"&filter_keys=job_id&filter_predicates=%3D&filter_values={job_id}" if job_id else ""
        return self._state(f"actors?limit=10000&detail=true{query}")

    def _state(self, what: str) -> list[dict]:
        sep = "&" if "?" in what else "?"
        request = urllib.request.Request(f"{self.dashboard_url}/api/v0/{what}{sep}timeout=30", headers=self.headers())
        try:
            with urllib.request.urlopen(request, timeout=35) as response:
                body = json.load(response)
        except (OSError, ValueError):
            return []
        return body.get("data", {}).get("result", {}).get("result", [])

    # -- stop ---------------------------------------------------------------------------------------
    def _remember(self) -> None:
        import psutil

        for node in self.nodes:
            try:
                root = psutil.Process(node.proc.pid)
                for p in [root, *root.children(recursive=True)]:
                    self.known.setdefault(p.pid, p)
            except psutil.NoSuchProcess:
                continue

    def _marked(self) -> list:
        """Processes whose environment carries this cluster's marker (every process its nodes spawned)."""
        import psutil

        out = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARKER) == str(self.root):
                    out.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return out

    def _alive(self) -> list:
        import psutil

        out = []
        for p in [*self.known.values(), *self._marked()]:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                continue
        return out

    def keep_logs(self, target: str | os.PathLike) -> Path:
        """Copy every node's Ray session logs (raylet, GCS, workers' stdout/stderr) to `target/<node>/`
        before `stop()` removes the temp dirs. Returns `target`."""
        target = Path(target)
        for node in self.nodes:
            logs = node.temp_dir / "session_latest" / "logs"
            if logs.is_dir():
                shutil.copytree(logs, target / node.name, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.sock", "events"))
            if node.log_path.exists():
                shutil.copy(node.log_path, target / f"{node.name}-ray-start.log")
        return target

    def stop(self, timeout_s: float = 30.0) -> list[str]:
        """Stop the worker nodes, then the head, each by SIGTERM to its own `ray start --block`; kill
        (by pid) what is still alive after `timeout_s`; remove the temp dirs. Returns the cluster's
        processes still alive afterwards ("pid name"; [] when all are gone)."""
        from cluster.leftovers import kill_processes

        try:
            self._remember()
            for p in self._marked():
                self.known.setdefault(p.pid, p)
            for node in reversed(self.nodes):  # workers first: the head's GCS outlives them
                if node.proc.poll() is None:
                    node.proc.send_signal(signal.SIGTERM)
                try:
                    node.proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait(timeout=10)
            deadline = time.monotonic() + 20
            while (alive := self._alive()) and time.monotonic() < deadline:
                time.sleep(0.5)
            kill_processes(alive, timeout_s=10)
            return [f"{p.pid} {p.name()}" for p in self._alive()]
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
