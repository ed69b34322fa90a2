"""Shared-prefix packing: packed and unpacked forward passes agree on log-probs, entropies,
values and every parameter's gradient, on tiny random models of the real architectures.

The batches have what real ones have: groups of unequal response lengths, observations inside a
response (loss mask 0), left-padded prompts of different lengths, a prompt longer than the sliding
window, and a row whose prompt no other row shares.
"""

from __future__ import annotations

import pytest
import torch

from actors.learner.batch import make_train_batch
from actors.learner.packing import decoder_masks, pack_shared_prefix, supports_shared_prefix
from actors.learner.token_stats import PolicyTokenStats, ValueModel

VOCAB, WINDOW = 512, 8


def _tiny(arch: str, attn: str = "sdpa"):
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0)
    if arch == "gemma3":  # layers 0-2 sliding, 3 full (Gemma 3's 5:1 pattern, shortened)
        cfg = Gemma3TextConfig(**common, num_hidden_layers=4, sliding_window=WINDOW, sliding_window_pattern=4,
                               final_logit_softcapping=30.0)
        model = Gemma3ForCausalLM(cfg)
    elif arch == "qwen2":  # Qwen2.5 with sliding-window layers above the first (use_sliding_window)
        cfg = Qwen2Config(**common, num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW,
                          max_window_layers=1)
        model = Qwen2ForCausalLM(cfg)
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, num_hidden_layers=2))
    model.config._attn_implementation = attn
    return model.float().eval()


def _trajectories() -> list[dict]:
    """Two groups (prompts of 13 and 5 tokens; 13 > WINDOW) and a lone row, responses of 1-9 tokens,
    one of them multi-turn with a 3-token observation inside."""
    g = torch.Generator().manual_seed(1)

    def toks(n: int) -> list[int]:
        return torch.randint(1, VOCAB, (n,), generator=g).tolist()

    long_prompt, short_prompt = toks(13), toks(5)
    rows = []
    for i, n in enumerate((4, 9, 1)):
        resp = toks(n)
        mask = [1] * n
        if n == 9:  # policy 3, observation 3, policy 3
            mask = [1, 1, 1, 0, 0, 0, 1, 1, 1]
        rows.append({"prompt_ids": long_prompt, "response_ids": resp, "loss_mask": mask, "logprobs": [0.0] * n,
                     "group_id": "a"})
    for n in (6, 2):
        rows.append({"prompt_ids": short_prompt, "response_ids": toks(n), "loss_mask": [1] * n,
                     "logprobs": [0.0] * n, "group_id": "b"})
    rows.append({"prompt_ids": toks(7), "response_ids": toks(3), "loss_mask": [1] * 3, "logprobs": [0.0] * 3,
                 "group_id": "c"})
    order = [3, 0, 5, 1, 4, 2]  # groups interleaved, as a shuffled mini-batch has them
    return [rows[i] for i in order]


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.norm() == 0 and b.norm() == 0:
        return 1.0
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def test_packing_layout_by_hand():
    batch = make_train_batch(_trajectories(), pad_token_id=0)
    pk = pack_shared_prefix(batch.input_ids, batch.attention_mask, batch.prompt_len)
    assert pk.rows == 3  # three distinct prompts, packed in order of first appearance: b, a, c
    assert pk.tokens == (5 + 6 + 2) + (13 + 4 + 9 + 1) + (7 + 3)
    assert pk.tokens < int(batch.attention_mask.sum())
    # Group a: its prompt (positions 0..12), then its responses of 4, 9 and 1 tokens, each from 13.
    pos = pk.position_ids[1].tolist()
    assert pos[:13] == list(range(13)) and pos[13:17] == list(range(13, 17))
    assert pos[17:26] == list(range(13, 22)) and pos[26] == 13 and pos[27:] == [0] * (len(pos) - 27)
    allowed = pk.allowed[1]
    assert allowed[14, :15].all() and not allowed[14, 15:].any()  # response 1 sees the prompt and itself
    assert allowed[18, :13].all() and not allowed[18, 13:17].any() and allowed[18, 17:19].all()  # not response 1
    # Response token j of a row is predicted by the prompt's last state (j = 0), else by token j - 1.
    row = 3  # the batch's 9-token response of group a
    L = pk.input_ids.shape[1]
    assert pk.hidden_index[row, :9].tolist() == [L + 12] + [L + 17 + j for j in range(8)]
    assert (pk.input_ids.flatten()[pk.hidden_index[row, 1:9] + 1] == batch.input_ids[row, batch.prompt_len + 1 :
                                                                                   batch.prompt_len + 9]).all()
    # Sliding layers see keys less than WINDOW logical positions back: the 9-token response's last
    # token (index 25, position 21) sees positions 14..21 of its own response, no prompt token.
    masks = decoder_masks(pk, _tiny("gemma3").config, torch.float32)
    sliding, full = masks["sliding_attention"][1, 0], masks["full_attention"][1, 0]
    assert full[25, :13].all() and not sliding[25, :18].any() and sliding[25, 18:26].all()


@pytest.mark.parametrize("arch,attn", [("gemma3", "sdpa"), ("gemma3", "eager"), ("qwen2", "sdpa"), ("llama", "sdpa")])
def test_packed_and_unpacked_agree(arch, attn):
    lm = _tiny(arch, attn)
    assert supports_shared_prefix(lm.config) is None
    batch = make_train_batch(_trajectories(), pad_token_id=0)
    weights = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(2))
    out = {}
    for packed in (False, True):
        module = PolicyTokenStats(lm, chunk_tokens=4, temperature=0.8, shared_prefix=packed)
        assert module.shared_prefix is packed
        lm.zero_grad(set_to_none=True)
        lp, ent = module(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_len)
        ((lp * weights + 0.1 * ent) * batch.loss_mask).sum().backward()
        out[packed] = lp.detach(), ent.detach(), _grads(lm), module.tokens_run
    (lp0, ent0, g0, t0), (lp1, ent1, g1, t1) = out[False], out[True]
    assert float((lp0 - lp1).abs().max()) < 1e-4 and float((ent0 - ent1).abs().max()) < 1e-4
    assert (lp0[batch.loss_mask > 0] != 0).all()
    assert g0.keys() == g1.keys() and len(g0) > 5
    for name in g0:
        assert _cosine(g0[name], g1[name]) >= 0.9999, name
    assert t0 == int(batch.attention_mask.sum()) and t1 < t0


def test_packed_values_agree():
    lm = _tiny("qwen2")
    batch = make_train_batch(_trajectories(), pad_token_id=0)
    critic = ValueModel(lm.model, 64, shared_prefix=True)
    packed = critic(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_len)
    critic.shared_prefix = False
    unpacked = critic(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_len)
    assert float((packed - unpacked).detach().abs().max()) < 1e-4 and (packed[batch.loss_mask > 0] != 0).all()


def test_unsupported_attention_falls_back_to_unpacked():
    lm = _tiny("llama", "sdpa")
    lm.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in supports_shared_prefix(lm.config)
    assert PolicyTokenStats(lm, shared_prefix=True).shared_prefix is False


def test_mini_and_micro_batches_keep_a_groups_rows_together():
    """With `shared_prefix`, the seeded shuffle moves whole groups, and ranks and micro-batches take
    contiguous slices, so the rows of one prompt meet in one forward pass; without it, rows are shuffled."""
    from actors.learner.policy import PolicyLearner

    trajs = [{"prompt_ids": [7, g], "response_ids": [1, 2], "loss_mask": [1, 1], "logprobs": [0.0, 0.0],
              "group_id": f"q{g}"} for g in range(4) for _ in range(4)]
    batch = make_train_batch([trajs[i] for i in torch.randperm(16, generator=torch.Generator().manual_seed(3))], 0)
    for world in (1, 2):
        seen = []
        for rank in range(world):
            learner = PolicyLearner({"mini_batch_size": 8, "micro_batch_size": 4, "num_ranks": world}, rank, world)
            for mini in learner._plan(batch, epoch=0):
                for micro in learner._accumulation(mini, batch):
                    groups = {batch.group_ids[i] for i in micro.tolist()}
                    assert len(groups) == 1 and len(micro) == 4
                    seen += micro.tolist()
        assert sorted(seen) == list(range(16))
    plain = PolicyLearner({"mini_batch_size": 8, "micro_batch_size": 4, "shared_prefix": False})
    mixed = [len({batch.group_ids[i] for i in micro.tolist()}) for mini in plain._plan(batch, 0)
             for micro in plain._accumulation(mini, batch)]
    assert max(mixed) > 1


def test_split_at_groups_cuts_between_groups_where_it_can():
    from actors.learner.batch import split_at_groups

    ids = ["a"] * 3 + ["b"] * 3 + ["c"] * 2 + ["d"]  # rows 0..8
    rows = torch.arange(9)
    assert [p.tolist() for p in split_at_groups(rows, ids, 2)] == [[0, 1, 2], [3, 4, 5, 6, 7, 8]]  # a tie: the first
    assert [p.tolist() for p in split_at_groups(rows, ids, 3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    four = split_at_groups(rows, ids, 4)
    assert [p.tolist() for p in four] == [[0, 1, 2], [3, 4, 5], [6, 7], [8]]
    six = split_at_groups(rows, ids, 6)  # more parts than groups: some cuts fall inside a group
    assert len(six) == 6 and all(len(p) for p in six) and torch.cat(six).tolist() == list(range(9))
    kept = torch.tensor([0, 1, 2, 3, 4, 5, 8])  # group c skipped: the cut after b, not inside it
    assert [p.tolist() for p in split_at_groups(kept, ids, 2)] == [[0, 1, 2], [3, 4, 5, 8]]


def test_split_by_tokens_balances_the_weight():
    from actors.learner.batch import split_at_groups

    rows = torch.arange(6)
    weights = torch.tensor([10, 1, 1, 1, 1, 10])
    assert [p.tolist() for p in split_at_groups(rows, None, 2, weights)] == [[0, 1, 2], [3, 4, 5]]
    assert [p.tolist() for p in split_at_groups(rows, None, 3, weights)] == [[0], [1, 2, 3, 4], [5]]
    ids = ["a", "a", "a", "a", "b", "b"]  # a group boundary wins over a better token balance inside a group
    assert [p.tolist() for p in split_at_groups(rows, ids, 2, weights)] == [[0, 1, 2, 3], [4, 5]]


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_micro_batches_sized_by_tokens(shared_prefix):
    """`learner.micro_batch_tokens`: as many passes as the rank with the most tokens needs, each rank's
    tokens spread evenly, every row once, the same count on every rank; a group's prompt counts once
    when it packs."""
    from actors.learner.policy import PolicyLearner

    lengths = [40, 40, 40, 40, 4, 4, 4, 4, 12, 12, 12, 12, 2, 2, 2, 2]  # responses of 4 groups, unequal
    trajs = [{"prompt_ids": [7] * 20, "response_ids": [1] * n, "loss_mask": [1] * n, "logprobs": [0.0] * n,
              "group_id": f"q{i // 4}"} for i, n in enumerate(lengths)]
    batch = make_train_batch(trajs, 0)
    for world in (1, 2):
        counts, seen = [], []
        for rank in range(world):
            learner = PolicyLearner({"mini_batch_size": 16, "micro_batch_size": 16, "micro_batch_tokens": 100,
                                     "num_ranks": world, "shared_prefix": shared_prefix}, rank, world)
            (mini,) = learner._plan(batch, 0)
            micros = learner._accumulation(mini, batch)
            counts.append(len(micros))
            seen += [i for m in micros for i in m.tolist()]
            tokens = [int(learner._row_tokens(m, batch).sum()) for m in micros]
            total = int(learner._row_tokens(torch.cat(micros), batch).sum()) if micros else 0
            assert len(micros) >= -(-total // 100) or len(micros) == min(len(s) for s in learner._rank_rows(mini, batch))
            if shared_prefix:  # whole groups (a prompt computed once), one group of 180 tokens over the budget
                assert all(len({batch.group_ids[i] for i in m.tolist()}) == 1 for m in micros)
            else:
                assert max(tokens) <= 2 * total / len(micros)  # balanced by tokens, not by rows
        assert len(set(counts)) == 1 and sorted(seen) == list(range(16))
    one = PolicyLearner({"mini_batch_size": 16, "micro_batch_size": 16, "micro_batch_tokens": 100,
                         "shared_prefix": shared_prefix})
    rows = torch.arange(4)  # group q0: 4 x 40 response tokens + its 20-token prompt once (or 4 times)
    assert int(one._row_tokens(rows, batch).sum()) == (180 if shared_prefix else 240)
