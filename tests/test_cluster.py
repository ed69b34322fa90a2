"""cluster/: the role plan and its fit check, the job runtime_env, scripts.submit; and one real
`ray start --head` cluster (loopback, own ports and temp dir, token auth) that runs
scripts.ops.cluster_check through scripts.submit and is stopped, with every process it started."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cluster.local_cluster import LocalCluster, NodeSpec
from cluster.roles import (
    ResourceFitError,
    alive_node_resources,
    check_fits,
    format_plan,
    plan_roles,
    total_resources,
)
from cluster.runtime_env import (
    absolute_path_overrides,
    job_env_vars,
    job_excludes,
    job_runtime_env,
    upload_size,
)
from configs import DEFAULT_CONFIG, load_config, parse_overrides
from scripts import submit as submit_mod
from scripts.submit import JobResult, SubmitError, auth_headers, build_entrypoint, submit_job

REPO = Path(__file__).resolve().parents[1]


def cfg_with(*overrides: str):
    return load_config(DEFAULT_CONFIG, list(overrides))


def by_name(plan):
    return {r.name: r for r in plan}


# ----------------------------------------------------------------------------- roles


def test_plan_default_config_lists_every_role_with_its_keys():
    plan = plan_roles(cfg_with())
    roles = by_name(plan)
    assert list(roles) == ["retrieval_pool", "retrieval_shard", "query_encoder", "rollout_worker", "frozen_llm",
                           "policy_learner", "reference_model"]  # s3 + grpo + kl 0.001: no critic
    assert (roles["retrieval_shard"].count, roles["retrieval_shard"].cpus) == (4, 0.25)
    assert roles["retrieval_shard"].keys == {"count": "index.num_shards", "cpus": "retrieval.shard_cpus",
                                             "gpus": "retrieval.shard_gpus"}
    assert (roles["query_encoder"].count, roles["query_encoder"].cpus) == (2, 0.25)
    assert roles["frozen_llm"].count == 1  # s3's generator also judges
    assert roles["policy_learner"].strategy == "PACK"
    # Shards and rollout workers spread over the nodes; the options the actors start with say so.
    assert [roles[n].strategy for n in ("retrieval_shard", "rollout_worker", "query_encoder")] == [
        "SPREAD", "SPREAD", "DEFAULT"]
    assert roles["retrieval_shard"].ray_options()["scheduling_strategy"] == "SPREAD"
    assert "scheduling_strategy" not in roles["query_encoder"].ray_options()
    assert total_resources(plan) == {"CPU": pytest.approx(5.75), "GPU": 0.0}
    assert "policy_learner" in format_plan(plan) and "5.75" in format_plan(plan)


def test_plan_learners_critic_reference_and_gpus():
    cfg = cfg_with("algorithm.advantage_estimator=gae", "learner.num_ranks=4", "learner.cpus_per_rank=2.0",
                   "learner.gpus_per_rank=1.0", "rollout.num_workers=2", "rollout.gpus_per_worker=2.0",
                   "frozen.num_gpus=0.5", "retrieval.encoder_gpus=0.25")
    roles = by_name(plan_roles(cfg))
    for name in ("policy_learner", "critic_learner"):
        assert (roles[name].count, roles[name].strategy) == (4, "PACK")
        assert roles[name].bundle() == {"CPU": 2.0, "GPU": 1.0}
    assert roles["reference_model"].count == 1 and roles["reference_model"].gpus == 1.0
    assert roles["rollout_worker"].ray_options() == {"num_cpus": 1.0, "num_gpus": 2.0, "scheduling_strategy": "SPREAD"}
    # 4 + 4 policy/critic ranks, 1 reference, 2 x 2 rollout, 0.5 frozen, 2 x 0.25 encoders
    assert total_resources(roles.values())["GPU"] == pytest.approx(14.0)


def test_plan_optional_roles_follow_the_config():
    assert "reference_model" not in by_name(plan_roles(cfg_with("algorithm.kl_coef=0.0")))
    assert "query_encoder" not in by_name(plan_roles(cfg_with("index.type=bm25")))
    assert "frozen_llm" not in by_name(plan_roles(cfg_with("train.recipe=search_r1")))
    assert by_name(plan_roles(cfg_with("frozen.judge_model=other-judge")))["frozen_llm"].count == 2
    no_judge = cfg_with("frozen.judge_model=other-judge", "train.recipe_options={use_judge: false}")
    assert by_name(plan_roles(no_judge))["frozen_llm"].count == 1
    assert by_name(plan_roles(cfg_with("train.recipe=r_search")))["frozen_llm"].count == 1
    off = cfg_with("train.recipe=r_search", "train.recipe_options={evidence_reward: false}")
    assert "frozen_llm" not in by_name(plan_roles(off))
    staged = cfg_with("train.recipe=r_search", "train.recipe_options={evidence_reward: false}",
                      "train.stages=[{steps: 1}, {steps: 1, recipe_options: {evidence_reward: true}}]")
    assert by_name(plan_roles(staged))["frozen_llm"].count == 1


def test_check_fits_passes_on_an_exact_fit_with_float_sums():
    plan = plan_roles(cfg_with())
    check_fits(plan, {"CPU": 5.75, "memory": 8e9}, nodes=[{"CPU": 5.75}])  # no error


def test_check_fits_names_role_need_available_and_keys():
    plan = plan_roles(cfg_with())
    with pytest.raises(ResourceFitError) as err:
        check_fits(plan, {"CPU": 2.0})
    msg = str(err.value)
    assert "CPU: the plan needs 5.75, the cluster has 2" in msg
    assert "retrieval_shard  4 x 0.25" in msg and "lower index.num_shards or retrieval.shard_cpus" in msg
    assert "policy_learner" in msg and "learner.num_ranks or learner.cpus_per_rank" in msg
    assert "retrieval_pool" in msg and "before starting any" in msg
    assert len(err.value.problems) == 1 + len(plan)  # the CPU line + one line per CPU user


def test_check_fits_gpu_missing_and_per_node():
    plan = plan_roles(cfg_with("rollout.gpus_per_worker=2.0"))
    with pytest.raises(ResourceFitError, match=r"GPU: the plan needs 2, the cluster has 0") as err:
        check_fits(plan, {"CPU": 64.0})
    assert "lower rollout.num_workers or rollout.gpus_per_worker" in str(err.value)
    assert "policy_learner" not in "\n".join(err.value.problems)  # only GPU users are listed
    nodes = alive_node_resources([{"Alive": True, "Resources": {"CPU": 32.0, "GPU": 1.0}},
                                  {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 1.0}},
                                  {"Alive": False, "Resources": {"CPU": 99.0, "GPU": 8.0}}])
    with pytest.raises(ResourceFitError, match=r"rollout_worker: one instance needs CPU 1, GPU 2 but no node"):
        check_fits(plan, {"CPU": 64.0, "GPU": 2.0}, nodes)


def test_check_fits_memory_in_bytes():
    from cluster.roles import RoleSpec

    plan = [RoleSpec("big", 2, 1.0, memory=3 * 2**30)]
    assert total_resources(plan)["memory"] == 6 * 2**30
    with pytest.raises(ResourceFitError, match=r"memory: the plan needs 6 GiB, the cluster has 4 GiB"):
        check_fits(plan, {"CPU": 4.0, "memory": 4 * 2**30})


def test_roles_module_imports_no_ray():
    code = "import sys, cluster, cluster.roles, cluster.runtime_env; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


# ----------------------------------------------------------------------------- runtime_env


def test_runtime_env_excludes_env_vars_and_no_installs(tmp_path):
    cfg = cfg_with(f"run_dir={REPO / 'my-runs'}", "index.dir=/elsewhere/index", "train.wandb.mode=disabled")
    env = job_runtime_env(REPO, cfg, extra_env={"HF_HUB_OFFLINE": "0", "X": "1"},
                          environ={"SEARCHRL_DATA": str(tmp_path / "data" / ".." / "data"), "WANDB_API_KEY": "s"})
    assert set(env) == {"working_dir", "excludes", "env_vars"}  # no pip / uv / py_executable
    assert env["working_dir"] == str(REPO)
    for pattern in (".venv", ".git", "/runs", "/indexes", "wandb", "*.gz", "__pycache__", ".cache", "/my-runs"):
        assert pattern in env["excludes"]
    assert not any(p.startswith("/elsewhere") for p in env["excludes"])  # outside the repo: not uploaded anyway
    ev = env["env_vars"]
    assert ev["HF_HUB_OFFLINE"] == "0" and ev["X"] == "1"  # extra_env wins
    assert ev["TRANSFORMERS_OFFLINE"] == "1" and ev["TOKENIZERS_PARALLELISM"] == "false"
    assert ev["RAY_USAGE_STATS_ENABLED"] == "0" and ev["WANDB_MODE"] == "disabled"
    assert ev["SEARCHRL_DATA"] == str(tmp_path / "data")  # absolute, normalised
    assert "WANDB_API_KEY" not in ev  # secrets are never copied into the runtime_env
    with pytest.raises(TypeError, match="extra_env"):
        job_env_vars(cfg, {"N": 1})


def test_excludes_keep_ray_from_packing_heavy_state(tmp_path):
    """Ray's own packager (private `_zip_files`, .gitignore off) with our excludes on a fake repo."""
    from ray._private.runtime_env.packaging import _zip_files

    repo = tmp_path / "repo"
    for rel in ("actors/a.py", "configs/c.yaml", "scripts/train.py", ".venv/lib/x.py", ".git/HEAD",
                "runs/r1/metrics.jsonl", "indexes/i/shard0/index.faiss", "wandb/offline-run/x", "data/train.jsonl.gz",
                "models/m/model.safetensors", "actors/__pycache__/a.cpython-311.pyc", ".cache/x", "out/run/x.txt"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x")
    cfg = cfg_with("run_dir=out")
    excludes = job_excludes(repo, cfg, base=repo)
    assert "/out" in excludes
    zip_path = tmp_path / "pkg.zip"
    _zip_files(str(repo), excludes, str(zip_path), include_gitignore=False)
    names = {n for n in zipfile.ZipFile(zip_path).namelist() if not n.endswith("/")}
    assert names == {"actors/a.py", "configs/c.yaml", "scripts/train.py"}
    assert upload_size(repo, excludes) == (3, 3)


def test_real_repo_upload_is_small():
    cfg = cfg_with()
    files, size = upload_size(REPO, job_excludes(REPO, cfg, base=REPO))
    assert 0 < files < 2000 and size < 20 * 2**20, (files, size)


def test_absolute_path_overrides_round_trip(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    cfg = cfg_with("run_dir=runs", "index.dir=indexes/x y", "data.dir=/abs/data", "learner.model=models/m")
    over = absolute_path_overrides(cfg, base=tmp_path)
    assert over[0] == f'run_dir="{tmp_path / "runs"}"'
    parsed = parse_overrides(over)
    assert parsed["index"]["dir"] == str(tmp_path / "indexes" / "x y")
    assert parsed["learner"]["model"] == str(tmp_path / "models" / "m")
    assert parsed["data"]["dir"] == "/abs/data"  # already absolute: repeated as it is
    assert "frozen" not in parsed  # "gemma3-270m" is an alias, not a local path
    again = load_config(DEFAULT_CONFIG, over)
    assert again.run_dir == str(tmp_path / "runs")


# ----------------------------------------------------------------------------- scripts.submit


def test_auth_headers_sources_and_precedence(tmp_path):
    token_file = tmp_path / "tok"
    token_file.write_text("from-file\n")
    assert auth_headers("t1", token_file, environ={}) == {"Authorization": "Bearer t1"}
    assert auth_headers(None, token_file, environ={}) == {"Authorization": "Bearer from-file"}
    assert auth_headers(environ={"RAY_AUTH_TOKEN": "env", "RAY_AUTH_TOKEN_PATH": str(token_file)}) == {
        "Authorization": "Bearer env"}
    assert auth_headers(environ={"RAY_AUTH_TOKEN_PATH": str(token_file)}) == {"Authorization": "Bearer from-file"}
    assert auth_headers(environ={"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "env"}) == {}
    assert auth_headers(environ={}) == {}  # Ray's client adds ~/.ray/auth_token itself with RAY_AUTH_MODE=token
    (tmp_path / "empty").write_text("")
    with pytest.raises(SubmitError, match="is empty"):
        auth_headers(token_file=tmp_path / "empty", environ={})
    with pytest.raises(SubmitError, match="cannot read"):
        auth_headers(token_file=tmp_path / "missing", environ={})


def test_build_entrypoint_and_exit_codes():
    cmd = build_entrypoint("scripts.train", DEFAULT_CONFIG, ['run_dir="/a b/runs"', "x.y=1"])
    assert cmd == "python -m scripts.train --config configs/retrieval_cpu.yaml 'run_dir=\"/a b/runs\"' x.y=1"
    assert build_entrypoint("m", "/etc/outside.yaml", python="/venv/bin/python") == (
        "/venv/bin/python -m m --config /etc/outside.yaml")
    assert [JobResult("j", s).exit_code for s in ("SUCCEEDED", "FAILED", "STOPPED", "PENDING")] == [0, 1, 3, 0]
    assert JobResult("j", "RUNNING", timed_out=True).exit_code == 124


def test_submit_main_builds_the_default_and_raw_commands(monkeypatch, capsys):
    seen = []

    def fake_submit(address, entrypoint, runtime_env, **kw):
        seen.append((address, entrypoint, runtime_env, kw))
        return JobResult("raysubmit_x", "FAILED")

    monkeypatch.setattr(submit_mod, "submit_job", fake_submit)
    code = submit_mod.main(["--address", "http://127.0.0.1:1", "--module", "scripts.ops.cluster_check",
                            "--env", "A=b", "retrieval.topk=5", "run_dir=elsewhere"])
    assert code == 1
    address, entrypoint, env, kw = seen[-1]
    assert entrypoint.startswith("python -m scripts.ops.cluster_check --config configs/retrieval_cpu.yaml retrieval.topk=5")
    assert f'run_dir="{Path.cwd() / "elsewhere"}"' in entrypoint and "run_dir=elsewhere" not in entrypoint
    assert env["env_vars"]["A"] == "b" and kw["wait"]
    assert submit_mod.main(["--no-wait", "retrieval.topk=5", "--", "echo", "a b"]) == 1
    assert seen[-1][1] == "echo 'a b'" and seen[-1][3]["wait"] is False
    assert "MiB before compression" in capsys.readouterr().out


def test_submit_unreachable_cluster_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SubmitError, match="cannot reach the Ray Jobs API"):
        submit_job(f"http://127.0.0.1:{port}", "true", token="x")


# ----------------------------------------------------------------------------- a real cluster


FITS_2_CPUS = ("index.num_shards=1", "retrieval.query_encoders=1", "rollout.cpus_per_worker=0.25",
               "frozen.num_cpus=0.25", "learner.cpus_per_rank=0.25")


@pytest.fixture(scope="module")
def local_head():
    """One `ray start --head` cluster (2 CPUs) for this module's job submissions: started once (its dashboard
    takes most of the start), then stopped, with the check that every process it started is gone and its
    temp dir removed."""
    head = LocalCluster(NodeSpec(num_cpus=2), cwd=REPO)
    leftovers = None
    try:
        head.start()
        yield head
    finally:
        leftovers = head.stop()
    assert leftovers == [], f"processes of the test cluster still running: {leftovers}"
    assert not head.root.exists()


@pytest.mark.slow
def test_submit_cluster_check_to_a_local_head(local_head, tmp_path):
    head = local_head
    with pytest.raises(SubmitError, match=r"(?s)refused the request.*RAY_AUTH_MODE=token"):
        submit_job(head.dashboard_url, "true", token="not-the-token", out=io.StringIO())

    cfg = cfg_with(f"run_dir={tmp_path / 'fits'}", *FITS_2_CPUS)
    entry = build_entrypoint("scripts.ops.cluster_check", DEFAULT_CONFIG, [*FITS_2_CPUS, *absolute_path_overrides(cfg)])
    logs = io.StringIO()
    result = submit_job(head.dashboard_url, entry, job_runtime_env(REPO, cfg, {"SEARCHRL_TEST": "1"}),
                        token_file=head.token_file, out=logs, timeout_s=300)
    assert result.status == "SUCCEEDED", logs.getvalue()[-3000:]
    assert result.exit_code == 0 and "fits: yes" in logs.getvalue()  # logs were streamed
    report = json.loads((tmp_path / "fits" / "cluster_check.json").read_text())
    assert report["fits"] is True and report["error"] is None
    assert report["cluster_resources"]["CPU"] == 2.0 and len(report["nodes"]) == 1
    assert [r["name"] for r in report["plan"]][:3] == ["retrieval_pool", "retrieval_shard", "query_encoder"]
    assert report["total"]["CPU"] == pytest.approx(1.75)
    assert report["python"].startswith(str(REPO / ".venv"))  # the cluster's python is the venv's
    assert report["cwd"] != str(REPO) and "working_dir" in report["cwd"]  # ran in the uploaded copy
    assert report["env"]["HF_HUB_OFFLINE"] == "1" and report["env"]["WANDB_MODE"] == "offline"

    # The same check for the default config: 5.75 CPUs do not fit in 2 -> the job FAILS, saying why.
    cfg = cfg_with(f"run_dir={tmp_path / 'nofit'}")
    entry = build_entrypoint("scripts.ops.cluster_check", DEFAULT_CONFIG, absolute_path_overrides(cfg))
    logs = io.StringIO()
    result = submit_job(head.dashboard_url, entry, job_runtime_env(REPO, cfg), token_file=head.token_file,
                        out=logs, timeout_s=300)
    assert (result.status, result.exit_code) == ("FAILED", 1), logs.getvalue()[-3000:]
    assert "CPU: the plan needs 5.75, the cluster has 2" in logs.getvalue()
    assert json.loads((tmp_path / "nofit" / "cluster_check.json").read_text())["fits"] is False


@pytest.mark.slow
@pytest.mark.heavy  # CI keeps the submission path (the cluster check) and training itself (test_train.py)
def test_submit_a_short_training_job(local_head, tmp_path, small_index, tiny_gemma_dir):
    """`ray job submit` of scripts.train to a local head (2 CPUs): one GRPO step of R1-Searcher stage 1
    (tiny Gemma 3 policy, transformers backend, the real pool over the pack) leaves metrics and a
    checkpoint in the run directory."""
    train_overrides = [
        f"index.dir={small_index}", "index.num_shards=2", f"learner.model={tiny_gemma_dir}",
        "rollout.backend=hf", "learner.lr=0.001", "train.questions_per_step=2", "rollout.samples_per_prompt=2",
        "learner.mini_batch_size=4", "learner.micro_batch_size=2", "rollout.max_new_tokens_per_turn=16",
        "rollout.max_total_tokens=1024", "rollout.cpus_per_worker=0.25", "learner.cpus_per_rank=0.5",
        "retrieval.query_encoders=1", "train.eval_questions=0", "train.wandb.mode=offline", "ray.num_cpus=null",
        "algorithm.skip_zero_advantage=false",  # a random policy's groups all score alike: keep the update to check
        'train.stages=[{"steps": 1, "recipe_options": {"stage": 1}}]',
    ]
    config = REPO / "configs" / "r1_searcher_cpu.yaml"
    cfg = load_config(config, [*train_overrides, f"run_dir={tmp_path / 'runs'}"])
    head = local_head
    entry = build_entrypoint("scripts.train", config, [*train_overrides, "--no-progress",
                                                       *absolute_path_overrides(cfg)])
    logs = io.StringIO()
    result = submit_job(head.dashboard_url, entry, job_runtime_env(REPO, cfg), token_file=head.token_file,
                        out=logs, timeout_s=900)
    assert result.status == "SUCCEEDED", logs.getvalue()[-4000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and "actor/policy_loss" in rows[0]
    assert (run_dir / "checkpoints" / "step-1" / "trainer_state.json").is_file()
    assert (run_dir / "checkpoints" / "step-1" / "policy" / "hf" / "model.safetensors").is_file()
    assert f"run directory: {run_dir}" in logs.getvalue()
