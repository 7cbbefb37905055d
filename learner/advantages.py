"""Advantages from rewards: GRPO, Dr. GRPO, RLOO, REINFORCE++, plain REINFORCE; and the reward shaping before them.

All estimators here give one advantage per trajectory (outcome RL); the
trainer broadcasts it to the trajectory's loss tokens. MOPD's per-token
teacher advantage is computed in ``distill`` and enters ``TrainItem`` directly.

Shaping runs on raw rewards, before the estimator, in this order:
1. the effort budget override (Kimi K3 effort RL): ``r := -1`` when the
   counted tokens ``T(y) > tau * b0(x)``. It replaces the reward, so an
   over-budget correct answer scores below a within-budget wrong one (0);
2. DAPO's soft overlong punishment, added to the reward;
3. DAPO dynamic sampling: a group whose rewards are all equal has zero
   group-relative advantage everywhere, so it only dilutes the batch; drop it.

Departures from the papers: GRPO's std is the unbiased sample std (as in TRL
and verl), and a group of one gets advantage 0 rather than NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from learner.types import AdvantageConfig, AdvantageEstimator, TrainItem
from rollout.types import Trajectory

__all__ = [
    "dr_grpo",
    "dynamic_sampling_keep",
    "effort_override",
    "grpo",
    "group_advantages",
    "items_from_groups",
    "overlong_penalty",
    "reinforce",
    "reinforce_pp",
    "response_tokens",
    "rloo",
]


def grpo(reward_G: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` over one group of G rewards.

    Sums to zero over the group (up to rounding). std is the unbiased sample std.
    """
    if reward_G.numel() < 2:
        return torch.zeros_like(reward_G)
    centered_G = reward_G - reward_G.mean()
    return centered_G / (reward_G.std(unbiased=True) + eps)


def dr_grpo(reward_G: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: ``A_i = r_i - mean(r)``. Dividing by the std favours groups that are
    almost all right or all wrong (tiny std); Dr. GRPO drops it."""
    return reward_G - reward_G.mean()


def rloo(reward_G: torch.Tensor) -> torch.Tensor:
    """RLOO: ``A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean(r))``.

    The baseline excludes the sample itself, so it is independent of it and the
    estimator unbiased. A group of one has no baseline: advantage 0.
    """
    g = reward_G.numel()
    if g < 2:
        return torch.zeros_like(reward_G)
    loo_mean_G = (reward_G.sum() - reward_G) / (g - 1)
    return reward_G - loo_mean_G


def reinforce_pp(reward_B: torch.Tensor, group_B: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++: normalise over the *global* batch, ``A = (x - mean_B(x)) / (std_B(x) + eps)``.

    ``x = r`` plainly; with ``group_B`` (group index per trajectory) ``x = r - mean_group(r)``
    first (the "REINFORCE++-baseline" variant for groups of samples per prompt).
    The global statistics are less noisy than a small group's, which is the point.
    """
    x_B = reward_B.to(torch.float32)
    if group_B is not None:
        n_groups = int(group_B.max()) + 1 if group_B.numel() else 0
        sum_Gr = torch.zeros(n_groups, dtype=x_B.dtype).index_add_(0, group_B, x_B)
        cnt_Gr = torch.zeros(n_groups, dtype=x_B.dtype).index_add_(0, group_B, torch.ones_like(x_B))
        x_B = x_B - (sum_Gr / cnt_Gr)[group_B]
    if x_B.numel() < 2:
        return torch.zeros_like(x_B)
    return (x_B - x_B.mean()) / (x_B.std(unbiased=True) + eps)


def effort_override(reward: float, tokens: int, budget: int | None, tau: float) -> float:
    """Kimi K3 effort RL: ``r = -1 if T(y) > tau * b0(x) else R_task``.

    ``tokens`` is T(y): thinking tokens for general tasks, all output tokens
    (tool arguments included) for agentic ones -- the caller counts. ``budget``
    is b0(x), the task's budget at this effort level; ``None`` means unbudgeted.
    """
    if budget is None:
        return reward
    return -1.0 if tokens > tau * budget else reward


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """DAPO soft overlong punishment, added to the reward.

    ``0`` if ``|y| <= L_max - L_cache``; ``((L_max - L_cache) - |y|) / L_cache`` on the
    ramp up to ``L_max``; ``-1`` beyond. A graded penalty tells the model
    "shorter" instead of punishing a truncated good answer like a wrong one.
    """
    soft = max_len - cache_len
    if length <= soft:
        return 0.0
    if length <= max_len and cache_len > 0:
        return (soft - length) / cache_len
    return -1.0


def reinforce(reward_G: torch.Tensor) -> torch.Tensor:
    """Plain REINFORCE without a baseline: ``A_i = r_i``.

    With 0/1 verifier rewards only the passing samples carry a gradient, each
    pushed up as in SFT: rejection-sampling fine-tuning (expert iteration, RAFT)
    is this estimator. No negative signal, so no noise from failed samples'
    tokens; no baseline, so a higher variance when rewards are not 0/1.
    """
    return reward_G.clone()


def dynamic_sampling_keep(reward_G: Sequence[float]) -> bool:
    """DAPO dynamic sampling: keep a group only if its rewards are not all equal."""
    return len(set(reward_G)) > 1


_GROUP_ESTIMATORS: Mapping[AdvantageEstimator, Callable[[torch.Tensor, float], torch.Tensor]] = {
    AdvantageEstimator.GRPO: grpo,
    AdvantageEstimator.DR_GRPO: lambda r, _eps: dr_grpo(r),
    AdvantageEstimator.RLOO: lambda r, _eps: rloo(r),
    AdvantageEstimator.REINFORCE: lambda r, _eps: reinforce(r),
}


def group_advantages(reward_groups: Sequence[Sequence[float]], cfg: AdvantageConfig) -> list[list[float]]:
    """Advantages for groups of already-shaped rewards, one list per group."""
    if cfg.estimator is AdvantageEstimator.REINFORCE_PP:
        flat_B = torch.tensor([r for g in reward_groups for r in g], dtype=torch.float64)
        group_B = torch.tensor([i for i, g in enumerate(reward_groups) for _ in g], dtype=torch.long)
        adv_B = reinforce_pp(flat_B, group_B, cfg.eps).tolist()
        out, at = [], 0
        for g in reward_groups:
            out.append(adv_B[at:at + len(g)])
            at += len(g)
        return out
    estimator = _GROUP_ESTIMATORS[cfg.estimator]
    return [estimator(torch.tensor(list(g), dtype=torch.float64), cfg.eps).tolist() for g in reward_groups]


def response_tokens(t: Trajectory) -> int:
    """The tokens a trajectory's policy sampled (its length for the budget penalty)."""
    return sum(s.num_sampled for s in t.samples)


def shaped_reward(
    t: Trajectory,
    cfg: AdvantageConfig,
    *,
    budget_of: Callable[[Trajectory], int | None] | None = None,
    tokens_of: Callable[[Trajectory], int] = response_tokens,
    tau_of: Callable[[Trajectory], float] | None = None,
) -> float:
    """The trajectory's reward as the advantage sees it: the verifier's, then the effort rule
    (``-1`` over ``tau * b0``) and the overlong penalty where configured (arguments as
    ``items_from_groups``'s). The RL step and MOPD's outcome term both shape through here."""
    r = float(t.reward)
    tau = tau_of(t) if tau_of is not None else cfg.effort_tau
    if budget_of is not None and tau is not None:
        r = effort_override(r, tokens_of(t), budget_of(t), tau)
    if cfg.overlong_max_len is not None:
        r += overlong_penalty(tokens_of(t), cfg.overlong_max_len, cfg.overlong_cache_len)
    return r


def items_from_groups(
    groups: Sequence[Sequence[Trajectory]],
    cfg: AdvantageConfig,
    *,
    budget_of: Callable[[Trajectory], int | None] | None = None,
    tokens_of: Callable[[Trajectory], int] = response_tokens,
    tau_of: Callable[[Trajectory], float] | None = None,
) -> list[TrainItem]:
    """Shape rewards, compute advantages and expand trajectories into ``TrainItem``s.

    ``budget_of(traj)`` gives b0 for the effort rule (``learner.effort`` reads
    the budgets file; ``None`` = no budget); ``tau_of(traj)`` its factor (each
    effort level its own; default ``cfg.effort_tau``); ``tokens_of`` counts T(y)
    (default: every sampled token). Every sample of a split (non-append-only) trajectory gets
    the trajectory's advantage. Groups dropped by dynamic sampling give no items.
    """
    shaped: list[list[float]] = []
    kept: list[Sequence[Trajectory]] = []
    for group in groups:
        rewards = [shaped_reward(t, cfg, budget_of=budget_of, tokens_of=tokens_of, tau_of=tau_of) for t in group]
        if cfg.dynamic_sampling and not dynamic_sampling_keep(rewards):
            continue
        shaped.append(rewards)
        kept.append(group)
    items: list[TrainItem] = []
    for group, adv_G in zip(kept, group_advantages(shaped, cfg)):
        for t, adv in zip(group, adv_G):
            tags = {"harness": t.harness, "effort": t.effort, "domain": t.domain, "task": t.task_id}
            for k, s in enumerate(t.samples):
                items.append(TrainItem(
                    token_ids=s.token_ids, rollout_logprobs=s.logprobs, loss_mask=s.loss_mask,
                    advantage=float(adv), sample_id=f"{t.episode_id}/{k}", group_id=f"{t.task_id}/{t.seed}",
                    tags=tags,
                ))
    return items
