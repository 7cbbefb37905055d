"""The policy-gradient loss: one hand-computed case per variant, aggregation, IS weights, KL."""

from __future__ import annotations

import math

import pytest
import torch

from learner.losses import importance_weights, kl_penalty, policy_loss
from learner.types import LossConfig

pytestmark = pytest.mark.unit


def _leaf(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64, requires_grad=True)


def _row(values: list[float], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor([values], dtype=dtype)


def _one_seq(t: int) -> torch.Tensor:
    return torch.zeros(1, t, dtype=torch.long)


RATIOS = [1.5, 0.5, 1.1, 0.7]
ADV = [1.0, 1.0, -1.0, -1.0]


def test_clip_dapo_hand_case() -> None:
    # old = 0, so log pi = log r. Clip range [0.8, 1.28]:
    #   r=1.5, A=+1: min(1.5, 1.28) = 1.28  -> l = -1.28, clipped, no grad
    #   r=0.5, A=+1: min(0.5, 0.8)  = 0.5   -> l = -0.5,  grad -r A = -0.5
    #   r=1.1, A=-1: min(-1.1, -1.1)        -> l = 1.1,   grad 1.1
    #   r=0.7, A=-1: min(-0.7, -0.8) = -0.8 -> l = 0.8,   clipped, no grad
    logp = _leaf([math.log(r) for r in RATIOS])
    zeros = _row([0.0] * 4)
    out = policy_loss(logp, zeros, _row(ADV), _row([1.0] * 4), _one_seq(4), LossConfig.dapo(), old_logp_BT=zeros)
    assert float(out.loss.detach()) == pytest.approx((-1.28 - 0.5 + 1.1 + 0.8) / 4)
    assert out.clipped_sum == 2
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5 / 4, 1.1 / 4, 0.0])


def test_cispo_hand_case_every_token_has_gradient() -> None:
    # weights sg(clip(r, 0, 1.28)) = [1.28, 0.5, 1.1, 0.7]; l = -w A log pi; grad = -w A / 4
    logp = _leaf([math.log(r) for r in RATIOS])
    zeros = _row([0.0] * 4)
    cfg = LossConfig.cispo(eps_high=0.28)
    out = policy_loss(logp, zeros, _row(ADV), _row([1.0] * 4), _one_seq(4), cfg, old_logp_BT=zeros)
    w = [1.28, 0.5, 1.1, 0.7]
    expected = -sum(wi * a * math.log(r) for wi, a, r in zip(w, ADV, RATIOS)) / 4
    assert float(out.loss.detach()) == pytest.approx(expected)
    assert out.clipped_sum == 1  # only r=1.5 is outside [0, 1.28]
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.28 / 4, -0.5 / 4, 1.1 / 4, 0.7 / 4])


def test_gspo_hand_case_sequence_ratio() -> None:
    # seq 0: log ratios [0.1, 0.3] -> s = e^0.2 = 1.2214 > 1.2, A=+1: clipped, l = -1.2 per token, no grad
    # seq 1: log ratios [-0.1, 0.0] -> s = e^-0.05, A=-1: unclipped, l = s per token, dl/dlogp_t = s
    # seq-mean-token-mean: loss = (-1.2 + s) / 2, grad of a seq-1 token = s / 2 / 2
    logp = _leaf([0.1, 0.3, -0.1, 0.0])
    zeros = _row([0.0] * 4)
    seg = torch.tensor([[0, 0, 1, 1]])
    cfg = LossConfig.gspo(eps_low=0.2, eps_high=0.2)
    out = policy_loss(logp, zeros, _row([1.0, 1.0, -1.0, -1.0]), _row([1.0] * 4), seg, cfg, old_logp_BT=zeros)
    s = math.exp(-0.05)
    assert float(out.loss.detach()) == pytest.approx((-1.2 + s) / 2)
    assert out.clipped_sum == 2
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, s / 4, s / 4])


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [("token_mean", -(2 + 3) / 4), ("seq_mean_token_mean", -(2 / 1 + 3 / 3) / 2), ("constant", -(2 + 3) / (2 * 4))],
)
def test_aggregation_modes(aggregation: str, expected: float) -> None:
    # on-policy (ratio 1): l_t = -A_t; sample 0 has 1 token (A=2), sample 1 three (A=1)
    logp = _leaf([-1.0, -2.0, -3.0, -4.0])
    cfg = LossConfig(aggregation=aggregation, norm_length=4, is_correction="none")
    seg = torch.tensor([[0, 1, 1, 1]])
    out = policy_loss(logp, logp.detach(), _row([2.0, 1.0, 1.0, 1.0]), _row([1.0] * 4), seg, cfg)
    assert float(out.loss.detach()) == pytest.approx(expected)


def test_padding_and_loss_mask_are_ignored() -> None:
    logp = _leaf([-1.0, -2.0, -3.0, -4.0])
    seg = torch.tensor([[0, 0, 0, -1]])
    cfg = LossConfig(aggregation="seq_mean_token_mean")
    out = policy_loss(logp, logp.detach(), _row([5.0, 1.0, 1.0, 7.0]), _row([0.0, 1.0, 1.0, 0.0]), seg, cfg)
    assert float(out.loss.detach()) == pytest.approx(-1.0)
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5, -0.5, 0.0])


def test_truncated_and_masked_importance_weights() -> None:
    train = _row([math.log(3.0), 0.0, math.log(0.25), -9.0])
    mu = _row([0.0, 0.0, 0.0, 0.0])
    mask = _row([1.0, 1.0, 1.0, 0.0])  # off the mask: weight 1, never flagged
    w, flagged = importance_weights(train, mu, mask, LossConfig(is_correction="tis", tis_cap=2.0))
    assert w[0].tolist() == pytest.approx([2.0, 1.0, 0.25, 1.0]) and flagged[0].tolist() == [True, False, False, False]
    w, flagged = importance_weights(train, mu, mask, LossConfig(is_correction="mis", mis_low=0.5, mis_high=2.0))
    assert w[0].tolist() == pytest.approx([0.0, 1.0, 0.0, 1.0]) and flagged[0].tolist() == [True, False, True, False]
    w, _ = importance_weights(train, mu, mask, LossConfig(is_correction="none"))
    assert w[0].tolist() == [1.0] * 4


def test_tis_scales_the_token_loss() -> None:
    # on-policy in the trainer, but mu gave token 0 a 3x lower probability: w = min(3, 2) = 2
    logp = _leaf([math.log(0.3), math.log(0.5)])
    mu = _row([math.log(0.1), math.log(0.5)])
    out = policy_loss(logp, mu, _row([1.0, 1.0]), _row([1.0, 1.0]), _one_seq(2), LossConfig(tis_cap=2.0))
    assert float(out.loss.detach()) == pytest.approx(-(2.0 + 1.0) / 2)
    assert (out.is_weight_min, out.is_weight_max, out.is_masked_sum) == pytest.approx((1.0, 2.0, 1.0))
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, -0.5])


def test_kl_estimators() -> None:
    logp, ref = _row([math.log(0.4)]), _row([math.log(0.2)])
    assert float(kl_penalty(logp, ref, "k1")) == pytest.approx(math.log(2.0))
    assert float(kl_penalty(logp, ref, "k3")) == pytest.approx(0.5 - math.log(0.5) - 1.0)


def test_kl_term_enters_the_loss() -> None:
    logp = _leaf([math.log(0.4)] * 2)
    ref = _row([math.log(0.2)] * 2)
    cfg = LossConfig(kl_coef=0.1, kl_estimator="k1")
    out = policy_loss(logp, logp.detach(), _row([0.0, 0.0]), _row([1.0, 1.0]), _one_seq(2), cfg, ref_logp_BT=ref)
    assert float(out.loss.detach()) == pytest.approx(0.1 * math.log(2.0))
    with pytest.raises(ValueError, match="ref_logp_BT"):
        policy_loss(logp, logp.detach(), _row([0.0, 0.0]), _row([1.0, 1.0]), _one_seq(2), cfg)


@pytest.mark.parametrize("preset", ["grpo", "dapo", "cispo", "gspo"])
@pytest.mark.parametrize("correction", ["tis", "mis"])
def test_equal_logprobs_reduce_to_plain_policy_gradient(preset: str, correction: str) -> None:
    """mu == pi_train: every weight is 1 and the gradient is that of -sum(A log pi)/N."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (2, 5), generator=g)
    logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0]
    adv = torch.tensor([[1.0] * 5, [-0.5] * 5], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.float64)
    seg = torch.arange(2)[:, None].expand(2, 5)
    cfg = getattr(LossConfig, preset)(aggregation="token_mean", is_correction=correction)
    out = policy_loss(logp, logp.detach(), adv, mask, seg, cfg)
    assert (out.is_weight_min, out.is_weight_max, out.is_masked_sum, out.clipped_sum) == (1.0, 1.0, 0.0, 0.0)
    (grad,) = torch.autograd.grad(out.loss, logits, retain_graph=True)
    plain = -(adv * logp * mask).sum() / mask.sum()
    (grad_plain,) = torch.autograd.grad(plain, logits)
    torch.testing.assert_close(grad, grad_plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("preset", ["grpo", "dapo", "gspo"])
def test_micro_batches_add_up_to_the_whole_batch(preset: str) -> None:
    """With the whole step's normalisers, per-micro-batch losses sum to the full-batch loss."""
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(3, 6, generator=g, dtype=torch.float64)
    old = logp - 0.1 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 1, dtype=torch.float64, generator=g).expand(3, 6)
    mask = (torch.rand(3, 6, generator=g) > 0.3).double()
    seg = torch.arange(3)[:, None].expand(3, 6)
    cfg = getattr(LossConfig, preset)()
    whole = policy_loss(logp, old, adv, mask, seg, cfg, old_logp_BT=old)
    n_tok, n_seq = int(mask.sum()), int((mask.sum(1) > 0).sum())
    parts = [
        policy_loss(logp[rows], old[rows], adv[rows], mask[rows], seg[rows] - rows.start, cfg,
                    old_logp_BT=old[rows], num_tokens=n_tok, num_seqs=n_seq).loss
        for rows in (slice(0, 1), slice(1, 3))
    ]
    assert float(sum(parts)) == pytest.approx(float(whole.loss), abs=1e-12)
