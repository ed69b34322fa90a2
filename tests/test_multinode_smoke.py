"""`scripts.ops.multinode_smoke`: a real two-node Ray cluster on this machine (head + a second `ray start`
node with its own ports, temp dir and custom resource, token auth), one training step of the main
job's config submitted through the Jobs API, and the placement read back from Ray's state API:
the two retrieval shards on two nodes, both nodes stopped by their own commands with nothing left
running. Slow: about 5 minutes here (index of 1,200 passages, vLLM engines, one GRPO step)."""

from __future__ import annotations

import json

import pytest

from scripts.ops.multinode_smoke import NODE_B, node_names, placement


def test_placement_names_nodes_and_roles():
    nodes = [{"node_id": "aa11", "is_head_node": True, "resources_total": {"CPU": 3}},
             {"node_id": "bb22", "is_head_node": False, "resources_total": {"CPU": 3, NODE_B: 1}},
             {"node_id": "cc33", "is_head_node": False, "resources_total": {"CPU": 3}}]
    names = node_names(nodes)
    assert names == {"aa11": "head", "bb22": "node_b", "cc33": "node-cc33"}
    actors = [{"class_name": "ShardSearcher", "node_id": "aa11"}, {"class_name": "ShardSearcher", "node_id": "bb22"},
              {"class_name": "RolloutWorker", "node_id": "bb22"}, {"class_name": "PolicyLearner", "node_id": None},
              {"class_name": "RetrievalPool", "node_id": "aa11"}]
    assert placement(actors, names) == {"shard": ["head", "node_b"], "rollout": ["node_b"], "learner": ["none"]}


@pytest.mark.slow
@pytest.mark.heavy
def test_multinode_smoke_trains_on_two_nodes(tmp_path, capsys):
    from scripts.ops.multinode_smoke import main

    status = main(["--steps", "1", "--work-dir", str(tmp_path)])
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "multinode_smoke.json").read_text())
    job_log = (tmp_path / "job.log").read_text() if (tmp_path / "job.log").exists() else ""
    assert status == 0, (out, report, job_log[-3000:])
    assert "multinode: nodes=2 job=SUCCEEDED steps=1 shard_nodes=2" in out
    assert report["placement"]["shard"] == ["head", "node_b"] and report["leftovers"] == []
    assert len(report["placement"]["learner"]) == 1 and report["placement"]["rollout"]
