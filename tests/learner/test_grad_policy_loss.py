"""``policy_loss`` and its gradient on a fixed batch, against a reference written here from the formulas.

The reference is deliberately naive (python loops over samples and tokens, no
masking tricks, no segment sums), so a shared bug is unlikely. Covered: every
aggregation mode, the clip on both sides with positive and negative
advantages, and the direction and relative size of the gradient on the
sampled tokens' logprobs.
"""

from __future__ import annotations

import math

import pytest
import torch

from learner.losses import policy_loss
from learner.types import Aggregation, LossConfig

pytestmark = pytest.mark.unit

# Two packed rows, three samples: (row 0: sample 0 = 4 tokens, sample 1 = 3 tokens), (row 1: sample 2 = 5 tokens).
SEGS = [[0, 0, 0, 0, 1, 1, 1], [2, 2, 2, 2, 2, -1, -1]]
MASK = [[0, 1, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 0, 0]]
ADV = [1.5, -0.5, -1.0]


def _batch(seed: int = 0, spread: float = 0.3) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    old_BT = -torch.rand(2, 7, generator=g) * 2 - 0.1
    logp_BT = old_BT + (torch.rand(2, 7, generator=g) - 0.5) * 2 * spread  # ratios in ~[0.74, 1.35]
    seg_BT = torch.tensor(SEGS)
    mask_BT = torch.tensor(MASK, dtype=torch.float32)
    adv_BT = torch.tensor([[ADV[s] if s >= 0 else 0.0 for s in row] for row in SEGS])
    return logp_BT, old_BT, seg_BT, mask_BT, adv_BT


def _reference(logp: list[list[float]], old: list[list[float]], cfg: LossConfig) -> float:
    """sum over samples s, tokens t of  coef(s, t) * -min(r A, clip(r, 1-el, 1+eh) A),  by the definitions."""
    per_sample: dict[int, list[float]] = {}
    for b, row in enumerate(SEGS):
        for t, s in enumerate(row):
            if s < 0 or not MASK[b][t]:
                continue
            r = math.exp(logp[b][t] - old[b][t])
            a = ADV[s]
            clipped = min(max(r, 1 - cfg.eps_low), 1 + cfg.eps_high)
            per_sample.setdefault(s, []).append(-min(r * a, clipped * a))
    n_tok = sum(len(v) for v in per_sample.values())
    n_seq = len(per_sample)
    if cfg.aggregation is Aggregation.TOKEN_MEAN:
        return sum(sum(v) for v in per_sample.values()) / n_tok
    if cfg.aggregation is Aggregation.SEQ_MEAN_TOKEN_MEAN:
        return sum(sum(v) / len(v) for v in per_sample.values()) / n_seq
    assert cfg.norm_length is not None
    return sum(sum(v) for v in per_sample.values()) / (n_seq * cfg.norm_length)


def _loss(cfg: LossConfig, logp_BT: torch.Tensor, old_BT: torch.Tensor) -> torch.Tensor:
    _, _, seg_BT, mask_BT, adv_BT = _batch()
    return policy_loss(logp_BT, old_BT, adv_BT, mask_BT, seg_BT, cfg, old_logp_BT=old_BT).loss


AGGS = [
    LossConfig(aggregation="token_mean", is_correction="none"),
    LossConfig(aggregation="seq_mean_token_mean", is_correction="none"),
    LossConfig(aggregation="constant", norm_length=6, is_correction="none"),
]


@pytest.mark.parametrize("cfg", AGGS, ids=lambda c: c.aggregation.value)
@pytest.mark.parametrize("spread", [0.0, 0.3, 0.8])  # 0.8: many ratios outside [0.8, 1.2], the clip acts
def test_loss_matches_the_formula(cfg: LossConfig, spread: float) -> None:
    logp_BT, old_BT, *_ = _batch(spread=spread)
    got = float(_loss(cfg, logp_BT, old_BT))
    want = _reference(logp_BT.tolist(), old_BT.tolist(), cfg)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("cfg", AGGS, ids=lambda c: c.aggregation.value)
@pytest.mark.parametrize("spread", [0.0, 0.8])
def test_gradient_matches_finite_differences_of_the_reference(cfg: LossConfig, spread: float) -> None:
    logp_BT, old_BT, *_ = _batch(seed=3, spread=spread)
    x_BT = logp_BT.clone().double().requires_grad_(True)
    _loss(cfg, x_BT, old_BT.double()).backward()
    assert x_BT.grad is not None
    h = 1e-6
    for b in range(2):
        for t in range(7):
            up, down = logp_BT.double().tolist(), logp_BT.double().tolist()
            up[b][t] += h
            down[b][t] -= h
            fd = (_reference(up, old_BT.tolist(), cfg) - _reference(down, old_BT.tolist(), cfg)) / (2 * h)
            assert float(x_BT.grad[b, t]) == pytest.approx(fd, rel=1e-4, abs=1e-6), (b, t)


def test_on_policy_gradient_is_minus_advantage_times_the_token_weight() -> None:
    """At r = 1 (pi_old = sg(pi)) d loss / d logp_t = -A_s * coef_t: positive advantages push a sampled
    token's logprob up, negative ones down, in proportion to |A| and to the aggregation's weight."""
    logp_BT, _, seg_BT, mask_BT, adv_BT = _batch()
    tokens = {0: 3, 1: 2, 2: 3}  # loss tokens per sample
    for cfg in AGGS:
        x_BT = logp_BT.clone().requires_grad_(True)
        policy_loss(x_BT, logp_BT.detach(), adv_BT, mask_BT, seg_BT, cfg).loss.backward()
        assert x_BT.grad is not None
        for b, row in enumerate(SEGS):
            for t, s in enumerate(row):
                g = float(x_BT.grad[b, t])
                if s < 0 or not MASK[b][t]:
                    assert g == 0.0
                    continue
                if cfg.aggregation is Aggregation.TOKEN_MEAN:
                    coef = 1 / 8
                elif cfg.aggregation is Aggregation.SEQ_MEAN_TOKEN_MEAN:
                    coef = 1 / (3 * tokens[s])
                else:
                    coef = 1 / (3 * 6)
                assert g == pytest.approx(-ADV[s] * coef, rel=1e-6)
                # descent (logp -= lr * grad) raises the logprob exactly when the advantage is positive
                assert (g < 0) == (ADV[s] > 0)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_clip_stops_the_gradient_only_on_the_side_that_would_overshoot(adv: float) -> None:
    """PPO clip: with A > 0 a token whose ratio is already above 1 + eps gets no gradient (below 1 - eps it
    still does); with A < 0 the reverse. eps_low 0.2, eps_high 0.28 (DAPO)."""
    cfg = LossConfig.dapo(is_correction="none")
    old_BT = torch.zeros(1, 4)
    ratios = [0.7, 0.95, 1.1, 1.4]
    logp_BT = torch.log(torch.tensor([ratios])).requires_grad_(True)
    seg_BT = torch.zeros(1, 4, dtype=torch.long)
    mask_BT = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    out = policy_loss(logp_BT, old_BT, torch.full((1, 4), adv), mask_BT, seg_BT, cfg, old_logp_BT=old_BT)
    out.loss.backward()
    assert logp_BT.grad is not None
    grad = logp_BT.grad[0].tolist()
    for r, g in zip(ratios, grad):
        clipped = (adv > 0 and r > 1 + cfg.eps_high) or (adv < 0 and r < 1 - cfg.eps_low)
        if clipped:
            assert g == 0.0, (r, g)
        else:  # d/dlogp of -r A / n = -r A / n
            assert g == pytest.approx(-r * adv / 4, rel=1e-6), (r, g)
    assert out.clipped_sum == sum(
        1 for r in ratios if (adv > 0 and r > 1 + cfg.eps_high) or (adv < 0 and r < 1 - cfg.eps_low)
    )


def test_one_sgd_step_moves_logprobs_by_the_advantage_ratio() -> None:
    """A free logit per sampled token, one plain SGD step on the loss: the sampled tokens' logprobs move in
    the direction of their advantages, and by amounts in the ratio of the advantages (small step)."""
    torch.manual_seed(0)
    logits_SV = torch.zeros(3, 5, requires_grad=True)  # three one-token samples over a 5-token vocabulary
    tokens = torch.tensor([1, 2, 3])
    adv_S = torch.tensor([2.0, 1.0, -1.0])
    logp_S = torch.log_softmax(logits_SV, -1).gather(1, tokens[:, None])[:, 0]
    cfg = LossConfig(aggregation="token_mean", is_correction="none")
    loss = policy_loss(logp_S[None], logp_S.detach()[None], adv_S[None], torch.ones(1, 3),
                       torch.arange(3)[None], cfg).loss
    loss.backward()
    assert logits_SV.grad is not None
    with torch.no_grad():
        new_logp_S = torch.log_softmax(logits_SV - 1e-3 * logits_SV.grad, -1).gather(1, tokens[:, None])[:, 0]
        delta_S = new_logp_S - logp_S.detach()
    assert delta_S[0] > 0 and delta_S[1] > 0 and delta_S[2] < 0
    assert float(delta_S[0] / delta_S[1]) == pytest.approx(2.0, rel=1e-3)
    assert float(delta_S[2] / delta_S[1]) == pytest.approx(-1.0, rel=1e-3)
