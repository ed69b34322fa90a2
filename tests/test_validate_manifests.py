"""`scripts.ops.validate_manifests`: the shipped deploy artifacts pass, and each kind of mistake fails naming
what is wrong. Offline: no Ray cluster, no API server, no model (the RayService app is bound, not deployed).
Also the job links `scripts.submit` prints."""

import copy
import io

import pytest
import yaml

from scripts.ops import validate_manifests as vm


@pytest.fixture(scope="module")
def docs():
    return {"ray_up": vm.load_yaml(vm.RAY_UP), "crd": vm.crd_subset(), "rayjob": vm.load_yaml(vm.RAYJOB),
            "rayservice": vm.load_yaml(vm.RAYSERVICE)}


def problems_text(result) -> str:
    assert not result.ok, result.line()
    return "\n".join(result.problems)


def test_shipped_artifacts_pass(capsys):
    assert vm.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:4]] == ["ok"] * 4, lines
    assert lines[-1] == "validate_manifests: 4 artifacts, 4 passed, 0 failed"
    assert any("serving.app:build_app built the application" in line for line in lines)


def test_a_failing_artifact_makes_exit_status_1(docs, tmp_path, monkeypatch, capsys):
    job = copy.deepcopy(docs["rayjob"])
    job["spec"]["shutdownAfterJobFinish"] = job["spec"].pop("shutdownAfterJobFinishes")
    broken = tmp_path / "rayjob-train.yaml"
    broken.write_text(yaml.safe_dump(job))
    monkeypatch.setattr(vm, "RAYJOB", broken)
    monkeypatch.setattr(vm, "check_rayservice", lambda manifest: vm.Result("rayservice", details=["skipped"]))
    assert vm.main([]) == 1
    out = capsys.readouterr().out
    assert f"FAIL  {broken}: RayJob spec: Additional properties are not allowed ('shutdownAfterJobFinish'" in out
    assert out.splitlines()[-1] == "validate_manifests: 4 artifacts, 3 passed, 1 failed"


# ----------------------------------------------------------------------------- ray up


def test_ray_up_missing_required_key_fails(docs):
    cfg = copy.deepcopy(docs["ray_up"])
    del cfg["provider"]
    assert "'provider' is a required property" in problems_text(vm.check_ray_up(cfg, gpu_configs=[]))
    cfg = copy.deepcopy(docs["ray_up"])
    del cfg["available_node_types"]["gpu_worker"]["node_config"]
    text = problems_text(vm.check_ray_up(cfg, gpu_configs=[]))
    assert "available_node_types.gpu_worker: 'node_config' is a required property" in text


def test_ray_up_misspelled_key_and_project_rules_fail(docs):
    cfg = copy.deepcopy(docs["ray_up"])
    cfg["setup_command"] = cfg.pop("setup_commands")
    assert "'setup_command' was unexpected" in problems_text(vm.check_ray_up(cfg, gpu_configs=[]))
    cfg = copy.deepcopy(docs["ray_up"])
    cfg["worker_start_ray_commands"] = [c.replace("RAY_AUTH_MODE=token ", "") for c in cfg["worker_start_ray_commands"]]
    cfg["setup_commands"] = [c.replace("SEARCHRL_VARIANT=gpu", "SEARCHRL_VARIANT=cpu") for c in cfg["setup_commands"]]
    cfg["available_node_types"]["gpu_worker"]["resources"] = {"CPU": 192}
    text = problems_text(vm.check_ray_up(cfg, gpu_configs=[]))
    assert "worker_start_ray_commands: every `ray start` needs RAY_AUTH_MODE=token" in text
    assert "SEARCHRL_VARIANT=gpu bash scripts/setup.sh" in text
    assert "no worker node type with GPU" in text


def test_ray_up_too_small_for_a_gpu_config_fails(docs):
    cfg = copy.deepcopy(docs["ray_up"])
    cfg["available_node_types"]["gpu_worker"]["min_workers"] = 1
    text = problems_text(vm.check_ray_up(cfg, gpu_configs=[vm.REPO_ROOT / "configs" / "s3_gpu.yaml"]))
    assert "cannot hold the plan of s3-gpu (12.5 GPU" in text and "GPU: the plan needs 12.5" in text


def test_ray_up_agrees_with_rays_own_prepare_and_validate(docs):
    """Ray's private prepare_config/validate_config (what `ray up` runs) accept the shipped file too."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(docs["ray_up"])))


# ----------------------------------------------------------------------------- CRD subset


def test_crd_subset_rejects_unknown_fields_everywhere(docs):
    assert vm.check_crd_subset(docs["crd"]).ok
    loose = copy.deepcopy(docs["crd"])
    del loose["definitions"]["container"]["additionalProperties"]
    assert "definitions.container: describes properties without additionalProperties: false" in problems_text(
        vm.check_crd_subset(loose))


def test_misspelled_rayjob_field_fails_naming_it(docs):
    job = copy.deepcopy(docs["rayjob"])
    job["spec"]["shutdownAfterJobFinish"] = job["spec"].pop("shutdownAfterJobFinishes")
    text = problems_text(vm.check_rayjob(job, docs["crd"]))
    assert "RayJob spec: Additional properties are not allowed ('shutdownAfterJobFinish' was unexpected)" in text


def test_misspelled_nested_field_and_bad_enum_fail(docs):
    job = copy.deepcopy(docs["rayjob"])
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["volumeMount"] = worker.pop("volumeMounts")
    job["spec"]["submissionMode"] = "K8sMode"
    text = problems_text(vm.check_rayjob(job, docs["crd"]))
    assert "spec.rayClusterSpec.workerGroupSpecs.0.template.spec.containers.0" in text and "'volumeMount'" in text
    assert "spec.submissionMode: 'K8sMode' is not one of" in text
    service = copy.deepcopy(docs["rayservice"])
    service["spec"]["rayClusterConfig"]["authOptions"]["mode"] = "tokens"
    assert "authOptions.mode: 'tokens' is not one of ['disabled', 'token']" in problems_text(
        vm.check_rayservice(service, docs["crd"]))


# ----------------------------------------------------------------------------- RayJob


def with_runtime_env(job, **changes):
    job = copy.deepcopy(job)
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    env.update(changes)
    job["spec"]["runtimeEnvYAML"] = yaml.safe_dump(env)
    return job


def test_bad_runtime_env_fails(docs):
    job = docs["rayjob"]
    text = problems_text(vm.check_rayjob(with_runtime_env(job, env_vars={"HF_HUB_OFFLINE": 0}), docs["crd"]))
    assert "runtime_env['env_vars'] must be of type Dict[str, str]" in text
    text = problems_text(vm.check_rayjob(with_runtime_env(job, env_var={"A": "1"}, pip=["torch"]), docs["crd"]))
    assert "unknown runtime_env field 'env_var'" in text
    assert "'pip' installs per job" in text
    text = problems_text(vm.check_rayjob(with_runtime_env(job, working_dir="local://app"), docs["crd"]))
    assert "the path must be absolute" in text


def test_runtime_env_hub_access_must_follow_the_config(docs):
    env = yaml.safe_load(docs["rayjob"]["spec"]["runtimeEnvYAML"])
    env["env_vars"]["HF_HUB_OFFLINE"] = "1"
    job = with_runtime_env(docs["rayjob"], env_vars=env["env_vars"])
    text = problems_text(vm.check_rayjob(job, docs["crd"]))
    assert "env_vars.HF_HUB_OFFLINE: '1', but s3-gpu names Hub models (Qwen/" in text and "set '0'" in text


def test_bad_entrypoint_fails(docs):
    job = copy.deepcopy(docs["rayjob"])
    job["spec"]["entrypoint"] = "python -m scripts.train --config configs/s3_gpu.yaml run_dir=runs train.total_stepz=3"
    text = problems_text(vm.check_rayjob(job, docs["crd"]))
    assert "train.total_stepz" in text
    job["spec"]["entrypoint"] = "python -m scripts.train --config configs/s3_gpu.yaml run_dir=runs"
    assert "run_dir=runs is relative" in problems_text(vm.check_rayjob(job, docs["crd"]))
    job["spec"]["entrypoint"] = "python -m scripts.train -- --config configs/s3_gpu.yaml"
    assert "unexpected option '--'" in problems_text(vm.check_rayjob(job, docs["crd"]))


def test_rayjob_cluster_must_hold_the_config_and_use_token_auth(docs):
    job = copy.deepcopy(docs["rayjob"])
    cluster = job["spec"]["rayClusterSpec"]
    cluster["workerGroupSpecs"][0].update(replicas=1, minReplicas=1, maxReplicas=1)
    del cluster["authOptions"]
    cluster["rayVersion"] = "2.59.0"
    job["spec"]["shutdownAfterJobFinishes"] = False
    text = problems_text(vm.check_rayjob(job, docs["crd"]))
    assert "cannot hold the plan of s3-gpu (12.5 GPU" in text
    assert "authOptions.mode must be token" in text
    assert "rayVersion '2.59.0'" in text
    assert "shutdownAfterJobFinishes: set true" in text


# ----------------------------------------------------------------------------- RayService


def with_serve_app(service, **changes):
    service = copy.deepcopy(service)
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    serve_config["applications"][0].update(changes)
    service["spec"]["serveConfigV2"] = yaml.safe_dump(serve_config)
    return service


@pytest.mark.parametrize("import_path, error", [
    ("serving.app:build_ap", "AttributeError"),
    ("serving.nowhere:build_app", "ModuleNotFoundError"),
])
def test_bad_serve_import_path_fails(docs, import_path, error):
    text = problems_text(vm.check_rayservice(with_serve_app(docs["rayservice"], import_path=import_path), docs["crd"]))
    assert f"import_path {import_path!r}: {error}" in text


def test_serve_config_schema_and_builder_args_are_checked(docs):
    service = copy.deepcopy(docs["rayservice"])
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    serve_config["http_options"]["prot"] = 8000
    service["spec"]["serveConfigV2"] = yaml.safe_dump(serve_config)
    text = problems_text(vm.check_rayservice(service, docs["crd"]))
    assert "spec.serveConfigV2.http_options: unknown field 'prot' (Ray Serve ignores it" in text
    service = with_serve_app(docs["rayservice"], route_prefx="/")
    assert "applications[0]: unknown field 'route_prefx'" in problems_text(vm.check_rayservice(service, docs["crd"]))
    serve_config["http_options"] = {"port": "eighty"}
    service["spec"]["serveConfigV2"] = yaml.safe_dump(serve_config)
    assert "ServeDeploySchema: 1 validation error" in problems_text(vm.check_rayservice(service, docs["crd"]))
    args = {"checkpoint": "/nowhere/run", "config": "configs/s3_gpu.yaml", "overrides": "serve.replicaz=2"}
    text = problems_text(vm.check_rayservice(with_serve_app(docs["rayservice"], args=args), docs["crd"]))
    assert "serve.replicaz" in text


# ----------------------------------------------------------------------------- scripts.submit links


def test_submit_prints_dashboard_page_and_log_command(monkeypatch, tmp_path):
    from scripts import submit

    class FakeClient:
        def submit_job(self, **kw):
            return "raysubmit_abc"

        def get_job_status(self, job_id):
            class Status:
                value = "PENDING"
            return Status()

    monkeypatch.setattr(submit, "_client", lambda address, headers: FakeClient())
    out = io.StringIO()
    token = tmp_path / "token"
    token.write_text("secret-token")
    result = submit.submit_job("http://10.0.0.1:8265/", "true", wait=False, token_file=token, out=out)
    assert (result.submission_id, result.exit_code) == ("raysubmit_abc", 0)
    text = out.getvalue()
    assert "[submit] dashboard: http://10.0.0.1:8265/#/jobs/raysubmit_abc\n" in text
    assert (f"[submit] follow its logs: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token} ray job logs --follow "
            "raysubmit_abc --address http://10.0.0.1:8265/\n") in text
    assert "secret-token" not in text


def test_job_links_without_scheme_and_with_auth_disabled():
    from scripts.submit import job_links

    page, follow = job_links("127.0.0.1:8265", "j1", environ={"RAY_AUTH_MODE": "disabled"})
    assert page == "http://127.0.0.1:8265/#/jobs/j1"
    assert follow == "ray job logs --follow j1 --address 127.0.0.1:8265"
    assert job_links("http://h:8265", "j1", environ={})[1].startswith("RAY_AUTH_MODE=token ray job logs")
