"""Learners: chunked token statistics, the padded batch layout, and DeepSpeed updates run by Ray
actors (gloo on CPU): GRPO and PPO steps move log-probs the way the advantages say, 2 ranks equal
1 rank under ZeRO-2, weights synced to a vLLM rollout worker give the learner's log-probs, and a
checkpoint resumes to identical next-step losses."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest
import torch

from actors.learner.batch import make_train_batch
from actors.learner.token_stats import PolicyTokenStats
from algorithms import AlgorithmConfig, gae, grpo_advantages, terminal_rewards
from configs.cpu_features import host_cpu


def synthetic_trajectories(n: int = 4, seed: int = 0) -> list[dict]:
    """Token-level trajectories with an observation span in the middle of every response."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = [2] + torch.randint(10, 5000, (4 + i,), generator=g).tolist()
        response = torch.randint(10, 5000, (9 + i,), generator=g).tolist()
        mask = [1, 1, 1, 0, 0, 0, 1, 1, 1] + [1] * i
        out.append({"prompt_ids": prompt, "response_ids": response, "loss_mask": mask,
                    "logprobs": [-1.0 if m else 0.0 for m in mask], "group_id": f"q{i // 2}"})
    return out


# -- no DeepSpeed ------------------------------------------------------------------------------------------


def test_train_batch_layout_and_trimming():
    trajs = synthetic_trajectories(3)
    b = make_train_batch(trajs, pad_token_id=0)
    P, R = b.prompt_len, b.response_len
    assert (P, R) == (7, 11) and b.input_ids.shape == (3, 18)
    for i, t in enumerate(trajs):
        p, n = len(t["prompt_ids"]), len(t["response_ids"])
        assert b.input_ids[i, P - p : P].tolist() == t["prompt_ids"]  # left-padded prompt
        assert b.input_ids[i, P : P + n].tolist() == t["response_ids"]  # right-padded response
        assert b.attention_mask[i].sum() == p + n and b.loss_mask[i, :n].tolist() == t["loss_mask"]
        assert b.position_ids[i, P - p] == 0 and b.position_ids[i, P + n - 1] == p + n - 1
    small = b.select([0])  # the shortest row: padding columns trimmed on both sides
    assert small.input_ids.tolist()[0] == trajs[0]["prompt_ids"] + trajs[0]["response_ids"]
    assert small.prompt_len == 5 and small.response_len == 9
    with pytest.raises(ValueError, match="lengths"):
        make_train_batch([{**trajs[0], "logprobs": [0.0]}], 0)
    with pytest.raises(ValueError, match=r"\[B, R\]"):
        b.with_fields(advantages=torch.zeros(3, 2))
    # The engine's log-probs stay as the behaviour policy's when the learner's replace `old_logprobs`.
    assert torch.equal(b.behaviour_logprobs, -b.loss_mask)
    kept = b.with_fields(old_logprobs=None).select([0])
    assert kept.old_logprobs is None and kept.behaviour_logprobs.tolist() == [[-1.0 if m else 0.0
                                                                              for m in trajs[0]["loss_mask"]]]


def test_chunked_token_stats_equal_full_logits(tiny_gemma_dir):
    """Chunked, masked log-probs/entropies (and their gradients) equal the full-vocabulary computation."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_gemma_dir, dtype=torch.float32)
    b = make_train_batch(synthetic_trajectories(3), pad_token_id=0)
    stats = PolicyTokenStats(lm, chunk_tokens=4, temperature=0.7)
    lp, ent = stats(b.input_ids, b.attention_mask, b.loss_mask, b.prompt_len)
    (lp.sum() + ent.sum()).backward()
    grad_chunked = lm.model.embed_tokens.weight.grad.clone()
    lm.zero_grad()

    logits = lm(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids).logits.float()
    logits = logits[:, b.prompt_len - 1 : -1] / 0.7
    full = torch.log_softmax(logits, -1)
    want_lp = full.gather(-1, b.input_ids[:, b.prompt_len :].unsqueeze(-1)).squeeze(-1) * b.loss_mask
    want_ent = -(full.exp() * full).sum(-1) * b.loss_mask
    (want_lp.sum() + want_ent.sum()).backward()
    assert torch.allclose(lp, want_lp, atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-4)
    assert (lp[b.loss_mask == 0] == 0).all()
    with torch.no_grad():  # left padding changes nothing: each row alone (no padding) gives the same values
        for i in range(b.size):
            row = b.select([i])
            alone, _ = stats(row.input_ids, row.attention_mask, row.loss_mask, row.prompt_len)
            assert torch.allclose(alone[0], lp[i, : row.response_len].detach(), atol=1e-4), i
    want_grad = lm.model.embed_tokens.weight.grad
    assert (grad_chunked - want_grad).abs().max() <= 1e-4 * want_grad.abs().max()


# -- DeepSpeed learners as Ray actors ------------------------------------------------------------------------


def learner_config(model: str, **over) -> dict:
    cfg = dict(model=model, dtype="fp32", zero_stage=2, lr=1e-3, critic_lr=1e-3, weight_decay=0.0,
               mini_batch_size=4, micro_batch_size=2, logprob_chunk_tokens=8, cpus_per_rank=0.5,
               gradient_checkpointing=True)
    cfg.update(over)
    return cfg


@pytest.fixture(autouse=True, scope="module")
def _clean_deepspeed_shm():
    """DeepSpeed's CPU all-reduce leaves /dev/shm buffers if a rank dies; none may outlive the tests."""
    before = set(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*"))
    yield
    left = set(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*")) - before
    for f in left:
        os.unlink(f)
    assert not left, f"learner shutdown left DeepSpeed /dev/shm buffers: {sorted(left)}"


def with_grpo(group, batch, rewards):
    logprobs, _ = group.compute_logprobs(batch)
    adv = grpo_advantages(torch.tensor(rewards), batch.group_ids, batch.loss_mask)
    return batch.with_fields(old_logprobs=logprobs, advantages=adv), adv


def mean_logprob_change(before, after, mask):
    return ((after - before) * mask).sum(1) / mask.sum(1)


@pytest.fixture(scope="module", params=["tiny", pytest.param("gemma3-270m", marks=pytest.mark.heavy)])
def policy_case(request, tiny_gemma_dir, gemma_dir, data_dir):
    """(learner config, batch): the tiny model on synthetic tokens, and the Gemma 3 270M policy on
    real text (Search-R1 prompts of dev questions, responses of policy text and retrieved passages)."""
    if request.param == "tiny":
        return learner_config(tiny_gemma_dir), make_train_batch(synthetic_trajectories(4), pad_token_id=0)
    from transformers import AutoTokenizer

    from configs import Config
    from scripts.bench.learner import real_text_trajectories

    trajs = real_text_trajectories(Config(), AutoTokenizer.from_pretrained(gemma_dir), seqs=4, response_tokens=96)
    return learner_config(gemma_dir, lr=1e-5, critic_lr=1e-5, logprob_chunk_tokens=128), make_train_batch(trajs, 0)


def test_grpo_and_ppo_steps_follow_the_advantages(ray_local, policy_case):
    from actors.learner.group import LearnerGroup
    from actors.learner.reference import ReferenceModel
    from actors.lifecycle import ActorSet

    cfg, batch = policy_case
    policy = LearnerGroup("policy", cfg)
    critic = LearnerGroup("critic", cfg)
    started = ActorSet()
    ref_actor = started.start(ReferenceModel, cfg, num_cpus=0.25, max_concurrency=None)
    try:
        ref = ray_local.get(ref_actor.compute_logprobs.remote(batch))
        batch, adv = with_grpo(policy, batch, [1.0, 0.0, 0.0, 1.0])
        assert torch.allclose(batch.old_logprobs, ref, atol=1e-4)  # same starting weights
        m = policy.update(batch.with_fields(ref_logprobs=ref), AlgorithmConfig(kl_coef=0.001))
        assert m["optimizer_steps"] == 1 and m["grad_norm"] > 0 and m["lr"] == pytest.approx(cfg["lr"])
        assert m["tokens"] == batch.num_policy_tokens()
        assert m["sequence_tokens"] == int(batch.attention_mask.sum())  # every real token, once per epoch
        after, _ = policy.compute_logprobs(batch)
        change = mean_logprob_change(batch.old_logprobs, after, batch.loss_mask)
        assert (change[adv[:, 0] > 0] > 0).all() and (change[adv[:, 0] < 0] < 0).all(), change
        masked_kl = ((after - ref) * batch.loss_mask).abs().sum()
        assert masked_kl > 0 and (after[batch.loss_mask == 0] == 0).all()

        # PPO: critic values → GAE (returns reach tokens before the observation span) → both updates.
        values = critic.compute_values(batch)
        rewards = terminal_rewards(torch.tensor([0.0, 1.0, 1.0, 0.0]), batch.loss_mask)
        advantages, returns = gae(rewards, values, batch.loss_mask, gamma=1.0, lam=0.95)
        ppo = batch.with_fields(advantages=advantages, returns=returns, old_values=values,
                                old_logprobs=after, ref_logprobs=ref)
        algo = AlgorithmConfig(advantage_estimator="gae", lam=0.95, kl_coef=0.0)
        first = critic.update(ppo, algo)
        second = critic.update(ppo, algo)
        assert second["value_loss"] < first["value_loss"]
        policy.update(ppo, algo)
        final, _ = policy.compute_logprobs(batch)
        change = mean_logprob_change(after, final, batch.loss_mask)
        sign = torch.sign((advantages * batch.loss_mask).sum(1))
        assert (change * sign > 0).all(), (change, sign)
    finally:
        policy.shutdown()
        critic.shutdown()
        started.stop()


def test_one_step_update_reads_old_logprobs_from_its_own_forward(ray_local, tiny_gemma_dir):
    """With one optimizer step per update (`single_step`), an update without `old_logprobs` equals
    the update after a separate log-prob pass (the pass the trainer now skips); with two mini-batches
    a missing `old_logprobs` is an error."""
    from actors.learner.group import LearnerGroup

    batch = make_train_batch(synthetic_trajectories(4), pad_token_id=0)
    after, before = [], None
    for skip in (False, True):
        group = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0))
        try:
            b = batch.with_fields(old_logprobs=None) if skip else with_grpo(group, batch, [1.0, 0.0, 0.0, 1.0])[0]
            before = b.old_logprobs if before is None else before
            adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), batch.group_ids, batch.loss_mask)
            m = group.update(b.with_fields(advantages=adv), AlgorithmConfig(kl_coef=0.0))
            assert m["optimizer_steps"] == 1 and m["clip_frac"] == 0.0, (skip, m)
            after.append(group.compute_logprobs(batch)[0])
        finally:
            group.shutdown()
    assert ((after[0] - before) * batch.loss_mask).abs().sum() > 0  # the update moved the policy
    assert torch.allclose(after[0], after[1], atol=1e-5), (after[0] - after[1]).abs().max()
    two_steps = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0, mini_batch_size=2, micro_batch_size=1))
    try:
        adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), batch.group_ids, batch.loss_mask)
        with pytest.raises(Exception, match="old_logprobs is None"):
            two_steps.update(batch.with_fields(advantages=adv, old_logprobs=None), AlgorithmConfig(kl_coef=0.0))
    finally:
        two_steps.shutdown()


def test_off_policy_correction_weights_the_update(ray_local, tiny_gemma_dir):
    """The update weighs each token by pi_prox / mu (`algorithm.off_policy_correction`): engine log-probs
    far below the learner's put every token over the cap, so decoupled PPO drops them all (the policy
    does not move) and TIS caps them (it moves, as much as with weights 2)."""
    from actors.learner.group import LearnerGroup

    batch = make_train_batch(synthetic_trajectories(4), pad_token_id=0)
    behaviour = batch.behaviour_logprobs * 0 - 40.0 * batch.loss_mask  # mu(a) = e^-40: w far over any cap
    moved = {}
    for correction in ("none", "decoupled", "tis"):
        group = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0))
        try:
            b, _ = with_grpo(group, batch, [1.0, 0.0, 0.0, 1.0])
            m = group.update(b.with_fields(behaviour_logprobs=behaviour), AlgorithmConfig(
                kl_coef=0.0, off_policy_correction=correction, is_cap=2.0))
            moved[correction] = float(((group.compute_logprobs(batch)[0] - b.old_logprobs) * batch.loss_mask).abs().sum())
            if correction != "none":
                assert m["is_truncated_frac"] == 1.0 and m["is_weight_max"] > 1e8, m  # exp(20): the clamp
            else:
                assert "is_weight_mean" not in m
        finally:
            group.shutdown()
    assert moved["decoupled"] == 0.0 and moved["none"] > 0 and moved["tis"] > 0, moved


def test_zero2_two_ranks_equal_one_rank(ray_local, tiny_gemma_dir):
    from actors.learner.group import LEARNER_CACHE_VARS, LEARNER_ONEDNN_CACHE, LearnerGroup

    batch = make_train_batch(synthetic_trajectories(4, seed=1), pad_token_id=0)
    weights = {}
    for ranks in (1, 2):
        group = LearnerGroup("policy", learner_config(tiny_gemma_dir, num_ranks=ranks, shuffle=False))
        try:
            assert group.world_size == ranks
            maps = ray_local.get([a.__ray_call__.remote(lambda self: open("/proc/self/maps").read())
                                  for a in group.actors])
            assert all("libjemalloc.so" in m for m in maps), "CPU ranks start with jemalloc (rank_runtime_env)"
            caches = ray_local.get([a.__ray_call__.remote(lambda self: [os.environ.get(v) for v in LEARNER_CACHE_VARS])
                                    for a in group.actors])
            assert caches == [[os.environ.get(v, LEARNER_ONEDNN_CACHE) for v in LEARNER_CACHE_VARS]] * ranks
            b, _ = with_grpo(group, batch, [1.0, 0.0, 0.5, 0.0])
            group.update(b, AlgorithmConfig(kl_coef=0.0))
            weights[ranks] = dict(ray_local.get(group.actors[0].named_weights.remote("fp32")))
        finally:
            group.shutdown()
    assert weights[1].keys() == weights[2].keys()
    diff = max((weights[1][k] - weights[2][k]).abs().max().item() for k in weights[1])
    # fp32 sums differ in order between 1 rank (accumulated micro-batches) and 2 (all-reduce), and by CPU
    # kernel: 1.09e-5 on one machine kind, under 1e-5 on another (the same code). A wrong split or loss
    # normalisation moves weights by the order of one Adam step (lr = 1e-3).
    assert diff < 5e-5, f"ZeRO-2 with 2 ranks differs from 1 rank by {diff}"


def test_weight_sync_gives_the_rollout_engine_the_learner_logprobs(ray_local, tiny_gemma_dir, small_index, data_dir):
    from actors.engines.spec import EngineSpec
    from actors.learner.group import LearnerGroup
    from actors.lifecycle import ActorSet
    from actors.retrieval.pool import start_retrieval_pool
    from actors.rollout.worker import RolloutWorker
    from configs.schema import RetrievalConfig

    started = ActorSet()
    pool = started.adopt(start_retrieval_pool(small_index, RetrievalConfig(topk=2, query_encoders=1)))
    spec = EngineSpec(backend="vllm", model=tiny_gemma_dir, max_model_len=1024, cpu_kv_cache_gib=0.25, dtype="float32")
    worker = started.start(RolloutWorker, spec, pool, num_cpus=0.25)
    group = LearnerGroup("policy", learner_config(tiny_gemma_dir, sync_dtype="fp32"))
    examples = [{"id": "1", "question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"], "dataset": "nq"}]
    run_kwargs = dict(n=4, sampling={"temperature": 1.0, "seed": 3}, limits={"max_new_tokens_per_turn": 8,
                      "max_total_tokens": 600}, chat=False, compute_reward=False)
    try:
        trajs = ray_local.get(worker.run.remote(examples, "search_r1", **run_kwargs), timeout=900)
        batch = make_train_batch(trajs, pad_token_id=0)
        batch, _ = with_grpo(group, batch, [1.0, 0.0, 1.0, 0.0])
        # The engine's sampling log-probs are the learner's (before any update).
        assert torch.allclose(batch.old_logprobs, make_train_batch(trajs, 0).old_logprobs, atol=2e-3)
        group.update(batch, AlgorithmConfig(kl_coef=0.0))
        sync = group.sync_weights([worker], version=1)
        assert sync["sync_s"] > 0 and sync["sync_bytes"] > 4 * 16_000_000
        new = ray_local.get(worker.run.remote(examples, "search_r1", **run_kwargs), timeout=900)
        assert all(t["weight_version"] == 1 for t in new)
        assert [t["response_ids"] for t in new] != [t["response_ids"] for t in trajs]
        new_batch = make_train_batch(new, pad_token_id=0)
        learner_lp, _ = group.compute_logprobs(new_batch)
        assert torch.allclose(learner_lp, new_batch.old_logprobs, atol=2e-3)
    finally:
        group.shutdown()
        started.stop()


def test_checkpoint_resume_gives_identical_next_step(ray_local, tiny_gemma_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from actors.learner.group import LearnerGroup

    cfg = learner_config(tiny_gemma_dir, zero_stage=1, warmup_ratio=0.75)  # 3 of 4 training steps
    b1 = make_train_batch(synthetic_trajectories(4, seed=2), pad_token_id=0)
    b2 = make_train_batch(synthetic_trajectories(4, seed=3), pad_token_id=0)
    group = LearnerGroup("policy", cfg, total_steps=4)
    try:
        step1, _ = with_grpo(group, b1, [1.0, 0.0, 0.0, 1.0])
        group.update(step1, AlgorithmConfig(kl_coef=0.0))
        folder = group.save_checkpoint(str(tmp_path / "step-1"))
        step2, _ = with_grpo(group, b2, [0.0, 1.0, 1.0, 0.0])
        expected = group.update(step2, AlgorithmConfig(kl_coef=0.0))
        expected_w = dict(ray_local.get(group.actors[0].named_weights.remote("fp32")))
    finally:
        group.shutdown()
    saved = AutoModelForCausalLM.from_pretrained(f"{folder}/hf", dtype=torch.float32)
    assert saved.config.model_type == "gemma3_text"
    resumed = LearnerGroup("policy", cfg, total_steps=4)
    try:
        resumed.load_checkpoint(str(tmp_path / "step-1"))
        got = resumed.update(step2, AlgorithmConfig(kl_coef=0.0))  # same old log-probs and advantages
        got_w = dict(ray_local.get(resumed.actors[0].named_weights.remote("fp32")))
    finally:
        resumed.shutdown()
    for key in ("policy_loss", "clip_frac", "grad_norm", "lr", "entropy"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    assert max((got_w[k] - expected_w[k]).abs().max().item() for k in got_w) < 1e-6


def test_update_flops_counts_decoder_on_all_tokens_and_head_on_policy_tokens(tiny_gemma_dir):
    from transformers import AutoModelForCausalLM

    from actors.learner.flops import decoder_param_count, update_flops

    lm = AutoModelForCausalLM.from_pretrained(tiny_gemma_dir, dtype=torch.float32)
    n = decoder_param_count(lm)
    embed = lm.get_input_embeddings().weight.numel()
    assert 0 < n == sum(p.numel() for p in lm.parameters()) - embed  # tied head: counted once, skipped
    assert update_flops(n, 64, 1000, tokens=10, policy_tokens=4) == 6 * (n * 10 + 64 * 1000 * 4)
    assert update_flops(n, 64, 1000, 10, 4, backward=False) == 2 * (n * 10 + 64 * 1000 * 4)
    with pytest.raises(ValueError):
        update_flops(-1, 64, 1000, 10, 4)


@pytest.mark.heavy
def test_bench_learner_prints_mfu_before_and_after(ray_local, tiny_gemma_dir, tmp_path, capsys):
    """`scripts.bench.learner` times both ways of a step in one run and prints their MFU ratio."""
    from scripts.bench import learner as bench_learner

    out = tmp_path / "bench.json"
    bench_learner.main(["--seqs", "4", "--response-tokens", "32", "--ranks", "1", "--steps", "1", "--no-sync",
                        "--out", str(out), f"learner.model={tiny_gemma_dir}", "learner.mini_batch_size=4",
                        "learner.cpus_per_rank=0.5"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(kv.split("=") for kv in line.split(": ", 1)[1].split())
    assert float(fields["mfu_1rank"]) > 0 and float(fields["mfu_before_1rank"]) > 0
    assert float(fields["ratio_1rank"]) == pytest.approx(float(fields["mfu_1rank"]) / float(fields["mfu_before_1rank"]),
                                                          rel=0.05)
    result = json.loads(out.read_text())["results"][0]
    assert set(result["step_s"]) == {"recompute", "one_pass"} and result["policy_tokens"] > 0


def test_frozen_embeddings_stay_fixed_while_the_update_moves_the_policy(ray_local, tiny_gemma_dir, tmp_path):
    """`freeze_embeddings`: the GRPO update still moves the policy's log-probs, and the saved model's
    embedding matrix (tied to the LM head) is the starting one, bit for bit."""
    from safetensors.torch import load_file

    from actors.learner.group import LearnerGroup

    batch = make_train_batch(synthetic_trajectories(4), pad_token_id=0)
    group = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0, freeze_embeddings=True))
    try:
        b, _ = with_grpo(group, batch, [1.0, 0.0, 0.0, 1.0])
        m = group.update(b, AlgorithmConfig(kl_coef=0.0))
        after, _ = group.compute_logprobs(batch)
        assert m["grad_norm"] > 0 and ((after - b.old_logprobs) * batch.loss_mask).abs().sum() > 0
        saved = Path(group.save_checkpoint(str(tmp_path / "ckpt")))
        # The weight sync leaves the frozen matrix out (the engines hold it from the start); the checkpoint has it.
        synced = [n for n, _ in ray_local.get(group.actors[0].named_weights.remote("bf16"))]
        assert synced and not any("embed_tokens" in n for n in synced)
    finally:
        group.shutdown()
    name = "model.embed_tokens.weight"
    start = {k: v for f in Path(tiny_gemma_dir).glob("*.safetensors") for k, v in load_file(f).items()}
    trained = {k: v for f in saved.rglob("*.safetensors") for k, v in load_file(f).items()}
    key = next(k for k in trained if k.endswith(name))
    assert torch.equal(trained[key].float(), next(v for k, v in start.items() if k.endswith(name)).float())


def test_packed_update_with_skipped_groups_moves_the_policy_as_the_plain_update(ray_local, tiny_gemma_dir):
    """The update with shared-prefix packing and `skip_zero_advantage` moves the log-probs as the
    unpacked update of every row does (a group of equal rewards has zero advantages, so leaving it out
    changes only the loss normaliser, which Adam's first step does not see); packed, the forward passes
    run over each prompt once; a batch of nothing but such groups takes no optimizer step."""
    from actors.learner.group import LearnerGroup

    trajs = synthetic_trajectories(8, seed=2)
    for i, t in enumerate(trajs):  # pairs share their prompt, as a GRPO group's samples do
        t["prompt_ids"] = trajs[i - i % 2]["prompt_ids"]
    batch = make_train_batch(trajs, pad_token_id=0)
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 1.0, 0.0]  # group q2: equal rewards
    after, metrics = {}, {}
    for packed in (False, True):
        group = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0, mini_batch_size=8,
                                                      micro_batch_size=4, shared_prefix=packed))
        try:
            b, _ = with_grpo(group, batch, rewards)
            metrics[packed] = group.update(b, AlgorithmConfig(kl_coef=0.0, skip_zero_advantage=packed))
            after[packed] = group.compute_logprobs(batch)[0]
            if packed:
                none = group.update(b.with_fields(advantages=b.advantages * 0), AlgorithmConfig(
                    kl_coef=0.0, skip_zero_advantage=True))
                assert none["optimizer_steps"] == 0 and none["skipped_groups"] == 4
                assert torch.equal(group.compute_logprobs(batch)[0], after[packed])  # nothing moved
        finally:
            group.shutdown()
    moved = ((after[False] - b.old_logprobs) * batch.loss_mask).abs().sum()
    apart = ((after[False] - after[True]) * batch.loss_mask).abs().sum()
    assert moved > 0 and apart < 0.02 * moved, (float(apart), float(moved))
    assert metrics[True]["skipped_groups"] == 1 and "skipped_groups" not in metrics[False]
    kept = [i for i in range(8) if i not in (4, 5)]
    prompts = sum(len(trajs[i]["prompt_ids"]) for i in kept[::2])
    assert metrics[True]["sequence_tokens"] == prompts + sum(len(trajs[i]["response_ids"]) for i in kept)
    assert metrics[False]["sequence_tokens"] == int(batch.attention_mask.sum())
    assert metrics[True]["tokens"] == int(batch.loss_mask[kept].sum())


def test_an_update_whose_groups_are_all_left_out_needs_no_old_logprobs(ray_local, tiny_gemma_dir):
    """Seen in a run (8 questions x 8 samples, mini-batches of 32): a step whose groups all scored alike crashed,
    because the trainer passes no old log-probs for rows it does not train and the learner asked for them as
    for any update of more than one mini-batch. Such an update takes no step; one that trains a group still
    needs them."""
    from actors.learner.group import LearnerGroup

    batch = make_train_batch(synthetic_trajectories(8, seed=3), pad_token_id=0)  # 4 groups of 2, 2 mini-batches
    batch = batch.with_fields(old_logprobs=None)  # as the trainer leaves them for rows it does not train
    group = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0))
    try:
        before = group.compute_logprobs(batch)[0]
        alike = batch.with_fields(advantages=grpo_advantages(torch.ones(8), batch.group_ids, batch.loss_mask))
        m = group.update(alike, AlgorithmConfig(kl_coef=0.0, skip_zero_advantage=True))
        assert m["optimizer_steps"] == 0 and m["skipped_groups"] == 4
        assert torch.equal(group.compute_logprobs(batch)[0], before)
        one = batch.with_fields(advantages=grpo_advantages(torch.tensor([1.0, 0, 1, 1, 1, 1, 1, 1]),
                                                           batch.group_ids, batch.loss_mask))
        with pytest.raises(Exception, match="old_logprobs is None"):
            group.update(one, AlgorithmConfig(kl_coef=0.0, skip_zero_advantage=True))
    finally:
        group.shutdown()


def test_skipped_groups_with_kl_and_entropy_terms_train_as_the_kept_groups_alone(ray_local, tiny_gemma_dir):
    """With a KL and an entropy loss term, `skip_zero_advantage` (packed) moves the policy as the plain
    unpacked update of the kept groups alone does: the terms apply to the kept groups, a skipped group adds
    nothing (without the filter the terms would move its rows too)."""
    from actors.learner.group import LearnerGroup

    trajs = synthetic_trajectories(8, seed=5)
    for i, t in enumerate(trajs):  # pairs share their prompt, as a GRPO group's samples do
        t["prompt_ids"] = trajs[i - i % 2]["prompt_ids"]
    batch = make_train_batch(trajs, pad_token_id=0)
    rewards = [1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0, 1.0]  # group q1: equal rewards, skipped
    kept = [0, 1, 4, 5, 6, 7]
    algo = dict(kl_coef=0.5, entropy_coef=0.05)
    after = {}
    for variant in ("skip", "kept_only"):
        skip = variant == "skip"
        group = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0, mini_batch_size=8 if skip else 6,
                                                      micro_batch_size=2, shared_prefix=skip))
        try:
            full, _ = with_grpo(group, batch, rewards)
            full = full.with_fields(ref_logprobs=full.old_logprobs - 0.3 * full.loss_mask)  # a distant reference
            m = group.update(full if skip else full.select(kept), AlgorithmConfig(skip_zero_advantage=skip, **algo))
            assert m["optimizer_steps"] == 1 and m.get("skipped_groups", 1.0) == 1.0
            after[variant] = group.compute_logprobs(batch)[0][kept]
            before = full.old_logprobs[kept]
        finally:
            group.shutdown()
    mask = batch.loss_mask[kept]
    moved = ((after["kept_only"] - before) * mask).abs().sum()
    apart = ((after["skip"] - after["kept_only"]) * mask).abs().sum()
    assert moved > 0 and apart < 0.02 * moved, (float(apart), float(moved))


def test_token_sized_micro_batches_take_the_same_step(ray_local, tiny_gemma_dir):
    """`learner.micro_batch_tokens` cuts the mini-batch into passes by tokens; one optimizer step
    over them moves the policy as the passes of `micro_batch_size` sequences do (the loss is scaled per
    pass by its share of the mini-batch's tokens, whatever the cut), with `gradient_checkpointing: auto`
    (no recomputation for passes this small) as with it always on."""
    from actors.learner.group import LearnerGroup

    trajs = synthetic_trajectories(8, seed=4)
    batch = make_train_batch(trajs, pad_token_id=0)
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.0]
    after, passes = {}, {}
    for tokens in (None, 40):
        group = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0, mini_batch_size=8,
                                                      micro_batch_size=4, micro_batch_tokens=tokens,
                                                      gradient_checkpointing="auto" if tokens else True))
        try:
            b, _ = with_grpo(group, batch, rewards)
            passes[tokens] = group.update(b, AlgorithmConfig(kl_coef=0.0))
            after[tokens] = group.compute_logprobs(batch)[0]
        finally:
            group.shutdown()
    moved = ((after[None] - b.old_logprobs) * batch.loss_mask).abs().sum()
    apart = ((after[None] - after[40]) * batch.loss_mask).abs().sum()
    assert moved > 0 and apart < 1e-3 * moved, (float(apart), float(moved))
    assert passes[40]["optimizer_steps"] == passes[None]["optimizer_steps"] == 1


@pytest.mark.slow
# heavy: "main" runs the script path in CI; the other shapes only change its batch (docs/test-suite.md)
@pytest.mark.parametrize("shape", ["main", pytest.param("multi_turn", marks=pytest.mark.heavy),
                                   pytest.param("random", marks=pytest.mark.heavy)])
def test_bench_learner_local_runs_without_ray(tiny_gemma_dir, data_dir, tmp_path, capsys, shape):
    """`scripts.bench.learner --local`: one PolicyLearner in a process of its own per setting, no Ray
    (what a bare GPU machine runs); packed, the forward passes run over each shared prompt once."""
    from scripts.bench import learner as bench_learner

    out = tmp_path / "local.json"
    bench_learner.main(["--local", "--shape", shape, "--questions", "2", "--group", "3", "--steps", "1",
                        "--response-tokens", "48", "--setting", "learner.shared_prefix=false", "--setting", "",
                        "--out", str(out), f"learner.model={tiny_gemma_dir}", f"data.dir={data_dir}",
                        "learner.micro_batch_size=3", "learner.dtype=fp32", "learner.shuffle=false"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    cpu = host_cpu()  # the line names the CPU's instruction sets
    where = f"cpu {'+'.join(cpu.isa_names()) or 'no-AVX2'}" + ("" if cpu.native_bf16 else " (bf16 emulated)")
    assert line.startswith(f"learner local ({tiny_gemma_dir}, {shape}, 2x3, {where}): learner.shared_prefix=false: "
                           "dtype=fp32 update_s=") and "; config: dtype=fp32 update_s=" in line and " speedup=" in line
    summary = json.loads(out.read_text())
    off, on = summary["results"]["learner.shared_prefix=false"], summary["results"]["config"]
    assert off["sequence_tokens"] == summary["unpacked_tokens"] and summary["sequences"] == 6
    assert on["sequence_tokens"] < off["sequence_tokens"] and on["policy_tokens"] == off["policy_tokens"] > 0
    # The same micro-batches (no shuffle): the same loss, computed packed and unpacked.
    assert on["mfu"] > 0 and on["peak_bytes"] > 0 and on["loss"][0] == pytest.approx(off["loss"][0], abs=1e-4)


def test_lora_policy_trains_its_adapters_and_hands_out_merged_weights(ray_local, tiny_gemma_dir, tmp_path):
    """`learner.lora`: the update moves the policy through its adapters alone; the weights synced
    to the engines are whole decoder layers, merged; the checkpoint's policy/hf is a plain Hugging Face
    model that gives the learner's log-probs, and policy/adapter loads with peft over the base model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from actors.learner.group import LearnerGroup

    batch = make_train_batch(synthetic_trajectories(4), pad_token_id=0)
    group = LearnerGroup("policy", learner_config(tiny_gemma_dir, zero_stage=0, lr=1e-2,
                                                  lora={"rank": 4, "alpha": 8}))
    try:
        b, _ = with_grpo(group, batch, [1.0, 0.0, 0.0, 1.0])
        m = group.update(b, AlgorithmConfig(kl_coef=0.0))
        after, _ = group.compute_logprobs(batch)
        assert m["grad_norm"] > 0 and ((after - b.old_logprobs) * batch.loss_mask).abs().sum() > 0
        synced = dict(ray_local.get(group.actors[0].named_weights.remote("fp32")))
        folder = Path(group.save_checkpoint(str(tmp_path / "ckpt")))
    finally:
        group.shutdown()
    assert synced and all(n.startswith("model.layers.") and "lora" not in n and "base_layer" not in n for n in synced)
    assert any(n.endswith("input_layernorm.weight") for n in synced)  # whole layers: vLLM reloads layer by layer
    merged = AutoModelForCausalLM.from_pretrained(str(folder / "hf"), dtype=torch.float32)
    stats = PolicyTokenStats(merged, chunk_tokens=8)
    with torch.no_grad():
        lp, _ = stats(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_len)
    assert torch.allclose(lp, after, atol=1e-4), (lp - after).abs().max()
    for name, t in synced.items():
        assert torch.equal(t, dict(merged.named_parameters())[name].detach()), name
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_gemma_dir, dtype=torch.float32),
                                        str(folder / "adapter"))
    with torch.no_grad():
        lp2, _ = PolicyTokenStats(adapted.base_model.model, chunk_tokens=8)(
            batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_len)
    assert torch.allclose(lp2, after, atol=1e-4)
