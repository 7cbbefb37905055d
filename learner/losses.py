"""The one policy-gradient loss, with the variants people use for agents.

Per loss token ``t`` of sample ``s`` (``m_t = 1``), with ``r_t = pi_theta / pi_old``:

    clip   (PPO/GRPO/DAPO)  l_t = -min(r_t A_t, clip(r_t, 1-eps_low, 1+eps_high) A_t)
    cispo                   l_t = -sg(clip(r_t, 1-eps_low, 1+eps_high)) A_t log pi_theta(y_t)
    gspo   (GSPO-token)     l_t = -min(q_t A_t, clip(q_t, ...) A_t),
                            q_t = sg(rho_s) pi_theta(y_t) / sg(pi_theta(y_t)),
                            rho_s = exp(mean_t in s (log pi_theta - log pi_old))

then ``l_t := w_t l_t + beta KL_t`` and the aggregation (``token_mean``,
``seq_mean_token_mean``, ``constant``) turns them into one number.

``w_t`` corrects for the rollout engine (mu) not being the trainer:
``rho_t = pi_train(y_t) / mu(y_t)`` with pi_train the (detached) trainer
logprob; TIS ``w = min(rho, C)``, MIS ``w = rho * [lo <= rho <= hi]``.
``KL_t`` is k1 ``log pi - log pi_ref`` or k3 ``exp(d) - d - 1`` with
``d = log pi_ref - log pi`` (unbiased, always >= 0).

Why ``pi_old`` defaults to ``sg(pi_theta)``: the synchronous trainer takes
one optimizer step per batch, so the proximal policy *is* the current one;
``r = 1`` in value but carries the gradient of ``log pi``, and the loss is
exactly the policy gradient (the test checks this). Passing the rollout
logprobs as ``old_logp_BT`` makes the clip act on staleness instead (set
``is_correction=none`` then, or the mismatch is counted twice).

DAPO is ``clip`` with eps_high > eps_low and token-mean aggregation; its
data-side parts (dynamic sampling, overlong shaping) are in ``learner.advantages``.
GSPO's sequence ratio uses the GSPO-token form so per-token advantages (MOPD)
still work; with one advantage per sequence it is GSPO exactly.
"""

from __future__ import annotations

import torch

from learner.errors import LearnerConfigError
from learner.types import Aggregation, ISCorrection, LossConfig, LossOutput, LossVariant

__all__ = ["importance_weights", "kl_penalty", "policy_loss", "segment_sum"]


def segment_sum(x_BT: torch.Tensor, seg_BT: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Sum of ``x`` over each packed sample: ``out_S[s] = sum_{seg_BT == s} x_BT``. Padding (seg -1) is dropped."""
    valid_N = seg_BT.reshape(-1) >= 0
    out_S = torch.zeros(num_segments, dtype=x_BT.dtype, device=x_BT.device)
    return out_S.index_add(0, seg_BT.reshape(-1)[valid_N], x_BT.reshape(-1)[valid_N])


def importance_weights(
    train_logp_BT: torch.Tensor, rollout_logp_BT: torch.Tensor, mask_BT: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rollout-vs-trainer weights ``w_BT`` (no grad) and where they differ from ``rho`` (truncated/masked).

    ``rho = exp(log pi_train - log mu)``; TIS ``min(rho, tis_cap)``; MIS ``rho`` if
    ``mis_low <= rho <= mis_high`` else 0. Off the loss mask ``w = 1`` and nothing is flagged.
    """
    on_BT = mask_BT > 0
    log_rho_BT = torch.where(on_BT, train_logp_BT.detach() - rollout_logp_BT, torch.zeros_like(rollout_logp_BT))
    rho_BT = torch.exp(log_rho_BT)
    if cfg.is_correction is ISCorrection.TIS:
        flagged_BT = on_BT & (rho_BT > cfg.tis_cap)
        w_BT = rho_BT.clamp(max=cfg.tis_cap)
    elif cfg.is_correction is ISCorrection.MIS:
        flagged_BT = on_BT & ((rho_BT < cfg.mis_low) | (rho_BT > cfg.mis_high))
        w_BT = torch.where(flagged_BT, torch.zeros_like(rho_BT), rho_BT)
    else:
        flagged_BT = torch.zeros_like(on_BT)
        w_BT = torch.ones_like(rho_BT)
    return w_BT, flagged_BT


def kl_penalty(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate from sampled tokens: k1 ``-d`` or k3 ``e^d - d - 1``, d = ref - logp."""
    d_BT = ref_logp_BT - logp_BT
    if estimator == "k1":
        return -d_BT
    return torch.exp(d_BT) - d_BT - 1.0


def policy_loss(
    logp_BT: torch.Tensor,
    rollout_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    seg_BT: torch.Tensor,
    cfg: LossConfig,
    *,
    old_logp_BT: torch.Tensor | None = None,
    ref_logp_BT: torch.Tensor | None = None,
    num_tokens: int | None = None,
    num_seqs: int | None = None,
    coef_BT: torch.Tensor | None = None,
    count_BT: torch.Tensor | None = None,
) -> LossOutput:
    """The policy-gradient loss of one (micro-)batch; formulas in the module docstring.

    ``logp_BT``: trainer logprobs of the tokens (with grad, fp32, at the sampling
    temperature). ``seg_BT``: sample index of each token (``-1`` = padding); an
    unpacked batch of one sample per row uses ``arange(B)[:, None]``.
    ``num_tokens`` / ``num_seqs``: the normalisers of the *whole* optimizer step
    (loss tokens / samples with at least one loss token), so that micro-batch
    losses add up to the loss of the whole batch under gradient accumulation;
    ``None`` = this batch's own counts.
    ``coef_BT`` / ``count_BT`` (prefix-shared batches, ``learner.tree``): each
    token's aggregation coefficient, already summed over the sequences that
    share it (replaces the aggregation), and how many sequences share it (the
    statistics count it that many times). Not with GSPO (its ratio is per sequence).
    """
    mask_BT = mask_BT.to(logp_BT.dtype)
    on_BT = mask_BT > 0
    zeros_BT = torch.zeros_like(logp_BT)
    old_BT = logp_BT.detach() if old_logp_BT is None else old_logp_BT
    log_ratio_BT = torch.where(on_BT, logp_BT - old_BT, zeros_BT)
    lo, hi = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high

    num_segments = int(seg_BT.max()) + 1 if seg_BT.numel() else 0
    tokens_S = segment_sum(mask_BT, seg_BT, num_segments)
    seg0_BT = seg_BT.clamp(min=0)  # padding indexes segment 0; its mask is 0

    if cfg.variant is LossVariant.CISPO:
        ratio_BT = torch.exp(log_ratio_BT.detach())
        pg_BT = -ratio_BT.clamp(lo, hi) * adv_BT * logp_BT
        clipped_BT = on_BT & ((ratio_BT < lo) | (ratio_BT > hi))
    else:
        if cfg.variant is LossVariant.GSPO:
            seq_log_ratio_S = segment_sum(log_ratio_BT.detach() * mask_BT, seg_BT, num_segments)
            seq_log_ratio_S = seq_log_ratio_S / tokens_S.clamp(min=1.0)
            log_q_BT = seq_log_ratio_S[seg0_BT] + logp_BT - logp_BT.detach()
            ratio_BT = torch.exp(torch.where(on_BT, log_q_BT, zeros_BT))
        else:
            ratio_BT = torch.exp(log_ratio_BT)
        surr_BT = ratio_BT * adv_BT
        surr_clip_BT = ratio_BT.clamp(lo, hi) * adv_BT
        pg_BT = -torch.minimum(surr_BT, surr_clip_BT)
        clipped_BT = on_BT & (surr_clip_BT < surr_BT)

    w_BT, flagged_BT = importance_weights(old_BT, rollout_logp_BT, mask_BT, cfg)
    loss_tok_BT = w_BT * pg_BT
    kl_BT = zeros_BT
    if cfg.kl_coef > 0.0:
        if ref_logp_BT is None:
            raise LearnerConfigError(f"policy_loss: ref_logp_BT: LossConfig.kl_coef={cfg.kl_coef} > 0 needs it, got None")
        kl_BT = torch.where(on_BT, kl_penalty(logp_BT, ref_logp_BT, cfg.kl_estimator), zeros_BT)
        loss_tok_BT = loss_tok_BT + cfg.kl_coef * kl_BT

    n_tok = float(mask_BT.sum()) if num_tokens is None else float(num_tokens)
    n_seq = float((tokens_S > 0).sum()) if num_seqs is None else float(num_seqs)
    if coef_BT is not None:
        if cfg.variant is LossVariant.GSPO:
            raise LearnerConfigError("policy_loss: coef_BT: prefix-shared tokens (trainer.prefix_sharing) need a "
                                     "per-token ratio; loss.variant gspo's is per sequence")
        coef_BT = mask_BT * coef_BT
    elif cfg.aggregation is Aggregation.TOKEN_MEAN:
        coef_BT = mask_BT / max(n_tok, 1.0)
    elif cfg.aggregation is Aggregation.SEQ_MEAN_TOKEN_MEAN:
        coef_BT = mask_BT / (tokens_S.clamp(min=1.0)[seg0_BT] * max(n_seq, 1.0))
    else:
        assert cfg.norm_length is not None  # noqa: S101 - LossConfig validates it
        coef_BT = mask_BT / (max(n_seq, 1.0) * cfg.norm_length)
    loss = (loss_tok_BT * coef_BT).sum()

    with torch.no_grad():
        if count_BT is not None:  # a shared token stands for count_BT tokens of the unshared batch
            cnt_BT = mask_BT * count_BT
            w_on_N = (w_BT * cnt_BT)[on_BT]
            return LossOutput(
                loss=loss, num_tokens=int(cnt_BT.sum()), clipped_sum=float((clipped_BT * cnt_BT).sum()),
                is_weight_sum=float(w_on_N.sum()),
                is_weight_min=float(w_BT[on_BT].min()) if w_on_N.numel() else 1.0,
                is_weight_max=float(w_BT[on_BT].max()) if w_on_N.numel() else 1.0,
                is_masked_sum=float((flagged_BT * cnt_BT).sum()), kl_sum=float((kl_BT * cnt_BT).sum()),
                pg_loss_sum=float((pg_BT * cnt_BT).sum()),
            )
        w_on_N = w_BT[on_BT]
        return LossOutput(
            loss=loss,
            num_tokens=int(mask_BT.sum()),
            clipped_sum=float(clipped_BT.sum()),
            is_weight_sum=float(w_on_N.sum()),
            is_weight_min=float(w_on_N.min()) if w_on_N.numel() else 1.0,
            is_weight_max=float(w_on_N.max()) if w_on_N.numel() else 1.0,
            is_masked_sum=float(flagged_BT.sum()),
            kl_sum=float((kl_BT * mask_BT).sum()),
            pg_loss_sum=float((pg_BT * mask_BT).sum()),
        )
