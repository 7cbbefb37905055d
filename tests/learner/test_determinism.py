"""Same seed, same run: the sampled tokens and the learner's losses repeat exactly; other seeds differ."""

from __future__ import annotations

import pytest
import torch

from learner.trainer import Trainer
from learner.types import AdvantageEstimator, LossConfig, TrainerConfig
from rollout.policy.hf import turn_seed

pytestmark = pytest.mark.unit

import toy_rl  # noqa: E402  (imported like learner_fakes: tests/learner is on the test path)


def _run(seed: int) -> tuple[list[float], list[float], torch.Tensor]:
    run = toy_rl.rl_run(lambda c: 1.0 if c == (5, 9) else 0.0, (5, 9), AdvantageEstimator.GRPO, seed=seed,
                        steps=3, lr=5e-4, model=toy_rl.toy_model(seed, hidden=64))
    gen = torch.Generator().manual_seed(turn_seed(seed, 2))
    tokens = torch.tensor([c for c, _ in toy_rl.sample(run.model, 8, 2, gen)])
    return run.mean_reward, run.p_opt, tokens


def test_two_runs_with_one_seed_are_identical_and_another_seed_differs() -> None:
    a, b, c = _run(0), _run(0), _run(1)
    assert a[0] == b[0] and a[1] == b[1]  # bitwise: rewards seen and the optimum's probability after each step
    assert torch.equal(a[2], b[2])
    assert a[1] != c[1]


def test_turn_seed_separates_turns_and_episodes() -> None:
    seeds = {turn_seed(s, t) for s in range(4) for t in range(4)}
    assert len(seeds) == 16 and all(0 <= x < 2**63 for x in seeds)
    assert turn_seed(7, 1) == turn_seed(7, 1)


def test_deterministic_setting_turns_on_deterministic_algorithms() -> None:
    was = torch.are_deterministic_algorithms_enabled()
    try:
        Trainer(toy_rl.toy_model(0), LossConfig(), TrainerConfig(deterministic=True))
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(was)
