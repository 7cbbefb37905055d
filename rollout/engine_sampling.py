"""Per-request sampling for a batch of rows, reproducible whatever the batch holds.

Each row has its own temperature, top-p and a stream of uniforms ``u`` drawn
up front from the request's own seeded generator (``uniforms``): the token is
the inverse CDF of the row's distribution at ``u``, so a request samples the
same tokens alone or beside 255 others (the batch only changes which rows sit
next to it). Rows with ``top_p < 1`` walk the CDF in descending-probability
order over the nucleus (the smallest prefix whose mass reaches ``top_p``,
renormalised); rows with ``top_p == 1`` walk it in vocabulary order. Which
rule a row follows depends only on its own ``top_p``.

The reported logprob is ``HFPolicy``'s: the fp32 log-softmax of the logits at
the row's temperature over the full vocabulary (before top-p); greedy rows
(``temperature == 0``) take the argmax and report the temperature-1 logprob.

``sample_rows`` picks the rows of each rule with ``nonzero`` (a host sync);
``sample_static`` computes every rule for every row and selects, with no sync
and no data-dependent shape, so a CUDA graph can hold it (the engine's
multi-step decode). Row for row the two do the same arithmetic.
"""

from __future__ import annotations

import torch


def uniforms(seed: int | None, count: int) -> torch.Tensor:
    """``count`` uniforms in [0, 1) from a generator seeded with ``seed`` (None: a fresh nondeterministic seed)."""
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return torch.rand(max(count, 0), generator=gen, dtype=torch.float64)


def _inverse_cdf(probs_NV: torch.Tensor, u_N: torch.Tensor) -> torch.Tensor:
    cdf_NV = torch.cumsum(probs_NV, dim=-1)
    target_N1 = (u_N.to(cdf_NV.dtype) * cdf_NV[:, -1]).unsqueeze(-1)
    idx_N = torch.searchsorted(cdf_NV, target_N1, right=True).squeeze(-1)
    return idx_N.clamp_(max=probs_NV.shape[-1] - 1)


def sample_rows(
    logits_NV: torch.Tensor, temperature_N: torch.Tensor, top_p_N: torch.Tensor, u_N: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``[N]`` and their reported logprobs ``[N]`` (fp32) for rows of logits; see the module docstring."""
    logits_NV = logits_NV.float()
    device = logits_NV.device
    temperature_N, top_p_N, u_N = temperature_N.to(device), top_p_N.to(device), u_N.to(device)
    greedy_N = temperature_N <= 0
    scaled_NV = logits_NV / torch.where(greedy_N, torch.ones_like(temperature_N), temperature_N).unsqueeze(-1)
    logp_NV = torch.log_softmax(scaled_NV, dim=-1)
    token_N = torch.argmax(logits_NV, dim=-1)
    plain = (~greedy_N & (top_p_N >= 1)).nonzero().squeeze(-1)
    nucleus = (~greedy_N & (top_p_N < 1)).nonzero().squeeze(-1)
    if plain.numel():
        token_N[plain] = _inverse_cdf(logp_NV[plain].exp(), u_N[plain])
    if nucleus.numel():
        probs_MV = logp_NV[nucleus].exp()
        sorted_MV, order_MV = torch.sort(probs_MV, dim=-1, descending=True, stable=True)
        before_MV = torch.cumsum(sorted_MV, dim=-1) - sorted_MV
        kept_MV = sorted_MV * (before_MV < top_p_N[nucleus].unsqueeze(-1))
        pick_M = _inverse_cdf(kept_MV, u_N[nucleus])
        token_N[nucleus] = order_MV.gather(-1, pick_M.unsqueeze(-1)).squeeze(-1)
    return token_N, logp_NV.gather(-1, token_N.unsqueeze(-1)).squeeze(-1)


def sample_static(
    logits_NV: torch.Tensor, temperature_N: torch.Tensor, top_p_N: torch.Tensor, u_N: torch.Tensor, nucleus: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_rows`` without a host sync (CUDA-graph safe); ``nucleus=False`` treats every row as ``top_p == 1``
    (the caller passes True whenever a row has ``top_p < 1``: the sort over the vocabulary is then paid for all)."""
    logits_NV = logits_NV.float()
    greedy_N = temperature_N <= 0
    scaled_NV = logits_NV / torch.where(greedy_N, torch.ones_like(temperature_N), temperature_N).unsqueeze(-1)
    logp_NV = torch.log_softmax(scaled_NV, dim=-1)
    probs_NV = logp_NV.exp()
    token_N = _inverse_cdf(probs_NV, u_N)
    if nucleus:
        sorted_NV, order_NV = torch.sort(probs_NV, dim=-1, descending=True, stable=True)
        before_NV = torch.cumsum(sorted_NV, dim=-1) - sorted_NV
        kept_NV = sorted_NV * (before_NV < top_p_N.unsqueeze(-1))
        nuc_N = order_NV.gather(-1, _inverse_cdf(kept_NV, u_N).unsqueeze(-1)).squeeze(-1)
        token_N = torch.where(top_p_N < 1, nuc_N, token_N)
    token_N = torch.where(greedy_N, torch.argmax(logits_NV, dim=-1), token_N)
    return token_N, logp_NV.gather(-1, token_N.unsqueeze(-1)).squeeze(-1)


__all__ = ["sample_rows", "sample_static", "uniforms"]
