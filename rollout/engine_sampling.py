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

``sample_fused`` (Triton; the engine's multi-step decode on CUDA when no row
has ``top_p < 1``) is ``sample_static``'s greedy and vocabulary-order rules in
two kernels instead of ~a dozen passes over ``[rows, V]`` fp32 copies: one
program per (row, chunk of the vocabulary) reads the logits once, in their own
dtype, for the chunk's running max and exp-sum at the row's temperature and its
first argmax; one program per row merges the chunks, walks their masses to the
chunk holding ``u`` times the total and scans that chunk alone. The token is
the same inverse-CDF draw (``searchsorted(cdf, u * total, right=True)``), up to
float rounding at a CDF step's edge (sums in another order); the logprob is
the same log-softmax. Tests run the kernels on CPU through Triton's
interpreter (``TRITON_INTERPRET=1``, ``make_kernels()``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

CHUNK = 8192  # vocabulary entries per program of the first kernel
BLOCK = 1024  # entries per loop iteration


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


def make_kernels() -> tuple[Any, Any]:
    """``sample_fused``'s two Triton kernels, built now (``TRITON_INTERPRET`` is read here: tests build them under it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def chunk_kernel(X, TEMP, MX, SM, AV, AI, sx, V, C, CH: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        t = tl.load(TEMP + r)
        t = tl.where(t <= 0, 1.0, t)  # greedy rows: the temperature-1 distribution (the reported logprob's)
        m_b = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
        s_b = tl.zeros([BLOCK], dtype=tl.float32)
        av_b = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
        ai_b = tl.zeros([BLOCK], dtype=tl.int32)
        lo = c * CH
        for start in range(0, CH, BLOCK):
            n = lo + start + tl.arange(0, BLOCK)
            live = n < V
            raw = tl.load(X + r * sx + n, mask=live, other=float("-inf")).to(tl.float32)
            better = raw > av_b  # strict: a lane keeps its first maximum
            av_b = tl.where(better, raw, av_b)
            ai_b = tl.where(better, n, ai_b)
            x = raw / t
            m_new = tl.maximum(m_b, x)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane with no entry yet: exp(-inf) = 0, no NaN
            s_b = s_b * tl.exp(m_b - m_safe) + tl.exp(x - m_safe)
            m_b = m_new
        m = tl.max(m_b, 0)
        s = tl.sum(s_b * tl.exp(m_b - tl.where(m == float("-inf"), 0.0, m)), 0)
        best = tl.max(av_b, 0)
        first = tl.min(tl.where(av_b == best, ai_b, V), 0)
        out = r * C + c
        tl.store(MX + out, m)
        tl.store(SM + out, s)
        tl.store(AV + out, best)
        tl.store(AI + out, first)

    @triton.jit
    def pick_kernel(X, TEMP, U, MX, SM, AV, AI, TOK, LOGP, sx, V, C, CH: tl.constexpr, BLOCK: tl.constexpr,
                    C_PAD: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        k = tl.arange(0, C_PAD)
        kl = k < C
        mx = tl.load(MX + r * C + k, mask=kl, other=float("-inf"))
        sm = tl.load(SM + r * C + k, mask=kl, other=0.0)
        av = tl.load(AV + r * C + k, mask=kl, other=float("-inf"))
        ai = tl.load(AI + r * C + k, mask=kl, other=V)
        m = tl.max(mx, 0)
        w = sm * tl.exp(mx - m)  # each chunk's mass, in units of exp(-m) (a padding chunk: -inf, so 0)
        total = tl.sum(w, 0)
        t_raw = tl.load(TEMP + r)
        greedy = t_raw <= 0
        t = tl.where(greedy, 1.0, t_raw)
        target = tl.load(U + r).to(tl.float32) * total
        cw = tl.cumsum(w, 0)
        last_chunk = tl.max(tl.where(w > 0, k, 0), 0)
        pick_c = tl.minimum(tl.min(tl.where((cw > target) & kl, k, C_PAD), 0), last_chunk)
        resid = target - tl.sum(tl.where(k < pick_c, w, 0.0), 0)
        found = V
        last = 0
        run = 0.0
        lo = pick_c * CH
        for start in range(0, CH, BLOCK):
            n = lo + start + tl.arange(0, BLOCK)
            live = n < V
            x = tl.load(X + r * sx + n, mask=live, other=float("-inf")).to(tl.float32) / t
            p = tl.where(live, tl.exp(x - m), 0.0)
            cs = run + tl.cumsum(p, 0)
            found = tl.minimum(found, tl.min(tl.where((cs > resid) & live, n, V), 0))
            last = tl.maximum(last, tl.max(tl.where(p > 0, n, 0), 0))
            run += tl.sum(p, 0)
        sampled = tl.where(found < V, found, last)  # past the chunk's sum by rounding: its last token with mass
        best = tl.max(av, 0)
        arg = tl.min(tl.where(av == best, ai, V), 0)
        tok = tl.where(greedy, arg, sampled).to(tl.int64)
        x_tok = tl.load(X + r * sx + tok).to(tl.float32) / t
        tl.store(TOK + r, tok)
        tl.store(LOGP + r, x_tok - m - tl.log(total))

    return chunk_kernel, pick_kernel


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any] | None:
    try:
        return make_kernels()
    except Exception:  # noqa: BLE001 - no Triton (or no compiler for it): the caller keeps sample_static
        return None


def fused_available(device: torch.device) -> bool:
    """Whether ``sample_fused`` runs by default here: a CUDA device with Triton importable."""
    return device.type == "cuda" and _kernels() is not None


def sample_fused(
    logits_NV: torch.Tensor, temperature_N: torch.Tensor, u_N: torch.Tensor, kernels: tuple[Any, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_static(..., nucleus=False)`` in two Triton kernels (module docstring): tokens ``[N]`` (int64) and
    logprobs ``[N]`` (fp32). ``logits_NV`` in any float dtype (read as fp32, never copied), last dim contiguous;
    ``temperature_N`` fp32 and ``u_N`` on its device. No host sync: a CUDA graph holds it."""
    kern = kernels or _kernels()
    if kern is None:
        raise RuntimeError("sample_fused: Triton is not importable here")
    chunk_kernel, pick_kernel = kern
    if logits_NV.dim() != 2 or logits_NV.stride(-1) != 1:
        raise ValueError(f"sample_fused: logits must be [N, V] with a contiguous last dim, got {tuple(logits_NV.shape)}")
    n, vocab = logits_NV.shape
    chunks = -(-vocab // CHUNK)
    dev = logits_NV.device
    temp = temperature_N.to(device=dev, dtype=torch.float32).contiguous()
    u = u_N.to(device=dev).contiguous()
    mx = torch.empty((n, chunks), dtype=torch.float32, device=dev)
    sm, av = torch.empty_like(mx), torch.empty_like(mx)
    ai = torch.empty((n, chunks), dtype=torch.int32, device=dev)
    tok = torch.empty(n, dtype=torch.int64, device=dev)
    logp = torch.empty(n, dtype=torch.float32, device=dev)
    stride = logits_NV.stride(0)
    chunk_kernel[(n, chunks)](logits_NV, temp, mx, sm, av, ai, stride, vocab, chunks, CH=CHUNK, BLOCK=BLOCK)
    pick_kernel[(n,)](logits_NV, temp, u, mx, sm, av, ai, tok, logp, stride, vocab, chunks, CH=CHUNK, BLOCK=BLOCK,
                      C_PAD=max(2, 1 << (chunks - 1).bit_length()))
    return tok, logp


__all__ = ["fused_available", "make_kernels", "sample_fused", "sample_rows", "sample_static", "uniforms"]
