"""`algorithm.skip_zero_advantage`: groups whose advantages are all zero leave the update."""

from __future__ import annotations

import pytest
import torch

from actors.learner.batch import make_train_batch
from algorithms import AlgorithmConfig, grpo_advantages, zero_advantage_groups


def test_zero_advantage_groups_by_hand():
    adv = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.5, 0.5], [-0.5, 0.0], [0.0, 0.0], [0.0, 0.3]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0], [1, 1], [1, 0]], dtype=torch.float)
    # Group c's only non-zero advantage sits on a masked token: no gradient, so it is dropped too.
    got = zero_advantage_groups(adv, mask, ["a", "a", "b", "b", "c", "c"])
    assert got.tolist() == [True, True, False, False, True, True]


def test_grpo_groups_of_equal_rewards_are_the_zero_ones():
    mask = torch.ones(6, 3)
    adv = grpo_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.3, 0.3]), ["a", "a", "b", "b", "c", "c"], mask)
    assert zero_advantage_groups(adv, mask, ["a", "a", "b", "b", "c", "c"]).tolist() == [True, True, False, False,
                                                                                        True, True]


def test_skip_takes_a_kl_or_entropy_loss_term_for_the_kept_groups():
    """The KL to the warm-started policy with DAPO's filter; the terms apply to the kept groups
    (`tests/test_learner.py` checks the update against the plain update of the kept groups alone)."""
    AlgorithmConfig(kl_coef=0.0, skip_zero_advantage=True)
    AlgorithmConfig(kl_coef=0.001, kl_in_reward=True, skip_zero_advantage=True)
    AlgorithmConfig(kl_coef=0.001, skip_zero_advantage=True)
    AlgorithmConfig(kl_coef=0.0, entropy_coef=0.01, skip_zero_advantage=True)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_plan_keeps_the_optimizer_steps_and_drops_the_skipped_rows(shared_prefix):
    """The kept rows fill as many mini-batches as the whole batch would; every rank does the same
    number of backward passes; an all-skipped batch gives no step."""
    from actors.learner.policy import PolicyLearner

    trajs = [{"prompt_ids": [7, g], "response_ids": [1, 2], "loss_mask": [1, 1], "logprobs": [0.0, 0.0],
              "group_id": f"q{g}"} for g in range(4) for _ in range(4)]
    batch = make_train_batch(trajs, 0)
    keep = torch.tensor([g not in ("q1", "q2") for g in batch.group_ids])
    for world in (1, 2):
        counts, seen = [], []
        for rank in range(world):
            learner = PolicyLearner({"mini_batch_size": 8, "micro_batch_size": 2, "num_ranks": world,
                                     "shared_prefix": shared_prefix}, rank, world)
            plan = learner._plan(batch, 0, keep)
            assert len(plan) == 2 and all(len(m) == 4 for m in plan)
            micros = [learner._accumulation(m, batch) for m in plan]
            counts.append([len(m) for m in micros])
            seen += [i for m in micros for mb in m for i in mb.tolist()]
        assert len({tuple(c) for c in counts}) == 1  # the same number of backward passes on every rank
        assert sorted(seen) == [i for i in range(16) if keep[i]]
        none = learner._plan(batch, 0, torch.zeros(16, dtype=torch.bool))
        assert none == []


def test_kept_groups_pack_whole_in_micro_batches_of_the_configured_size():
    """The main job's shape: 8 questions x 4 samples, micro-batches of 4, one mini-batch. With 6 groups
    skipped, the 2 kept ones still run as 2 passes of one whole group each (not 8 passes of one row,
    each computing the prompt again)."""
    from actors.learner.policy import PolicyLearner

    trajs = [{"prompt_ids": [7, g], "response_ids": [1, 2], "loss_mask": [1, 1], "logprobs": [0.0, 0.0],
              "group_id": f"q{g}"} for g in range(8) for _ in range(4)]
    batch = make_train_batch(trajs, 0)
    learner = PolicyLearner({"mini_batch_size": 32, "micro_batch_size": 4})
    keep = torch.tensor([g in ("q2", "q5") for g in batch.group_ids])
    (mini,) = learner._plan(batch, 0, keep)
    micros = learner._accumulation(mini, batch)
    assert sorted(len({batch.group_ids[i] for i in m.tolist()}) for m in micros) == [1, 1]
    assert [len(m) for m in micros] == [4, 4]
    (whole,) = learner._plan(batch, 0)
    assert [len(m) for m in learner._accumulation(whole, batch)] == [4] * 8  # grad_accum_steps passes


def test_scatter_rows_puts_a_selected_batchs_columns_back():
    from actors.learner.batch import scatter_rows

    got = scatter_rows(torch.tensor([[1.0, 2.0], [3.0, 0.0]]), torch.tensor([2, 0]), size=3, width=4)
    assert got.tolist() == [[3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="do not fit"):
        scatter_rows(torch.zeros(2, 5), torch.tensor([0, 1]), size=3, width=4)


@pytest.mark.parametrize("packed", [False, True])
def test_log_probs_of_the_trained_rows_alone_are_the_whole_batchs_on_those_rows(packed):
    """`actors.learner.batch.trained_rows`: the reference and old log-prob passes run over the rows the update trains
    (groups of equal rewards left out), scattered back to the batch's shape: the same numbers as one pass over the
    whole batch on those rows, zeros elsewhere (rows no loss reads)."""
    from actors.learner.batch import scatter_rows, trained_rows
    from actors.learner.token_stats import PolicyTokenStats
    from tests.test_shared_prefix import _tiny, _trajectories

    trajs = _trajectories()
    batch = make_train_batch(trajs, pad_token_id=0)
    rewards = torch.tensor([{"a": 0.0, "b": 1.0, "c": 0.5}[g] for g in batch.group_ids])
    rewards[[i for i, g in enumerate(batch.group_ids) if g == "a"][0]] = 1.0  # only group a's rewards differ
    adv = grpo_advantages(rewards, batch.group_ids, batch.loss_mask)
    rows = trained_rows(AlgorithmConfig(skip_zero_advantage=True), adv, batch)
    assert sorted(batch.group_ids[i] for i in rows.tolist()) == ["a", "a", "a"]
    assert trained_rows(AlgorithmConfig(skip_zero_advantage=False), adv, batch).tolist() == list(range(6))

    stats = PolicyTokenStats(_tiny("gemma3"), chunk_tokens=4, temperature=0.8, shared_prefix=packed)
    with torch.no_grad():
        whole, _ = stats(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.prompt_len)
        part = batch.select(rows)
        some, _ = stats(part.input_ids, part.attention_mask, part.loss_mask, part.prompt_len)
    got = scatter_rows(some, rows, batch.size, batch.response_len)
    assert float((got[rows] - whole[rows]).abs().max()) < 1e-5
    others = torch.tensor([i not in rows.tolist() for i in range(batch.size)])
    assert (got[others] == 0).all() and (whole[rows][batch.loss_mask[rows] > 0] != 0).all()
