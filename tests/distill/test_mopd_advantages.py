"""The MOPD advantage's maths: the clip both ways, and the sampled-token gradient equals the reverse-KL gradient."""

from __future__ import annotations

import math

import pytest
import torch

from distill.advantages import CellStats, mopd_advantage, token_advantages
from learner.losses import policy_loss
from learner.types import ISCorrection, LossConfig

pytestmark = pytest.mark.unit


def test_hand_computed_case_and_clip_both_ways() -> None:
    teacher_N = torch.tensor([-1.0, -9.0, -0.5, -1e4, -2.0])
    student_N = torch.tensor([-2.0, -1.0, -8.0, -3.0, -2.0])
    # gaps: +1, -8, +7.5, -9997, 0 ; R = 3
    assert mopd_advantage(teacher_N, student_N, 3.0).tolist() == [1.0, -3.0, 3.0, -3.0, 0.0]
    stats = CellStats()
    stats.add(teacher_N.tolist(), student_N.tolist(), 3.0, clamped=1)
    m = stats.as_metrics()
    assert stats.clipped_low == 2 and stats.clipped_high == 1
    assert m["mopd/clip_frac"] == pytest.approx(3 / 5)
    assert m["mopd/adv_mean"] == pytest.approx((1 - 3 + 3 - 3 + 0) / 5)
    assert m["mopd/kl"] == pytest.approx(-(1 - 8 + 7.5 - 9997 + 0) / 5)
    assert m["mopd/clamped"] == 1.0


def test_token_advantages_sit_at_the_sampled_positions_and_add_the_outcome_term() -> None:
    adv_T = token_advantages([-1.0, -2.0], [-1.5, -1.0], [3, 5], 7, 10.0, alpha=0.5, outcome=2.0)
    assert adv_T == (0.0, 0.0, 0.0, 0.5 + 1.0, 0.0, -1.0 + 1.0, 0.0)
    assert token_advantages([-1.0], [-1.0], [1], 2, 1.0) == (0.0, 0.0)


def test_the_advantage_carries_no_gradient() -> None:
    student_N = torch.tensor([-1.0, -2.0], requires_grad=True)
    assert not mopd_advantage(torch.tensor([-0.5, -0.5]), student_N, 5.0).requires_grad


def _loss_at(logits_V: torch.Tensor, token: int, adv: float) -> torch.Tensor:
    """The learner's one loss on a two-token sample (prompt, sampled ``token``), ratio 1, no IS weight."""
    logp_V = torch.log_softmax(logits_V, dim=-1)
    logp_BT = torch.stack([torch.zeros(()), logp_V[token]]).unsqueeze(0)
    mask_BT = torch.tensor([[0.0, 1.0]])
    cfg = LossConfig(is_correction=ISCorrection.NONE)
    out = policy_loss(logp_BT, logp_BT.detach(), torch.tensor([[0.0, adv]]), mask_BT, torch.zeros(1, 2, dtype=torch.long), cfg)
    return out.loss


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expected_sampled_token_gradient_equals_the_reverse_kl_gradient(seed: int) -> None:
    """Enumerate a toy vocabulary: sum_y pi_S(y) grad loss(y, A(y)) == grad KL(pi_S || pi_T), analytically."""
    g = torch.Generator().manual_seed(seed)
    vocab = 7
    student_logits_V = torch.randn(vocab, generator=g, dtype=torch.float64) * 2
    teacher_logp_V = torch.log_softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, dim=-1)

    logits_V = student_logits_V.clone().requires_grad_(True)
    p_V = torch.softmax(student_logits_V, dim=-1)
    expected_V = torch.zeros(vocab, dtype=torch.float64)
    for y in range(vocab):
        logp_y = torch.log_softmax(student_logits_V, dim=-1)[y]
        adv = float(mopd_advantage(teacher_logp_V[y], logp_y, clip=1e9))  # R large: no clipping
        (grad_V,) = torch.autograd.grad(_loss_at(logits_V.float(), y, adv), logits_V)
        expected_V += p_V[y] * grad_V

    # analytic: d/dz KL(p || q) = p * (log p - log q - KL)
    logp_V = torch.log_softmax(student_logits_V, dim=-1)
    kl = float((p_V * (logp_V - teacher_logp_V)).sum())
    analytic_V = p_V * (logp_V - teacher_logp_V - kl)
    # and autograd's own gradient of the closed-form reverse KL agrees with the analytic one
    z_V = student_logits_V.clone().requires_grad_(True)
    kl_auto = (torch.softmax(z_V, -1) * (torch.log_softmax(z_V, -1) - teacher_logp_V)).sum()
    (auto_V,) = torch.autograd.grad(kl_auto, z_V)
    torch.testing.assert_close(auto_V, analytic_V)
    torch.testing.assert_close(expected_V, analytic_V, atol=1e-5, rtol=1e-4)  # the loss runs in float32
    assert math.isfinite(kl) and kl > 0


def test_identical_teacher_and_student_give_exactly_zero_gradient() -> None:
    logits_V = torch.randn(5, requires_grad=True)
    logp = torch.log_softmax(logits_V.detach(), -1)
    for y in range(5):
        adv = float(mopd_advantage(logp[y], logp[y], 5.0))
        assert adv == 0.0
        (grad_V,) = torch.autograd.grad(_loss_at(logits_V, y, adv), logits_V)
        assert torch.count_nonzero(grad_V) == 0
