"""A real two-node Ray cluster on this machine, a short training job submitted to it the way users do,
and where each role ran.

    .venv/bin/python -m scripts.ops.multinode_smoke [--config configs/r1_searcher_learn_cpu.yaml] [--steps 1]
        [--index-dir DIR] [--passages 1200] [--work-dir DIR] [--out FILE] [key=value ...]

1. Starts a head (`ray start --head --block`) and a second node (`ray start --address ... --block`)
   on 127.0.0.1, each with its own ports and `--temp-dir`, token authentication, and on the second
   node a custom resource (`searchrl_node_b`) so the nodes tell apart (`cluster.local_cluster`).
2. Builds a 2-shard index of the pack's first `--passages` passages with `scripts.build_index` on
   that cluster (or uses `--index-dir`).
3. Submits `scripts.train` with the embedded CPU model (Gemma 3 270M; rollout engines on transformers,
   see SMOKE_OVERRIDES) for `--steps` steps through the Jobs API with the cluster's token
   (`scripts.submit.submit_job`: the `ray job submit` path), 2 rollout workers and 2 shards, and waits for it to end. The job's log is `<work-dir>/job.log`; when it did not
   succeed, the nodes' Ray logs are copied to `<work-dir>/ray-logs/` before the nodes stop.
4. Reads from Ray's state API on which node each retrieval shard, rollout worker and learner rank
   of the job ran.
5. Prints `multinode: nodes=2 job=SUCCEEDED steps=N shard_nodes=2 learner_node=... rollout_nodes=...
   leftovers=0 seconds=...` and writes the same facts as JSON (`--out`).
6. Stops both nodes by their own commands (SIGTERM to each `ray start --block`); `leftovers` counts
   the cluster's processes still alive afterwards.

Exit status: 0 when the job SUCCEEDED on 2 alive nodes with the shards on 2 nodes and nothing left
running; 1 otherwise; 2 bad arguments or config; 130 interrupted (Ctrl-C or SIGTERM: both nodes are
stopped first).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from scripts.cli import parse_config, user_errors

REPO = Path(__file__).resolve().parents[2]
NODE_B = "searchrl_node_b"
# A short job that still has every role of a training run on real models: 2 shards and 2 rollout
# workers (SPREAD over the nodes), one learner rank; small steps. The rollout engines are transformers
# ones: two vLLM CPU engines (~7.4 GB each with their engine-core and worker processes) beside the
# Gemma learner (~8.6 GB) exceed this 24 GiB machine, and Ray's memory monitor killed one (measured).
SMOKE_OVERRIDES = [
    "index.num_shards=2", "rollout.num_workers=2", "rollout.backend=hf", "rollout.cpus_per_worker=0.5",
    "learner.num_ranks=1",
    "learner.cpus_per_rank=1.0", "retrieval.query_encoders=1", "train.questions_per_step=2",
    "rollout.samples_per_prompt=2", "learner.mini_batch_size=4", "learner.micro_batch_size=2",
    "rollout.max_new_tokens_per_turn=48", "train.eval_questions=0", "train.eval_every=0", "train.save_every=0",
    "train.select_questions=0",
    "train.wandb.mode=offline", "ray.num_cpus=null",
]
ROLE_CLASSES = {"shard": "ShardSearcher", "rollout": "RolloutWorker", "learner": "PolicyLearner"}


def placement(actors: list[dict], node_names: dict[str, str]) -> dict[str, list[str]]:
    """{role: sorted node names its actors ran on} for the roles of `ROLE_CLASSES`, from state-API
    actor rows (`class_name`, `node_id`); an actor never placed (no node_id) counts as "none"."""
    out: dict[str, set[str]] = defaultdict(set)
    for a in actors:
        for role, cls in ROLE_CLASSES.items():
            if a.get("class_name") == cls:
                out[role].add(node_names.get(a.get("node_id") or "", "none"))
    return {role: sorted(out.get(role, ())) for role in ROLE_CLASSES}


def node_names(nodes: list[dict]) -> dict[str, str]:
    """{node_id: "head" | "node_b" | "node-<id8>"} from state-API node rows."""
    names = {}
    for n in nodes:
        if n.get("is_head_node"):
            names[n["node_id"]] = "head"
        elif NODE_B in (n.get("resources_total") or {}):
            names[n["node_id"]] = "node_b"
        else:
            names[n["node_id"]] = f"node-{n['node_id'][:8]}"
    return names


def job_id_of(cluster, submission_id: str) -> str | None:
    """The Ray job id (hex) of a submission, from the Jobs API."""
    import urllib.request

    request = urllib.request.Request(f"{cluster.dashboard_url}/api/jobs/{submission_id}", headers=cluster.headers())
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response).get("job_id")


def completed_steps(run_root: Path) -> int:
    """Rows of metrics.jsonl in the (only) run directory under `run_root` (0 when none)."""
    runs = [p for p in run_root.iterdir() if (p / "metrics.jsonl").is_file()] if run_root.is_dir() else []
    return sum(1 for line in (runs[0] / "metrics.jsonl").read_text().splitlines() if line.strip()) if runs else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (see the module docstring)."""
    from cluster.local_cluster import LocalCluster, NodeSpec
    from cluster.runtime_env import absolute_path_overrides, job_runtime_env
    from pipelines.train import validate
    from scripts.submit import build_entrypoint, submit_job

    parser = argparse.ArgumentParser(prog="python -m scripts.ops.multinode_smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1, help="training steps of the job")
    parser.add_argument("--index-dir", default=None, help="an existing index with >= 2 shards (default: build one)")
    parser.add_argument("--passages", type=int, default=1200, help="passages of the index it builds")
    parser.add_argument("--node-cpus", type=float, default=3, help="logical CPUs of each node")
    parser.add_argument("--work-dir", default=None, help="run, index and log folder (default: a new temp folder)")
    parser.add_argument("--out", default=None, help="JSON report (default: <work-dir>/multinode_smoke.json)")
    parser.add_argument("--timeout", type=float, default=1500, help="seconds the job may take")
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)  # the folders the config overrides depend on
    for flag in ("--steps", "--index-dir", "--work-dir"):
        pre.add_argument(flag, default=None)
    known, _ = pre.parse_known_args(argv)
    work = Path(known.work_dir or tempfile.mkdtemp(prefix="searchrl-multinode-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    index_dir = Path(known.index_dir).resolve() if known.index_dir else work / "index"
    derived = [f"train.total_steps={known.steps or 1}", f"index.dir={index_dir}", f"run_dir={work / 'runs'}"]
    args, cfg = parse_config(parser, [*SMOKE_OVERRIDES, *derived, *argv],
                             default_config=str(REPO / "configs" / "r1_searcher_learn_cpu.yaml"))
    overrides = args.overrides  # ours first, then the caller's (the later wins)
    with user_errors():
        cfg = validate(cfg, need_index=bool(args.index_dir))  # a bad config fails before any node starts
    t0 = time.monotonic()
    cluster = LocalCluster(NodeSpec(args.node_cpus, object_store_bytes=2**30),
                           [NodeSpec(args.node_cpus, {NODE_B: 1}, object_store_bytes=2**30)], cwd=REPO)
    report: dict = {"work_dir": str(work)}
    try:
        cluster.start()
        print(f"multinode: 2 nodes up at {cluster.gcs_address} (dashboard {cluster.dashboard_url})", flush=True)
        if not args.index_dir:
            build = [sys.executable, "-m", "scripts.build_index", f"--config={args.config}", *overrides,
                     f"data.corpus_limit={args.passages}"]
            with open(work / "build_index.log", "w") as log:
                status = subprocess.run(build, env={**cluster.env(), "RAY_ADDRESS": cluster.gcs_address}, cwd=REPO,
                                        stdout=log, stderr=subprocess.STDOUT, timeout=900).returncode
            if status != 0:
                print(f"multinode: the index build failed ({status}); see {work / 'build_index.log'}", file=sys.stderr)
                return 1
        entry = build_entrypoint("scripts.train", args.config, [*overrides, "--no-progress",
                                                                *absolute_path_overrides(cfg)])
        with open(work / "job.log", "w") as log:
            result = submit_job(cluster.dashboard_url, entry, job_runtime_env(REPO, cfg), token_file=cluster.token_file,
                                out=log, timeout_s=args.timeout)
        names = node_names(cluster.list_nodes())
        where = placement(cluster.list_actors(job_id_of(cluster, result.submission_id)), names)
        report |= {"job": result.status, "submission_id": result.submission_id,
                   "nodes": sum(1 for n in cluster.list_nodes() if n.get("state") == "ALIVE"),
                   "steps": completed_steps(work / "runs"), "placement": where}
    except KeyboardInterrupt:
        print("multinode: interrupted; stopping both nodes", file=sys.stderr)
        return 130
    finally:
        if report.get("job") != "SUCCEEDED":  # the nodes' Ray logs go with the temp dirs: keep them
            report["ray_logs"] = str(cluster.keep_logs(work / "ray-logs"))
        report["leftovers"] = cluster.stop()
    report["seconds"] = round(time.monotonic() - t0)
    Path(args.out or work / "multinode_smoke.json").write_text(json.dumps(report, indent=2))
    where = report["placement"]
    print(f"multinode: nodes={report['nodes']} job={report['job']} steps={report['steps']} "
          f"shard_nodes={len(where['shard'])} learner_node={','.join(where['learner']) or 'none'} "
          f"rollout_nodes={len(where['rollout'])} ({','.join(where['rollout'])}) "
          f"leftovers={len(report['leftovers'])} seconds={report['seconds']}")
    ok = (report["job"] == "SUCCEEDED" and report["nodes"] == 2 and len(where["shard"]) == 2
          and report["steps"] == args.steps and not report["leftovers"])
    if not ok:
        print(f"multinode: FAILED; job log {work / 'job.log'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
