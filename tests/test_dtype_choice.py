"""Each role's dtype by the CPU: `auto` is bf16 only where the CPU has bf16 instructions, the
choice reaches every role, a run's saved config keeps it on another CPU, and bf16 asked for on a CPU that
emulates it warns with the cost and the key. CPUs are mocked from /proc/cpuinfo text."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import configs.dtype_choice as dtype_choice
from configs import Config, ConfigError, load_config, save_config
from configs.cpu_features import AVX2_LIMITED_ENV, parse_cpuinfo
from configs.dtype_choice import CpuDtypeWarning, machine_line

REPO_ROOT = Path(__file__).resolve().parents[1]

XEON = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\nflags\t\t: fpu sse2 avx avx2 fma "
        "f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
SAPPHIRE = "model name\t: Intel(R) Xeon(R) w5\nflags\t\t: avx2 fma avx512f amx_tile amx_bf16 amx_int8\n"
EPYC = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx f16c fma avx2 bmi2\n"
SKYLAKE = "model name\t: Intel(R) Xeon(R) Gold 6148\nflags\t\t: avx2 fma avx512f avx512bw avx512vl\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU part\t: 0xd40\n"

ROLE_KEYS = ("learner.dtype", "learner.sync_dtype", "rollout.dtype", "frozen.dtype", "encoder.precision")


@pytest.fixture
def on_cpu(monkeypatch):
    """Make `configs.dtype_choice` see the CPU of the given /proc/cpuinfo text (and environment)."""

    def use(text: str, env: dict[str, str] | None = None):
        cpu = parse_cpuinfo(text, env or {})
        monkeypatch.setattr(dtype_choice, "cpu_features", lambda: cpu)
        return cpu

    return use


@pytest.mark.parametrize("text, native", [(XEON, True), (SAPPHIRE, True), (GRAVITON3, True), (EPYC, False),
                                          (SKYLAKE, False), ("", False)])
def test_bf16_is_native_only_with_bf16_instructions(text, native):
    assert parse_cpuinfo(text, {}).native_bf16 is native


def test_the_first_processor_names_the_cpu_and_its_instruction_sets():
    cpu = parse_cpuinfo(XEON, {})
    assert cpu.model.startswith("Intel(R) Xeon(R) Platinum") and "avx512_bf16" in cpu.flags
    assert cpu.isa_names() == ["AVX2", "FMA", "AVX-512", "AVX-512-VNNI", "AVX-512-BF16"]
    assert "bf16 native" in cpu.describe()
    assert parse_cpuinfo(EPYC, {}).isa_names() == ["AVX2", "FMA"]


@pytest.mark.parametrize("env, limited", [
    (AVX2_LIMITED_ENV, True), ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, True), ({"ATEN_CPU_CAPABILITY": "avx2"}, True),
    ({"ATEN_CPU_CAPABILITY": "default"}, True), ({"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}, False),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, False), ({"ATEN_CPU_CAPABILITY": "avx512"}, False), ({}, False),
])
def test_the_environment_can_take_bf16_kernels_away_from_an_avx512_bf16_host(env, limited):
    cpu = parse_cpuinfo(XEON, env)
    assert cpu.native_bf16 is not limited
    assert bool(cpu.limited) is limited
    if limited:
        assert "limited by" in cpu.describe() and "bf16 emulated" in cpu.describe()


def test_auto_is_bf16_on_a_bf16_cpu_and_fp32_elsewhere(on_cpu):
    on_cpu(XEON)
    cfg = Config()
    assert [getattr(getattr(cfg, k.split(".")[0]), k.split(".")[1]) for k in ROLE_KEYS] == ["bf16"] * 5
    on_cpu(EPYC)
    cfg = Config()
    assert dtype_choice.role_dtypes(cfg) == dict.fromkeys(ROLE_KEYS, "fp32")
    on_cpu(XEON, AVX2_LIMITED_ENV)
    assert set(dtype_choice.role_dtypes(Config()).values()) == {"fp32"}


def test_auto_on_gpus_keeps_what_the_gpu_configs_used(on_cpu):
    on_cpu(EPYC)  # the host's CPU does not matter for roles on GPUs
    cfg = Config(learner={"gpus_per_rank": 1.0}, rollout={"gpus_per_worker": 1.0}, frozen={"num_gpus": 0.5},
                 encoder={"device": "cuda"})
    assert dtype_choice.role_dtypes(cfg) == {"learner.dtype": "bf16", "learner.sync_dtype": "bf16",
                                             "rollout.dtype": "checkpoint", "frozen.dtype": "checkpoint",
                                             "encoder.precision": "fp32"}
    gpu = load_config(REPO_ROOT / "configs" / "train_gpu.yaml")
    assert (gpu.learner.dtype, gpu.learner.sync_dtype, gpu.rollout.dtype) == ("bf16", "bf16", "checkpoint")


def test_the_main_job_config_follows_the_cpu(on_cpu):
    on_cpu(XEON)
    assert load_config(REPO_ROOT / "configs" / "main_cpu.yaml").learner.dtype == "bf16"
    on_cpu(EPYC)
    cfg = load_config(REPO_ROOT / "configs" / "main_cpu.yaml")
    assert set(dtype_choice.role_dtypes(cfg).values()) == {"fp32"}


def test_resolved_dtypes_reach_every_engine_role(on_cpu):
    from actors.engines.spec import ROLES, engine_spec
    from actors.retrieval.encoder import EncoderSpec

    on_cpu(EPYC)
    cfg = Config()
    assert {role: engine_spec(cfg, role).dtype for role in ROLES} == dict.fromkeys(ROLES, "float32")
    assert EncoderSpec.from_config(cfg.encoder).precision == "fp32"
    on_cpu(XEON)
    cfg = Config(frozen={"dtype": "checkpoint"})
    assert engine_spec(cfg, "policy").dtype == "bfloat16"
    assert engine_spec(cfg, "judge").dtype == "checkpoint"  # the weights' own dtype on any machine
    assert EncoderSpec.from_config(cfg.encoder).precision == "bf16"


def test_explicit_bf16_on_an_emulating_cpu_runs_after_a_warning_naming_cost_and_key(on_cpu):
    on_cpu(EPYC)
    with pytest.warns(CpuDtypeWarning) as record:
        cfg = Config(learner={"dtype": "bf16"}, rollout={"dtype": "bf16"})
    assert cfg.learner.dtype == "bf16" and cfg.rollout.dtype == "bf16"
    messages = [str(w.message) for w in record]
    assert any(re.search(r"learner\.dtype=bf16 .*27x.*set learner\.dtype=auto", m) for m in messages)
    assert any(m.startswith("rollout.dtype=bf16 on a CPU that emulates bf16") for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CpuDtypeWarning)
        Config(learner={"dtype": "fp32"})  # fp32: nothing to say
        Config(learner={"dtype": "bf16", "gpus_per_rank": 1.0})  # on a GPU bf16 is native
        on_cpu(XEON)
        Config(learner={"dtype": "bf16"})


def test_a_saved_run_keeps_its_choice_on_another_cpu_unless_overridden(on_cpu, tmp_path):
    from configs.resume import load_resume_config

    on_cpu(XEON)
    save_config(Config(), tmp_path / "config.yaml")
    assert "dtype: auto" not in (tmp_path / "config.yaml").read_text()  # the resolved values are recorded
    on_cpu(EPYC)
    with pytest.warns(CpuDtypeWarning):
        cfg, changed = load_resume_config(tmp_path)
    assert set(dtype_choice.role_dtypes(cfg).values()) == {"bf16"} and changed == {}
    with pytest.warns(CpuDtypeWarning):  # the learner's DeepSpeed state stays bf16: it warns
        cfg, changed = load_resume_config(tmp_path, ["rollout.dtype=auto", "frozen.dtype=fp32",
                                                     "learner.sync_dtype=auto"])
    assert (cfg.rollout.dtype, cfg.frozen.dtype, cfg.learner.sync_dtype) == ("fp32", "fp32", "fp32")
    assert set(changed) == {"rollout.dtype", "frozen.dtype", "learner.sync_dtype"}
    with pytest.raises(ConfigError, match=r"learner\.dtype: 'bf16' -> 'fp32'"), pytest.warns(CpuDtypeWarning):
        load_resume_config(tmp_path, ["learner.dtype=fp32"])


def test_a_bad_dtype_names_the_field(on_cpu):
    on_cpu(EPYC)
    with pytest.raises(ConfigError, match=r"rollout\.dtype"):
        load_config(REPO_ROOT / "configs" / "main_cpu.yaml", ["rollout.dtype=fp8"])
    with pytest.raises(ConfigError, match=r"learner\.gpus_per_rank"):  # a bad neighbour is left to its own check
        load_config(REPO_ROOT / "configs" / "main_cpu.yaml", ["learner.gpus_per_rank=many"])


def test_the_machine_line_names_the_cpu_and_each_role(on_cpu):
    on_cpu(EPYC)
    line = machine_line(Config())
    assert line.startswith("cpu: AMD EPYC: AVX2 FMA; no AVX-512; bf16 emulated")
    assert line.endswith("dtypes: learner fp32, sync fp32, rollout fp32, frozen fp32, encoder fp32")
    on_cpu(XEON)
    assert machine_line().endswith("auto dtypes on CPU: bf16")


def test_engines_load_auto_in_fp32_only_where_bf16_is_emulated(on_cpu):
    from configs.dtype_choice import engine_load_dtype

    on_cpu(EPYC)
    assert engine_load_dtype("auto", on_gpu=False) == "float32"  # a bf16 checkpoint decodes slowly there
    assert engine_load_dtype("auto", on_gpu=True) == "auto"
    assert engine_load_dtype("checkpoint", on_gpu=False) == "auto"  # the weights' own, as asked
    assert engine_load_dtype("bfloat16", on_gpu=False) == "bfloat16"
    on_cpu(XEON)
    assert engine_load_dtype("auto", on_gpu=False) == "auto"
