"""Advantage estimators: GAE (PPO), GRPO, Dr.GRPO, RLOO, group-mean baseline, Reinforce++.

Shapes: ``seq_rewards`` is ``[B]`` (one scalar outcome reward per sequence); token tensors are
``[B, T]`` over the response tokens, right-padded.  ``loss_mask`` ``[B, T]`` (bool or float,
non-zero = 1) is 1 on tokens the policy generated and 0 on environment tokens (retrieved
documents / observations inserted *between* policy turns) and on padding.

Multi-turn search rollouts look like ``policy turn | observation | policy turn | ... | padding``.
Every estimator here works on the sub-sequence of policy tokens: an observation span is
skipped, never treated as the end of the episode.  For GAE and returns-to-go this means that
the running sums *carry across* an observation (so the tokens of the first turn see the reward
given after the last turn), and the bootstrap value of the last token of a turn is the value of
the first token of the next turn.

All functions run under ``torch.no_grad()``: advantages and returns are constants of the loss.
Results are fp32 (fp64 if the inputs are fp64) and exactly 0 at masked positions.

The config-driven entry point :func:`algorithms.estimators.compute_advantages` reaches these
functions through the ``ADVANTAGE_ESTIMATORS`` registry (:mod:`algorithms.registry`).
"""

from __future__ import annotations

from collections.abc import Hashable

import torch
from torch import Tensor

from .kl import KLEstimator, kl_estimate
from .masked import as_bool_mask, check_2d, check_same_shape, masked_whiten, zero_masked
from .registry import GroupIds as GroupIds  # re-export: callers name it from here



# ----------------------------------------------------------------------------- helpers


def _float_dtype(*tensors: Tensor) -> torch.dtype:
    """fp64 if any input is fp64, else fp32 (bf16/fp16/int inputs are upcast)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_seq_rewards(func: str, seq_rewards: Tensor, loss_mask: Tensor) -> None:
    """``seq_rewards`` must be finite ``[B]`` and ``loss_mask`` ``[B, T]`` with the same B."""
    check_2d(func, "loss_mask", loss_mask)
    if not isinstance(seq_rewards, Tensor) or seq_rewards.dim() != 1:
        shape = tuple(seq_rewards.shape) if isinstance(seq_rewards, Tensor) else type(seq_rewards).__name__
        raise ValueError(f"{func}: `seq_rewards` must be a 1-D tensor [B], got {shape}")
    if seq_rewards.shape[0] != loss_mask.shape[0]:
        raise ValueError(
            f"{func}: `seq_rewards` has {seq_rewards.shape[0]} entries but `loss_mask` has "
            f"{loss_mask.shape[0]} rows; they must be equal (one reward per sequence)"
        )
    if not bool(torch.isfinite(seq_rewards).all()):
        raise ValueError(f"{func}: `seq_rewards` contains NaN or inf; fix the reward function")


def _check_unit_interval(func: str, **params: float) -> None:
    """Raise ``ValueError`` naming the first parameter outside [0, 1]."""
    for name, value in params.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{func}: `{name}` must be in [0, 1], got {value}")


def _broadcast(seq_values: Tensor, loss_mask: Tensor) -> Tensor:
    """``[B]`` -> ``[B, T]``: each sequence's value on its mask-1 tokens, 0 elsewhere."""
    expanded = seq_values.unsqueeze(1).expand(loss_mask.shape)
    return zero_masked(expanded, loss_mask)


def _compact(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Indices that gather each row's mask-1 tokens to the front, in their original order.

    Returns:
        ``order`` ``[B, L]`` int64 (L = the most mask-1 tokens in a row; entries past a row's
        count point at distinct mask-0 positions) and ``valid`` ``[B, L]`` bool (position is a
        real policy token).
    """
    counts = mask.sum(dim=1)
    length = int(counts.max()) if mask.numel() else 0
    # A stable sort of (not mask) puts the mask-1 positions first, keeping their order.
    order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices[:, :length]
    valid = torch.arange(length, device=mask.device).unsqueeze(0) < counts.unsqueeze(1)
    return order, valid


def _reverse_discounted_sum(x: Tensor, discount: float) -> Tensor:
    """``y[:, t] = x[:, t] + discount * y[:, t + 1]`` over a compact ``[B, L]`` tensor, L >= 1."""
    out = torch.empty_like(x)
    running = torch.zeros_like(x[:, 0])
    for t in range(x.shape[1] - 1, -1, -1):  # O(L) steps on [B] vectors; L = policy tokens only
        running = x[:, t] + discount * running
        out[:, t] = running
    return out


def _policy_token_gae(
    token_rewards: Tensor, values: Tensor | None, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE over each row's policy tokens only; ``values=None`` means a zero critic.

    Returns ``(advantages, returns)`` ``[B, T]``, 0 at masked positions.
    """
    dtype = _float_dtype(token_rewards, *(() if values is None else (values,)))
    out_adv = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    order, valid = _compact(mask)
    if order.shape[1] == 0:
        return out_adv, out_adv.clone()
    rewards_c = zero_masked(token_rewards.to(dtype).gather(1, order), valid)
    if values is None:
        values_c = torch.zeros_like(rewards_c)
    else:
        values_c = zero_masked(values.to(dtype).gather(1, order), valid)
    # Value of the next *policy* token; 0 after a row's last one (padding in values_c is 0).
    next_values = torch.cat([values_c[:, 1:], torch.zeros_like(values_c[:, :1])], dim=1)
    deltas = rewards_c + gamma * next_values - values_c  # 0 at invalid (padding) positions
    adv_c = _reverse_discounted_sum(deltas, gamma * lam)
    returns_c = zero_masked(adv_c + values_c, valid)
    adv_c = zero_masked(adv_c, valid)
    # Positions past a row's count point at distinct mask-0 entries and carry 0 there.
    out_adv.scatter_(1, order, adv_c)
    out_ret = torch.zeros_like(out_adv).scatter_(1, order, returns_c)
    return out_adv, out_ret


# ----------------------------------------------------------------------------- building blocks


def group_indices(group_ids: GroupIds, device: torch.device | str | None = None) -> Tensor:
    """Map arbitrary hashable group ids (e.g. ``"nq/123"``) to ``0..G-1``, by first appearance.

    Args:
        group_ids: length-B sequence of hashables, or a 1-D tensor (its values are the ids).
        device: device of the result.

    Returns:
        ``[B]`` int64 tensor; samples of the same prompt share an index.
    """
    if isinstance(group_ids, Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_indices: `group_ids` tensor must be 1-D [B], got {tuple(group_ids.shape)}")
        group_ids = group_ids.tolist()
    if isinstance(group_ids, (str, bytes)):
        raise ValueError("group_indices: `group_ids` must be a sequence of ids, not a single string")
    index: dict[Hashable, int] = {}
    out = [index.setdefault(gid, len(index)) for gid in group_ids]
    return torch.tensor(out, dtype=torch.long, device=device)


def zero_advantage_groups(advantages: Tensor, loss_mask: Tensor, group_ids: GroupIds) -> Tensor:
    """Rows of groups whose advantages are zero on every policy token (the rewards of a GRPO group all
    equal): with no KL or entropy term they add no gradient (DAPO §3.2 dynamic sampling; GRESO).

    Args:
        advantages, loss_mask: ``[B, T]``.
        group_ids: length-B group ids.

    Returns:
        ``[B]`` bool, True on every row of such a group.
    """
    live = ((advantages != 0) & (loss_mask > 0)).any(1)
    idx = group_indices(group_ids, device=advantages.device)
    live_rows = torch.zeros(int(idx.max()) + 1 if len(idx) else 0, device=advantages.device)
    live_rows.index_add_(0, idx, live.float())
    return live_rows[idx] == 0


@torch.no_grad()
def terminal_rewards(seq_rewards: Tensor, loss_mask: Tensor) -> Tensor:
    """Place each sequence's scalar reward on its last policy token (mask 1), zeros elsewhere.

    The last mask-1 token is the end of the final policy turn even when an observation or
    padding follows it.  A row with no mask-1 token receives no reward at all (the policy
    generated nothing there to credit); such rows contribute nothing to any loss.

    Args:
        seq_rewards: ``[B]`` float, one outcome reward per sequence (finite).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.

    Returns:
        ``[B, T]`` fp32 (fp64 for fp64 rewards) token rewards.
    """
    _check_seq_rewards("terminal_rewards", seq_rewards, loss_mask)
    mask = as_bool_mask(loss_mask)
    dtype = _float_dtype(seq_rewards)
    positions = torch.arange(mask.shape[1], device=mask.device).expand(mask.shape)
    last = torch.where(mask, positions, -1).max(dim=1).values if mask.shape[1] else None
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    if last is None:
        return out
    has_token = last >= 0
    reward = torch.where(has_token, seq_rewards.to(dtype), torch.zeros((), dtype=dtype, device=mask.device))
    return out.scatter_(1, last.clamp(min=0).unsqueeze(1), reward.unsqueeze(1))


@torch.no_grad()
def kl_penalized_rewards(
    seq_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    loss_mask: Tensor,
    kl_coef: float,
    estimator: KLEstimator = "k1",
) -> Tensor:
    """Token rewards with the KL penalty folded in (PPO-RLHF "KL in the reward").

    ``r_t = 1[t = last policy token] * R - kl_coef * KL_t`` at mask-1 tokens, 0 elsewhere
    (Ouyang et al. 2022, Eq. 2; Stiennon et al. 2020).  Search-R1's and s3's PPO (verl
    ``kl_ctrl``) use ``estimator="k1"``; Reinforce++ (Hu 2025) likewise folds the KL here.

    Args:
        seq_rewards: ``[B]`` float outcome rewards.
        logprobs: ``[B, T]`` float, rollout (old) policy log-probs of the sampled tokens.
        ref_logprobs: ``[B, T]`` float, reference-model log-probs of the same tokens.
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        kl_coef: KL coefficient beta >= 0.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (see :func:`algorithms.kl.kl_estimate`).

    Returns:
        ``[B, T]`` fp32 token rewards (detached), 0 at masked positions.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_penalized_rewards: `kl_coef` must be >= 0, got {kl_coef}")
    check_same_shape(
        "kl_penalized_rewards", ("loss_mask", loss_mask), ("logprobs", logprobs), ("ref_logprobs", ref_logprobs)
    )
    rewards = terminal_rewards(seq_rewards, loss_mask)
    kl = kl_estimate(logprobs, ref_logprobs, estimator, loss_mask=loss_mask).to(rewards.dtype)
    return rewards - kl_coef * kl


# ----------------------------------------------------------------------------- token-level estimators


@torch.no_grad()
def gae(
    token_rewards: Tensor, values: Tensor, loss_mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation over the policy tokens of each sequence.

    Schulman et al. 2016 (GAE), Eqs. 11-16; PPO (Schulman et al. 2017) Eqs. 11-12:
    ``delta_t = r_t + gamma * V(t') - V(t)`` and ``A_t = delta_t + gamma * lam * A_t'``, where
    ``t'`` is the next *policy* token after ``t`` (observation tokens in between are skipped;
    ``V(t') = 0`` and ``A_t' = 0`` after the last policy token).  The accumulator carries
    across an observation span: the tokens of the first turn receive the (discounted) rewards
    given after later turns.  ``returns = A + V`` (the critic's regression target).

    Rewards and values at masked positions are ignored (not an error): environment tokens have
    no action, so a reward placed there would have no token to credit; put rewards on policy
    tokens (:func:`terminal_rewards`, :func:`kl_penalized_rewards`).

    Args:
        token_rewards: ``[B, T]`` float per-token rewards.
        values: ``[B, T]`` float critic values V(s_t) at each token (any float dtype).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token, 0 = observation or padding.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1]; ``lam=1`` gives discounted return minus value.

    Returns:
        ``(advantages, returns)``, both ``[B, T]`` fp32 (fp64 for fp64 inputs), 0 at masked
        positions, detached.  Not whitened (see :func:`algorithms.masked.masked_whiten`).
    """
    check_2d("gae", "loss_mask", loss_mask)
    check_same_shape("gae", ("loss_mask", loss_mask), ("token_rewards", token_rewards), ("values", values))
    _check_unit_interval("gae", gamma=gamma, lam=lam)
    return _policy_token_gae(token_rewards, values, as_bool_mask(loss_mask), gamma, lam)


@torch.no_grad()
def reinforce_pp_advantages(
    token_rewards: Tensor, loss_mask: Tensor, gamma: float = 1.0, whiten: bool = True
) -> tuple[Tensor, Tensor]:
    """Reinforce++ (Hu, 2025): per-token discounted return-to-go, then global whitening.

    ``G_t = sum_{k >= 0} gamma^k r_{t_k}`` over the policy tokens ``t = t_0 < t_1 < ...`` from
    ``t`` on (observation tokens are skipped; the sum carries across them, as GAE with no
    critic and ``lam = 1``).  Advantages are ``G`` whitened over *all* mask-1 tokens of the
    batch (``masked_whiten``: mean 0, population std 1).  Fold the KL penalty into
    ``token_rewards`` beforehand with :func:`kl_penalized_rewards`.

    Args:
        token_rewards: ``[B, T]`` float per-token rewards (masked positions ignored).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        gamma: discount in [0, 1].
        whiten: normalise the advantages over the batch (True in Reinforce++).

    Returns:
        ``(advantages, returns)``: ``[B, T]`` fp32, 0 at masked positions; ``returns`` is the
        un-whitened return-to-go.
    """
    check_2d("reinforce_pp_advantages", "loss_mask", loss_mask)
    check_same_shape("reinforce_pp_advantages", ("loss_mask", loss_mask), ("token_rewards", token_rewards))
    _check_unit_interval("reinforce_pp_advantages", gamma=gamma)
    mask = as_bool_mask(loss_mask)
    _, returns = _policy_token_gae(token_rewards, None, mask, gamma, 1.0)
    advantages = masked_whiten(returns, mask) if whiten else returns.clone()
    return advantages, returns


# ----------------------------------------------------------------------------- group (outcome) estimators


def _group_stats(seq_rewards: Tensor, group_ids: GroupIds) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample group statistics, each ``[B]``: index, size, mean, and 'all rewards equal'."""
    idx = group_indices(group_ids, device=seq_rewards.device)
    if idx.shape[0] != seq_rewards.shape[0]:
        raise ValueError(
            f"`group_ids` has {idx.shape[0]} entries but `seq_rewards` has {seq_rewards.shape[0]}; "
            "give one group id per sequence"
        )
    num_groups = int(idx.max()) + 1 if idx.numel() else 0
    r = seq_rewards
    zeros = torch.zeros(num_groups, dtype=r.dtype, device=r.device)
    size = zeros.index_add(0, idx, torch.ones_like(r))
    mean = zeros.index_add(0, idx, r) / size.clamp(min=1)
    gmax = zeros.scatter_reduce(0, idx, r, reduce="amax", include_self=False)
    gmin = zeros.scatter_reduce(0, idx, r, reduce="amin", include_self=False)
    # Exact test instead of relying on r - mean == 0: float rounding of the mean would otherwise
    # turn equal rewards into tiny non-zero advantages, which std-scaling blows up.
    constant = gmax == gmin
    return idx, size[idx], mean[idx], constant[idx]


def _prepare_group(func: str, seq_rewards: Tensor, loss_mask: Tensor) -> Tensor:
    _check_seq_rewards(func, seq_rewards, loss_mask)
    return seq_rewards.to(_float_dtype(seq_rewards))


@torch.no_grad()
def grpo_scores(seq_rewards: Tensor, group_ids: GroupIds, eps: float = 1e-6, scale_by_std: bool = True) -> Tensor:
    """Sequence-level GRPO scores ``[B]``: ``(r - mean_g) / (std_g + eps)`` (or ``r - mean_g``).

    ``std_g`` is the unbiased (Bessel, ``n - 1``) sample standard deviation of the group, as
    ``torch.std`` in the common implementations.  Groups of size 1 and groups whose rewards
    are all equal score exactly 0.  No input checks (see :func:`grpo_advantages`).
    """
    # Group statistics in float64: rewards that differ in their last float32 bits would otherwise centre
    # to deviations that do not sum to 0 (a group's scores then have a non-zero mean).
    r = seq_rewards.to(torch.float64)
    idx, size, mean, constant = _group_stats(r, group_ids)
    centred = r - mean
    if scale_by_std:
        # B slots are enough for the group sums: group indices are < number of groups <= B.
        sq_sum = torch.zeros_like(r).index_add(0, idx, centred.square())[idx]
        std = torch.sqrt(sq_sum / (size - 1).clamp(min=1))
        centred = centred / (std + eps)
    return torch.where(constant, torch.zeros_like(centred), centred).to(_float_dtype(seq_rewards))


@torch.no_grad()
def rloo_scores(seq_rewards: Tensor, group_ids: GroupIds) -> Tensor:
    """Sequence-level RLOO scores ``[B]``: ``r_i - mean_{j != i} r_j``; 0 for groups of size 1."""
    r = seq_rewards.to(torch.float64)  # as in `grpo_scores`: deviations that sum to 0
    _, size, mean, constant = _group_stats(r, group_ids)
    # mean of the others = (n * mean - r_i) / (n - 1), so r_i - it = n / (n - 1) * (r_i - mean).
    score = (r - mean) * size / (size - 1).clamp(min=1)
    return torch.where(constant | (size < 2), torch.zeros_like(score), score).to(_float_dtype(seq_rewards))


@torch.no_grad()
def group_mean_scores(seq_rewards: Tensor, group_ids: GroupIds) -> Tensor:
    """Sequence-level group-mean-baseline scores ``[B]``: ``r - mean_g`` (0 for constant groups)."""
    return grpo_scores(seq_rewards, group_ids, scale_by_std=False)


@torch.no_grad()
def grpo_advantages(
    seq_rewards: Tensor, group_ids: GroupIds, loss_mask: Tensor, eps: float = 1e-6, scale_by_std: bool = True
) -> Tensor:
    """GRPO outcome-supervision advantages, broadcast to every policy token of the sequence.

    ``A_{i,t} = (r_i - mean(r_g)) / (std(r_g) + eps)`` for every mask-1 token t of sequence i
    (DeepSeekMath, Shao et al. 2024, Sec. 4.1.2; Eval-RAR Eq. 6 and R-Search use it).
    ``std`` is the unbiased sample std (divide by ``n - 1``, like ``torch.std``).
    ``scale_by_std=False`` is Dr.GRPO (Liu et al. 2025, Sec. 3.2): ``A = r - mean(r_g)``.
    A group of size 1, or whose rewards are all equal, gives exactly 0 (never NaN).

    Args:
        seq_rewards: ``[B]`` float outcome rewards (finite).
        group_ids: length-B ids (any hashables, e.g. ``"nq/17"``), equal for the samples of
            one prompt; groups may have different sizes and be interleaved in any order.
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.
        eps: added to the std (>= 0).
        scale_by_std: divide by the group std (GRPO) or not (Dr.GRPO).

    Returns:
        ``[B, T]`` fp32 advantages, 0 at masked positions.
    """
    r = _prepare_group("grpo_advantages", seq_rewards, loss_mask)
    if eps < 0:
        raise ValueError(f"grpo_advantages: `eps` must be >= 0, got {eps}")
    return _broadcast(grpo_scores(r, group_ids, eps, scale_by_std), loss_mask)


@torch.no_grad()
def rloo_advantages(seq_rewards: Tensor, group_ids: GroupIds, loss_mask: Tensor) -> Tensor:
    """RLOO advantages: ``r_i - (1 / (n - 1)) * sum_{j != i} r_j`` on every policy token.

    REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, Eq. 6).  A group of size
    1 has no other member and gives 0.

    Args:
        seq_rewards: ``[B]`` float outcome rewards.
        group_ids: length-B group ids (see :func:`grpo_advantages`).
        loss_mask: ``[B, T]`` bool/float, 1 = policy token.

    Returns:
        ``[B, T]`` fp32 advantages, 0 at masked positions.
    """
    r = _prepare_group("rloo_advantages", seq_rewards, loss_mask)
    return _broadcast(rloo_scores(r, group_ids), loss_mask)


@torch.no_grad()
def group_mean_baseline_advantages(seq_rewards: Tensor, group_ids: GroupIds, loss_mask: Tensor) -> Tensor:
    """Group-mean baseline advantages ``r_i - mean(r_g)`` on every policy token.

    The baseline of R1-Searcher's Reinforce++ runs (OpenRLHF ``reinforce_baseline``);
    identical to Dr.GRPO's advantage.  Groups of size 1 give 0.  Arguments and result as
    :func:`rloo_advantages` (``[B]`` rewards, length-B group ids, ``[B, T]`` mask → ``[B, T]`` fp32).
    """
    r = _prepare_group("group_mean_baseline_advantages", seq_rewards, loss_mask)
    return _broadcast(group_mean_scores(r, group_ids), loss_mask)
