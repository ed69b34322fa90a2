"""Index-build speed path: length-sorted encoder blocks, encoder-aware resume checks, the OpenVINO backend."""

import json

import numpy as np
import pyarrow as pa
import pytest

from actors.retrieval.encoder import EncoderSpec
from actors.retrieval.index_store import IndexFormatError
from configs import load_config
from configs.dtype_choice import auto_dtype
from pipelines.build_index import _check_resume, length_sorted_blocks, param_differences
from tests.conftest import REPO_ROOT


def test_blocks_are_longest_first_and_keep_every_row():
    titles = ["a", "bbbb", "", "cc", "d", "eeeeeeee", "f"]
    texts = ["x" * n for n in (5, 1, 30, 2, 9, 0, 4)]
    table = pa.table({"row": list(range(7)), "title": titles, "text": texts})
    blocks = length_sorted_blocks(table, 3)
    assert [b.num_rows for b in blocks] == [3, 3, 1]
    merged = pa.concat_tables(blocks).to_pydict()
    lengths = [len(t) + len(x) for t, x in zip(merged["title"], merged["text"])]
    assert lengths == sorted(lengths, reverse=True)
    assert sorted(merged["row"]) == list(range(7))
    # each row still carries its own title and text
    assert all(merged["title"][i] == titles[r] and merged["text"][i] == texts[r] for i, r in enumerate(merged["row"]))


def _params(**encoder):
    return {"corpus": "c", "num_docs": 10, "index": {"type": "flat"},
            "encoder": EncoderSpec(**encoder).index_fields()}


def test_backend_is_an_index_field_and_named_when_it_differs():
    torch_build, ov_build = _params(), _params(backend="openvino", precision="bf16")
    assert torch_build["encoder"]["backend"] == "torch"
    assert param_differences(torch_build, torch_build) == []
    diff = param_differences(torch_build, ov_build)
    assert diff == ["encoder.backend ('torch' there, 'openvino' here)", "encoder.precision ('fp32' there, 'bf16' here)"]
    # a build recorded before `backend` existed was a torch build
    old = json.loads(json.dumps(torch_build))
    del old["encoder"]["backend"]
    assert param_differences(old, torch_build) == []
    assert param_differences(old, _params(backend="openvino")) == ["encoder.backend ('torch' there, 'openvino' here)"]
    assert param_differences({**torch_build, "encoder": None}, torch_build) == ["encoder"]


def test_resuming_with_another_backend_is_refused(tmp_path):
    _check_resume(tmp_path, _params())
    _check_resume(tmp_path, _params())  # same parameters: resumes
    with pytest.raises(IndexFormatError, match=r"encoder\.backend \('torch' there, 'openvino' here\)"):
        _check_resume(tmp_path, _params(backend="openvino"))


def test_cpu_config_builds_with_openvino_and_gpu_config_with_torch():
    cpu = load_config(REPO_ROOT / "configs" / "retrieval_cpu.yaml")
    gpu = load_config(REPO_ROOT / "configs" / "train_gpu.yaml")
    # precision auto: bf16 kernels where the CPU has bf16 instructions (configs.dtype_choice)
    assert (cpu.encoder.backend, cpu.encoder.precision) == ("openvino", auto_dtype(False, "fp32"))
    assert gpu.encoder.backend == "torch"
    back = load_config(REPO_ROOT / "configs" / "retrieval_cpu.yaml", ["encoder.backend=torch"])
    assert EncoderSpec.from_config(back.encoder).backend == "torch"


def test_unknown_backend_is_refused_before_loading():
    from actors.retrieval.encoder import TextEncoder

    with pytest.raises(ValueError, match="encoder.backend='onnx'"):
        TextEncoder(EncoderSpec(backend="onnx"))


@pytest.mark.slow
def test_openvino_matches_torch(tmp_path, monkeypatch):
    """Same top-1 passage for every query as torch; passages within bf16 noise; queries fp32-equal;
    the IR is exported once and reused."""
    from actors.retrieval.encoder import TextEncoder

    monkeypatch.setenv("SEARCHRL_MODEL_CACHE", str(tmp_path))
    titles = ["Hamlet", "Photosynthesis", "Paris", "Mount Everest", "Python (language)"]
    texts = ["Hamlet is a tragedy written by William Shakespeare around 1600.",
             "Plants turn light, water and carbon dioxide into sugar and oxygen.",
             "Paris is the capital and largest city of France, on the Seine.",
             "Everest is Earth's highest mountain above sea level, in the Himalayas.",
             "Python is a programming language created by Guido van Rossum."]
    queries = ["who wrote hamlet", "how do plants make food", "capital of france", "tallest mountain", "who created python"]
    ref = TextEncoder(EncoderSpec(), threads=2)
    ov = TextEncoder(EncoderSpec(backend="openvino", precision="bf16", batch_size=2), threads=2)
    p_ref, p_ov = ref.encode_passages(titles, texts), ov.encode_passages(titles, texts)
    q_ref, q_ov = ref.encode_queries(queries), ov.encode_queries(queries)
    assert p_ov.shape == (5, 384) and p_ov.dtype == np.float32
    assert float((p_ref * p_ov).sum(axis=1).min()) > 0.999
    np.testing.assert_allclose(q_ov, q_ref, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(p_ov, axis=1), 1.0, atol=1e-5)
    assert list((q_ov @ p_ov.T).argmax(axis=1)) == list((q_ref @ p_ref.T).argmax(axis=1)) == [0, 1, 2, 3, 4]
    from configs.cpu_features import host_cpu  # bf16 asked for: f32 kernels where bf16 is not native

    assert ov._ov["bf16"].precision == ("bf16" if host_cpu().native_bf16 else "fp32")
    exported = list((tmp_path / "openvino").iterdir())
    assert len(exported) == 1 and (exported[0] / "model.xml").is_file()
    again = TextEncoder(EncoderSpec(backend="openvino"), threads=1)
    assert list((tmp_path / "openvino").iterdir()) == exported  # reused, not exported again
    np.testing.assert_allclose(again.encode_queries(queries), q_ov, atol=1e-5)


@pytest.mark.slow
def test_cpu_index_records_its_backend_and_refuses_another(small_index):
    """The CPU config's index (conftest's `small_index`, built through Ray Data) records openvino;
    rebuilding it with torch names the field."""
    from actors.retrieval.index_store import Manifest
    from pipelines.build_index import build_index

    assert Manifest.load(small_index).encoder["backend"] == "openvino"
    cfg = load_config(REPO_ROOT / "configs" / "retrieval_cpu.yaml",
                      ["data.corpus_limit=600", "index.num_shards=2", f"index.dir={small_index}", "encoder.backend=torch"])
    with pytest.raises(IndexFormatError, match=r"encoder\.backend \('openvino' there, 'torch' here\)"):
        build_index(cfg, progress=False)
