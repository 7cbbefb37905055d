"""Toy problems with known optima on the real learner (advantages, packing, loss, Trainer); see toy_rl.py.

Measured (hidden 256, lr 5e-4 = the quickstart's RL lr, 4 groups x 8 samples, steps until the optimum
has probability >= 0.9, seeds 0/1/2):

| estimator    | bandit | two-step |
| ------------ | ------ | -------- |
| grpo         | 4/5/4  | 15/13/15 |
| dr_grpo      | 4/5/4  | 14/11/14 |
| rloo         | 4/5/4  | 15/10/14 |
| reinforce_pp | 4/5/4  | 14/10/14 |
| reinforce    | 3/4/3  | 15/9/13  |

The bounds below (12 and 30 steps) are about twice that. The wrong-token task checks that a token
paying 0 loses probability on the first update, through the negative advantages of its samples.
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


def two_step_reward(c: tuple[int, ...]) -> float:
    """1 for the sequence (5, 9); a quarter for the right first token alone; 0 otherwise."""
    return 1.0 if c == (5, 9) else (0.25 if c[0] == 5 else 0.0)


@pytest.mark.parametrize("estimator", list(AdvantageEstimator), ids=lambda e: e.value)
def test_two_step_sequence_converges(estimator: AdvantageEstimator) -> None:
    """The second token's credit depends on the first: the optimum is a sequence, not two independent arms."""
    for seed in SEEDS:
        run = toy_rl.rl_run(two_step_reward, (5, 9), estimator, seed=seed, steps=30, lr=5e-4,
                            model=toy_rl.toy_model(seed, hidden=256), stop_at=0.9)
        assert run.steps_to(0.9) is not None, (estimator.value, seed, run.p_opt)
        assert run.p_opt[0] < 0.01, f"the toy starts near its optimum already: {run.p_opt[0]}"
