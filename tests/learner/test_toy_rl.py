"""Toy problems with known optima on the real learner (advantages, packing, loss, Trainer); see toy_rl.py.

Measured (hidden 256, lr 5e-4 = the quickstart's RL lr, 4 groups x 8 samples, steps until the optimum
has probability >= 0.9): bandit GRPO 4/5/4 steps over seeds 0-2, Dr. GRPO 4/5/4. The bounds below are
about twice that. The wrong-token task checks that a token paying 0 loses probability on the first
update, through the negative advantages of its samples. The two-step task and the other estimators'
step counts were not calibrated in time (see docs/training.md).
"""

from __future__ import annotations

import pytest

from learner.types import AdvantageEstimator

pytestmark = pytest.mark.unit

import toy_rl  # noqa: E402  (imported like learner_fakes: tests/learner is on the test path)

SEEDS = (0, 1, 2)


@pytest.mark.parametrize("estimator", list(AdvantageEstimator), ids=lambda e: e.value)
def test_bandit_over_single_tokens_converges(estimator: AdvantageEstimator) -> None:
    for seed in SEEDS:
        run = toy_rl.rl_run(lambda c: 1.0 if c == (7,) else 0.0, (7,), estimator, seed=seed, steps=12, lr=5e-4,
                            model=toy_rl.toy_model(seed, hidden=256), stop_at=0.9)
        assert run.steps_to(0.9) is not None, (estimator.value, seed, run.p_opt)


@pytest.mark.parametrize("estimator", [AdvantageEstimator.GRPO, AdvantageEstimator.RLOO], ids=lambda e: e.value)
def test_negative_advantage_pushes_a_wrong_token_down(estimator: AdvantageEstimator) -> None:
    """Token 4 pays 0, every other token 1; the first update must lower pi(4) directly (its samples get A < 0)."""
    model = toy_rl.toy_model(0, hidden=256)
    p_wrong = toy_rl.seq_prob(model, (4,))
    run = toy_rl.rl_run(lambda c: 0.0 if c == (4,) else 1.0, (4,), estimator, seed=0, steps=1, lr=5e-4, model=model)
    assert run.p_opt[1] < p_wrong
