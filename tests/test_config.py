"""Tests for configs.schema / configs.loader."""

import argparse
import textwrap

import pytest

from configs import (
    DEFAULT_CONFIG,
    Config,
    ConfigError,
    add_config_args,
    config_from_args,
    load_config,
    make_run_dir,
    parse_overrides,
    save_config,
)
from configs.schema import EncoderConfig, RetrievalConfig


def write(tmp_path, text, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_defaults_valid():
    cfg = Config()
    assert cfg.index.num_shards == 4 and cfg.index.type == "flat"
    assert cfg.retrieval.topk == 3 and cfg.data.dir is None
    assert load_config(None) == cfg


def test_embedded_default_file():
    cfg = load_config(DEFAULT_CONFIG)
    assert cfg.index.dir == "indexes/minilm-flat-4"
    assert (cfg.index.num_shards, cfg.index.type, cfg.retrieval.topk) == (4, "flat", 3)
    assert cfg.encoder.model == "all-MiniLM-L6-v2"


def test_yaml_file_loads(tmp_path):
    p = write(tmp_path, """
        name: exp
        index: {num_shards: 2, type: hnsw}
        retrieval:
          topk: 5
          batch_wait_ms: 1   # int accepted for float
    """)
    cfg = load_config(p)
    assert cfg.name == "exp" and cfg.index.num_shards == 2 and cfg.index.type == "hnsw"
    assert cfg.retrieval.topk == 5 and cfg.retrieval.batch_wait_ms == 1.0
    assert cfg.index.hnsw_m == 32  # untouched defaults kept


def test_empty_yaml_is_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == Config()


def test_overrides_typed(tmp_path):
    p = write(tmp_path, "index: {num_shards: 2}\n")
    cfg = load_config(p, [
        "index.num_shards=8", "index.fp16=true", "ray.num_cpus=null", "ray.address=auto",
        "data.corpus_limit=100", "encoder.max_seq_length=null", "retrieval.batch_wait_ms=0.5",
        "seed=7", "encoder.query_prefix=",
    ])
    assert cfg.index.num_shards == 8 and cfg.index.fp16 is True
    assert cfg.ray.num_cpus is None and cfg.ray.address == "auto"
    assert cfg.data.corpus_limit == 100 and cfg.encoder.max_seq_length is None
    assert cfg.retrieval.batch_wait_ms == 0.5 and cfg.seed == 7 and cfg.encoder.query_prefix == ""


def test_parse_overrides_values():
    got = parse_overrides(["a.b=3", "a.c=true", "d=null", "e=[x, y]", "f=hello", 'g="query: "', "a.b=4"])
    assert got == {"a": {"b": 4, "c": True}, "d": None, "e": ["x", "y"], "f": "hello", "g": "query: "}


def test_list_override_reaches_validation():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["name=[a, b]"])
    assert "name: Input should be a valid string" in str(e.value)


@pytest.mark.parametrize("item", ["retrieval.topk", "=3", "retrieval..topk=3", ".x=1", "x=[1,"])
def test_malformed_override(item):
    with pytest.raises(ConfigError) as e:
        parse_overrides([item])
    assert repr(item) in str(e.value)


def test_malformed_override_form_message():
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(None, ["retrieval.topk"])


def test_unknown_yaml_key(tmp_path):
    p = write(tmp_path, "index:\n  foo: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "index.foo: unknown key (allowed: dir, num_shards," in msg
    assert str(p) in msg
    assert e.value.problems == [l.strip() for l in msg.splitlines()[1:]]


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(ConfigError, match=r"indx: unknown key \(allowed: name, "):
        load_config(write(tmp_path, "indx: {dir: x}\n"))


@pytest.mark.parametrize("item,problem", [
    ("index.foo=1", "index.foo: unknown key (allowed: dir, num_shards,"),
    ("foo.bar=1", "foo: unknown key (allowed: name, run_dir,"),  # the unknown section is named
    ("retrieval.topk.x=1", "retrieval.topk.x: unknown key (retrieval.topk is a value, not a section)"),
    ("train.stages.x=1", "train.stages.x: unknown key (train.stages is a value, not a section)"),
])
def test_unknown_override_key(item, problem):
    with pytest.raises(ConfigError) as e:
        load_config(DEFAULT_CONFIG, [item])
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(problem), e.value.problems
    assert "retrieval_cpu.yaml" in str(e.value) and item in str(e.value)


def test_unknown_override_key_is_listed_with_other_problems():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["index.foo=1", "retrieval.topk=abc"])
    assert sorted(p.split(":")[0] for p in e.value.problems) == ["index.foo", "retrieval.topk"]


def test_unknown_key_in_a_file_with_a_base(tmp_path):
    write(tmp_path, "index: {num_shards: 2}\n", name="base.yaml")
    child = write(tmp_path, "base: base.yaml\nindex: {fooo: 1}\nretrieval: {topk: 5}\n", name="child.yaml")
    with pytest.raises(ConfigError) as e:
        load_config(child)
    assert e.value.problems[0].startswith("index.fooo: unknown key (allowed: dir, num_shards,")
    assert str(child) in str(e.value)
    assert load_config(write(tmp_path, "base: base.yaml\nretrieval: {topk: 5}\n", name="ok.yaml")).index.num_shards == 2


@pytest.mark.parametrize("item,path", [
    ("retrieval.topk=abc", "retrieval.topk: Input should be a valid integer"),
    ("retrieval.topk=3.5", "retrieval.topk: Input should be a valid integer"),
    ("retrieval.topk=true", "retrieval.topk: Input should be a valid integer"),
    ("index.fp16=yes-please", "index.fp16: Input should be a valid boolean"),
    ("index.type=annoy", "index.type: Input should be 'flat', 'hnsw', 'ivf_pq' or 'bm25'"),
    ("serve.port=70000", "serve.port: Input should be less than or equal to 65535"),
    ("index.num_shards=0", "index.num_shards: Input should be greater than or equal to 1"),
    ("data.corpus_limit=0", "data.corpus_limit: Input should be greater than 0"),
])
def test_wrong_value(item, path):
    with pytest.raises(ConfigError) as e:
        load_config(None, [item])
    assert path in str(e.value)


def test_every_problem_listed(tmp_path):
    p = write(tmp_path, "retrieval: {topk: abc}\nserve: {port: 0}\nindex: {foo: 1}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    heads = sorted(pr.split(":")[0] for pr in e.value.problems)
    assert heads == ["index.foo", "retrieval.topk", "serve.port"]


def test_topk_above_max_rejected():
    with pytest.raises(ConfigError, match=r"retrieval.topk: topk \(200\) must be <= max_topk \(100\)"):
        load_config(None, ["retrieval.topk=200"])
    with pytest.raises(ConfigError, match="retrieval.topk"):
        load_config(None, ["retrieval.max_topk=2"])
    assert load_config(None, ["retrieval.topk=200", "retrieval.max_topk=200"]).retrieval.topk == 200
    r = RetrievalConfig()
    with pytest.raises(ValueError):
        r.max_topk = 1


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_syntax_error(tmp_path):
    p = write(tmp_path, "name: ok\nindex:\n  dir: [unclosed\n  num_shards: 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert f"{p}:" in str(e.value) and "YAML syntax error" in str(e.value)
    assert "retrieval" not in str(e.value)


def test_yaml_not_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_save_load_round_trip(tmp_path):
    cfg = load_config(DEFAULT_CONFIG, ["index.fp16=true", "ray.num_cpus=2", "retrieval.batch_wait_ms=1",
                                       "data.dir=/some/pack"])
    cfg = cfg.model_copy(update={"encoder": EncoderConfig.e5()})
    p = save_config(cfg, tmp_path / "sub" / "saved.yaml")
    assert p.is_file()
    assert load_config(p) == cfg


def test_e5_preset():
    e = EncoderConfig.e5()
    assert (e.model, e.query_prefix, e.passage_prefix, e.pooling, e.normalize) == (
        "intfloat/e5-base-v2", "query: ", "passage: ", "mean", True)
    assert EncoderConfig.e5("intfloat/e5-small-v2", batch_size=8).batch_size == 8


def test_make_run_dir(tmp_path):
    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", "retrieval.topk=4"])
    a = make_run_dir(cfg, "build")
    b = make_run_dir(cfg, "build")
    assert a.parent == tmp_path / "runs" and a.name.startswith("build-")
    assert a != b and b.is_dir()
    assert load_config(a / "config.yaml") == cfg
    with pytest.raises(ValueError):
        make_run_dir(cfg, "a/b")


def test_make_run_dir_collision_suffix(tmp_path, monkeypatch):
    import configs.loader as loader

    monkeypatch.setattr(loader.time, "strftime", lambda fmt: "20250101-000000")
    cfg = Config(run_dir=str(tmp_path))
    names = [make_run_dir(cfg, "x").name for _ in range(3)]
    assert names == ["x-20250101-000000", "x-20250101-000000-2", "x-20250101-000000-3"]


def test_argparse_helpers(tmp_path):
    p = write(tmp_path, "retrieval: {topk: 7}\n")
    parser = add_config_args(argparse.ArgumentParser(), default_config=str(DEFAULT_CONFIG))
    args = parser.parse_args(["--config", str(p), "index.num_shards=2"])
    cfg = config_from_args(args)
    assert cfg.retrieval.topk == 7 and cfg.index.num_shards == 2
    cfg = config_from_args(parser.parse_args([]))
    assert cfg.index.dir == "indexes/minilm-flat-4"
