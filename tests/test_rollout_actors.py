"""The rollout actors on a local Ray cluster: a RolloutWorker on the vLLM CPU build (tiny Gemma 3
with the real tokenizer) runs s3 episodes against the real RetrievalPool, its rewards come from a
FrozenLLMWorker actor (transformers fallback backend, same tiny model), and `update_weights` sent
through Ray changes what the worker generates."""

from __future__ import annotations

import gzip
import json

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def actors(ray_local, small_index, tiny_dirs):
    """(rollout worker, frozen LLM, pool); engines are shut down before the actors are killed."""
    from actors.engines.spec import EngineSpec
    from actors.frozen.worker import FrozenLLMWorker
    from actors.lifecycle import ActorSet
    from actors.retrieval.pool import start_retrieval_pool
    from actors.rollout.worker import RolloutWorker
    from configs.schema import RetrievalConfig

    started = ActorSet()
    pool = started.adopt(start_retrieval_pool(small_index, RetrievalConfig(topk=3, query_encoders=1)))
    frozen = started.start(FrozenLLMWorker, EngineSpec(backend="hf", model=tiny_dirs[0]), chat=False, num_cpus=0.5)
    spec = EngineSpec(backend="vllm", model=tiny_dirs[0], max_model_len=2048, cpu_kv_cache_gib=0.25)
    worker = started.start(RolloutWorker, spec, pool, generator=frozen, judge=frozen, num_cpus=0.5)
    started.wait_ready([worker, frozen], timeout_s=600)
    yield worker, frozen, pool
    started.stop()


def _questions(data_dir, n: int) -> list[dict]:
    with gzip.open(data_dir / "dev.jsonl.gz", "rt") as f:
        rows = [json.loads(next(f)) for _ in range(n)]
    return [{k: r.get(k) for k in ("id", "question", "golden_answers", "dataset")} for r in rows]


def _corpus_ids(data_dir, n: int = 600) -> set[str]:
    with gzip.open(data_dir / "corpus.jsonl.gz", "rt") as f:
        return {str(json.loads(next(f))["id"]) for _ in range(n)}


def test_s3_episodes_through_the_actors(ray_local, actors, data_dir, gemma_tokenizer):
    worker, frozen, _ = actors
    examples = _questions(data_dir, 2)
    trajs = ray_local.get(worker.run.remote(
        examples, "s3", n=2, sampling={"temperature": 1.0, "seed": 7},
        limits={"max_new_tokens_per_turn": 24, "max_total_tokens": 1500}, chat=False,
    ), timeout=600)
    assert len(trajs) == 4
    corpus = _corpus_ids(data_dir)
    for t, (ex, i) in zip(trajs, [(e, i) for e in examples for i in range(2)]):
        assert t["qid"] == ex["id"] and t["sample_index"] == i and t["weight_version"] == 0
        assert t["prompt_ids"][0] == gemma_tokenizer.bos_token_id
        assert len(t["response_ids"]) == len(t["loss_mask"]) == len(t["logprobs"])
        assert len(t["prompt_ids"]) + len(t["response_ids"]) <= 1500
        assert t["finish_reason"] in {"complete", "max_turns", "max_total_tokens"}
        # s3 starts from a search of the question: the initial documents come from the real pool.
        assert "Doc 1(Title:" in gemma_tokenizer.decode(t["prompt_ids"])
        for turn in t["turns"]:
            assert set(turn["doc_ids"]) <= corpus
        policy = [tok for tok, m in zip(t["response_ids"], t["loss_mask"]) if m == 1]
        assert gemma_tokenizer.decode(policy, skip_special_tokens=True) == "".join(x["text"] for x in t["turns"])
        # Gain Beyond RAG came from the frozen generator actor (a tiny random model: no gain).
        assert t["reward"] is not None and {"gen_acc_s3", "gen_acc_rag", "gain_beyond_rag"} <= set(t["reward_components"])
    stats = ray_local.get(frozen.stats.remote())
    assert stats["generated"] >= 2 and stats["cache_hits"] >= 1  # the RAG baseline: once per question


def test_update_weights_through_ray_changes_generation(ray_local, actors, data_dir, tiny_dirs):
    worker, _, _ = actors
    examples = _questions(data_dir, 1)
    kwargs = dict(sampling={"temperature": 0.0}, limits={"max_new_tokens_per_turn": 12, "max_total_tokens": 1500},
                  chat=False, compute_reward=False)

    def first_turn() -> tuple[list[int], int]:
        (t,) = ray_local.get(worker.run.remote(examples, "search_r1", **kwargs), timeout=600)
        n = t["turns"][0]["generated_tokens"]
        return t["response_ids"][:n], t["weight_version"]

    before, v0 = first_turn()
    state = load_file(f"{tiny_dirs[1]}/model.safetensors")
    assert ray_local.get(worker.update_weights.remote(list(state.items()), 1), timeout=300) == 1
    after, v1 = first_turn()
    assert (v0, v1) == (0, 1)
    assert after != before, "new weights must change the greedy generation"
