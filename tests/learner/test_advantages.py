"""Advantage estimators and reward shaping against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from learner.advantages import (
    dr_grpo, dynamic_sampling_keep, effort_override, group_advantages, grpo, items_from_groups, overlong_penalty,
    reinforce, reinforce_pp, rloo,
)
from learner.types import AdvantageConfig, AdvantageEstimator
from rollout.types import Sample, Status, Trajectory

pytestmark = pytest.mark.unit


def test_grpo_hand_case() -> None:
    # mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866025
    adv = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]), eps=0.0)
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_grpo_sums_to_zero_per_group(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(8, generator=g, dtype=torch.float64)
    assert float(grpo(rewards).sum()) == pytest.approx(0.0, abs=1e-9)


def test_grpo_degenerate_groups() -> None:
    assert grpo(torch.tensor([1.0])).tolist() == [0.0]
    assert grpo(torch.tensor([1.0, 1.0, 1.0])).tolist() == [0.0, 0.0, 0.0]


def test_dr_grpo_hand_case() -> None:
    assert dr_grpo(torch.tensor([1.0, 0.0, 0.0])).tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_rloo_hand_case() -> None:
    # r_i - mean of the others: 1 - 0, 0 - 0.5, 0 - 0.5
    assert rloo(torch.tensor([1.0, 0.0, 0.0])).tolist() == pytest.approx([1.0, -0.5, -0.5])
    assert rloo(torch.tensor([3.0])).tolist() == [0.0]


def test_reinforce_hand_case() -> None:
    # no baseline: the advantage is the reward, so failed (0) samples carry no gradient
    assert reinforce(torch.tensor([1.0, 0.0, 0.0])).tolist() == [1.0, 0.0, 0.0]
    cfg = AdvantageConfig(estimator=AdvantageEstimator.REINFORCE)
    assert group_advantages([[1.0, 0.0], [0.0, 0.0]], cfg) == [[1.0, 0.0], [0.0, 0.0]]


def test_reinforce_pp_global_normalisation() -> None:
    # mean 2/3; unbiased var = (4 * 1/9 + 2 * 4/9) / 5 = 4/15
    std = math.sqrt(4 / 15)
    adv = reinforce_pp(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), eps=0.0)
    assert adv.tolist() == pytest.approx([(1 / 3) / std, (-2 / 3) / std, (-2 / 3) / std] + [(1 / 3) / std] * 3, abs=1e-6)


def test_reinforce_pp_with_group_baseline() -> None:
    # group means 0.5 and 1.0 -> x = [0.5, -0.5, 0, 0]; mean 0, unbiased std sqrt(0.5/3)
    adv = reinforce_pp(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), eps=0.0)
    std = math.sqrt(0.5 / 3)
    assert adv.tolist() == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0], abs=1e-6)


def test_effort_override() -> None:
    assert effort_override(1.0, tokens=151, budget=100, tau=1.5) == -1.0
    assert effort_override(1.0, tokens=150, budget=100, tau=1.5) == 1.0
    assert effort_override(0.0, tokens=10_000, budget=None, tau=1.5) == 0.0


def test_overlong_penalty() -> None:
    assert overlong_penalty(80, max_len=100, cache_len=20) == 0.0
    assert overlong_penalty(90, max_len=100, cache_len=20) == pytest.approx(-0.5)
    assert overlong_penalty(100, max_len=100, cache_len=20) == pytest.approx(-1.0)
    assert overlong_penalty(101, max_len=100, cache_len=20) == -1.0


def test_dynamic_sampling_keep() -> None:
    assert not dynamic_sampling_keep([1.0, 1.0, 1.0])
    assert dynamic_sampling_keep([1.0, 0.0, 1.0])


def test_group_advantages_dispatch() -> None:
    groups = [[1.0, 0.0], [0.0, 0.0, 1.0]]
    assert group_advantages(groups, AdvantageConfig(estimator="rloo")) == [[1.0, -1.0], [-0.5, -0.5, 1.0]]
    flat = group_advantages(groups, AdvantageConfig(estimator="reinforce_pp"))
    assert [len(g) for g in flat] == [2, 3]


def _traj(eid: str, task: str, reward: float, n: int = 6, effort: str = "low") -> Trajectory:
    sample = Sample(tuple(range(n)), (0.0, 0.0) + (-1.0,) * (n - 2), (0, 0) + (1,) * (n - 2))
    return Trajectory(
        episode_id=eid, run_id="r", task_id=task, domain="coding", seed=0, harness="codex", effort=effort,
        policy_version=0, status=Status.OK, reward=reward, samples=(sample, sample),
    )


def test_items_from_groups_shapes_and_drops() -> None:
    groups = [
        [_traj("a", "t1", 1.0), _traj("b", "t1", 0.0)],
        [_traj("c", "t2", 1.0), _traj("d", "t2", 1.0)],  # all equal: dropped by dynamic sampling
    ]
    items = items_from_groups(groups, AdvantageConfig(estimator="dr_grpo", dynamic_sampling=True))
    assert [it.sample_id for it in items] == ["a/0", "a/1", "b/0", "b/1"]  # every sample of a split episode
    assert [it.advantage for it in items] == [0.5, 0.5, -0.5, -0.5]
    assert items[0].tags["harness"] == "codex" and items[0].group_id == "t1/0"


def test_items_from_groups_effort_budget() -> None:
    # 2 samples x 4 sampled tokens = 8 tokens > 1.0 x budget 5: the correct answer scores -1
    groups = [[_traj("a", "t1", 1.0), _traj("b", "t1", 0.0)]]
    cfg = AdvantageConfig(estimator="dr_grpo", effort_tau=1.0)
    items = items_from_groups(groups, cfg, budget_of=lambda t: 5 if t.episode_id == "a" else None)
    assert [it.advantage for it in items] == [-0.5, -0.5, 0.5, 0.5]
