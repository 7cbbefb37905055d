"""Decode attention over the slot cache that reads only each row's own positions (split-K, Triton).

The engine's decode step attends every row over one bucketed ``length`` (the longest row, rounded up): with
``scaled_dot_product_attention`` and a mask, a row of 600 tokens in a bucket of 2,048 still reads 2,048 keys and
values, and one (row, kv head) pair is one thread block walking the whole length, so 72 rows x 2 kv heads leave
most of a GPU's SMs idle. Here (the flash-decoding scheme) the positions are cut into ``splits`` chunks, one
program per (row, kv head, chunk) reads only the part of its chunk the row covers (``pos`` and the sliding
window, read on the device: nothing syncs, so a CUDA graph holds it), keeps a running max and sum over it, and a
second kernel merges the chunks. A kv head's ``G`` query heads are the rows of one small matrix product (grouped
queries read each key once). The step's own key and value are written into the cache by the same kernel.

The arithmetic is attention's: scores in fp32, the softmax with a running max, probabilities cast to the
cache's dtype for the product with the values (as flash attention does), the merge in fp32.

Rows that share a prompt (a GRPO group's samples, a tree's leaves: ``Engine``'s shared prefill copies one
prompt's keys and values into every slot that has it) can read that prefix from one slot (``src_B`` /
``plen_B``): the group's eight rows then read the same memory, which a decode step's L2 cache holds (at 72 rows
and prompts of ~1,000 tokens a layer's shared prefixes are a few MiB), instead of eight copies from HBM. Each
slot keeps its own copy, so a row can go back to reading it at any time (``SlotModel.vacate``). Used on CUDA for
fp16/bf16 caches when Triton imports (``available``); elsewhere the engine keeps ``scaled_dot_product_attention``.
Tests run the kernels on CPU through Triton's interpreter (``TRITON_INTERPRET=1`` and ``make_kernels()``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

BLOCK_N = 64  # keys per loop iteration
MAX_SPLITS = 16


def make_kernels() -> tuple[Any, Any]:
    """The two Triton kernels, built now (``TRITON_INTERPRET`` is read here: tests build them under it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def split_kernel(
        Q, K, V, POS, M, L, ACC, KN, VN, COS, SIN, CNT, SRC, PLEN, O,
        sq_b, sq_h, sq_g, sk_b, sk_h, sk_l, skn_b, skn_h, svn_b, svn_h, sc_b, so_b, so_h, so_g, chunk, window, scale,
        G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, WINDOWED: tl.constexpr,
        SPLITS: tl.constexpr, STORE: tl.constexpr, ROPE: tl.constexpr, MERGE: tl.constexpr, PREFIX: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a cache past 2**31 elements stays addressable
        h = tl.program_id(1)
        s = tl.program_id(2)
        heads = tl.num_programs(1)
        pos = tl.load(POS + b).to(tl.int32)
        lo = s * chunk
        hi = tl.minimum(lo + chunk, pos + 1)
        if WINDOWED:
            lo = tl.maximum(lo, pos + 1 - window)
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D)
        q = tl.load(Q + b * sq_b + h * sq_h + g[:, None] * sq_g + d[None, :], mask=g[:, None] < G, other=0.0)
        if ROPE:  # q and this step's key come unrotated: x * cos + rotate_half(x) * sin, in fp32, rounded once
            d_rot = (d + D // 2) % D
            sign = tl.where(d < D // 2, -1.0, 1.0)
            cos = tl.load(COS + b * sc_b + d).to(tl.float32)
            sin = tl.load(SIN + b * sc_b + d).to(tl.float32)
            q_rot = tl.load(Q + b * sq_b + h * sq_h + g[:, None] * sq_g + d_rot[None, :], mask=g[:, None] < G,
                            other=0.0)
            q = (q.to(tl.float32) * cos[None, :] + q_rot.to(tl.float32) * (sign * sin)[None, :]).to(q.dtype)
        m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([G_PAD], dtype=tl.float32)
        acc = tl.zeros([G_PAD, D], dtype=tl.float32)
        base = b * sk_b + h * sk_h
        if PREFIX:  # positions below PLEN[b] are read from slot SRC[b] (the same prompt's keys, shared in L2)
            plen = tl.load(PLEN + b).to(tl.int32)
            src_base = tl.load(SRC + b).to(tl.int64) * sk_b + h * sk_h
        if STORE:  # this step's key and value: the chunk holding ``pos`` writes them, and uses them from registers
            kn = tl.load(KN + b * skn_b + h * skn_h + d)
            vn = tl.load(VN + b * svn_b + h * svn_h + d)
            if ROPE:
                kn_rot = tl.load(KN + b * skn_b + h * skn_h + d_rot)
                kn = (kn.to(tl.float32) * cos + kn_rot.to(tl.float32) * sign * sin).to(kn.dtype)
            if pos // chunk == s:
                tl.store(K + base + pos * sk_l + d, kn)
                tl.store(V + base + pos * sk_l + d, vn)
        for start in range(lo, hi, BLOCK):
            n = start + tl.arange(0, BLOCK)
            live = n < hi
            if PREFIX:
                at = tl.where(n < plen, src_base, base) + n.to(tl.int64) * sk_l
            else:
                at = base + n * sk_l
            k = tl.load(K + at[:, None] + d[None, :], mask=live[:, None], other=0.0)
            if STORE:
                k = tl.where((n == pos)[:, None], kn[None, :].to(k.dtype), k)
            qk = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            qk = tl.where(live[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp(qk - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + at[:, None] + d[None, :], mask=live[:, None], other=0.0)
            if STORE:
                v = tl.where((n == pos)[:, None], vn[None, :].to(v.dtype), v)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        row = (b * heads + h) * SPLITS + s
        tl.store(M + row * G_PAD + g, m_i)
        tl.store(L + row * G_PAD + g, l_i)
        tl.store(ACC + (row * G_PAD + g[:, None]) * D + d[None, :], acc)
        if MERGE:  # the last of the pair's chunks to finish merges them all (no second kernel)
            tl.debug_barrier()  # every thread's partial stored before the count says so
            pair = b * heads + h
            if tl.atomic_add(CNT + pair, 1, sem="acq_rel") == SPLITS - 1:
                first = pair * SPLITS
                m_max = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
                for j in tl.static_range(SPLITS):  # .cg: the other chunks' partials from L2, never a stale L1 line
                    m_max = tl.maximum(m_max, tl.load(M + (first + j) * G_PAD + g, cache_modifier=".cg"))
                total = tl.zeros([G_PAD], dtype=tl.float32)
                out = tl.zeros([G_PAD, D], dtype=tl.float32)
                for j in tl.static_range(SPLITS):  # an empty chunk holds -inf: weight 0
                    w = tl.exp(tl.load(M + (first + j) * G_PAD + g, cache_modifier=".cg") - m_max)
                    total += w * tl.load(L + (first + j) * G_PAD + g, cache_modifier=".cg")
                    out += w[:, None] * tl.load(ACC + ((first + j) * G_PAD + g[:, None]) * D + d[None, :],
                                                cache_modifier=".cg")
                tl.store(O + b * so_b + h * so_h + g[:, None] * so_g + d[None, :],
                         (out / total[:, None]).to(O.dtype.element_ty), mask=g[:, None] < G)
                tl.store(CNT + pair, 0)  # every chunk has counted: the next launch starts from zero

    @triton.jit
    def merge_kernel(
        M, L, ACC, O, so_b, so_h, so_g,
        G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        heads = tl.num_programs(1)
        s = tl.arange(0, SPLITS)
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D)
        row = (b * heads + h) * SPLITS + s  # [SPLITS]
        m = tl.load(M + row[:, None] * G_PAD + g[None, :])  # [SPLITS, G_PAD]; an empty chunk holds -inf
        m_max = tl.max(m, 0)
        w = tl.exp(m - m_max[None, :])
        total = tl.sum(w * tl.load(L + row[:, None] * G_PAD + g[None, :]), 0)
        acc = tl.load(ACC + (row[:, None, None] * G_PAD + g[None, :, None]) * D + d[None, None, :])
        out = tl.sum(acc * w[:, :, None], 0) / total[:, None]
        tl.store(O + b * so_b + h * so_h + g[:, None] * so_g + d[None, :], out.to(O.dtype.element_ty),
                 mask=g[:, None] < G)

    return split_kernel, merge_kernel


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any] | None:
    try:
        return make_kernels()
    except Exception:  # noqa: BLE001 - no Triton (or no compiler for it): the caller keeps SDPA
        return None


def shape_ok(head_dim: int) -> bool:
    """Whether the kernels take this head size (a power of two from 16 to 256: Triton's tiles)."""
    return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0


def available(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether ``decode_attention`` runs by default here: a CUDA device, a 16-bit cache, a head size the kernels
    take, Triton importable."""
    return (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and shape_ok(head_dim)
            and _kernels() is not None)


@functools.lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def splits_for(rows: int, kv_heads: int, length: int, device: torch.device) -> int:
    """Chunks per (row, kv head): enough programs for ~4 per SM, chunks of at least ``BLOCK_N`` keys and at most
    1,024, a power of two (the merge kernel's tile)."""
    sms = _sm_count(device.index or 0) if device.type == "cuda" else 132
    want = max(-(-4 * sms // max(rows * kv_heads, 1)), -(-length // 1024), 1)
    want = min(want, max(length // BLOCK_N, 1), MAX_SPLITS)
    return 1 << (want - 1).bit_length()


def decode_attention(
    q_BHGD: torch.Tensor, k_SHLD: torch.Tensor, v_SHLD: torch.Tensor, pos_B: torch.Tensor, length: int,
    scale: float, window: int | None = None, kernels: tuple[Any, Any] | None = None, splits: int | None = None,
    k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None, cos_BD: torch.Tensor | None = None,
    sin_BD: torch.Tensor | None = None, block: int = BLOCK_N, launch: dict[str, int] | None = None,
    counters: torch.Tensor | None = None, src_B: torch.Tensor | None = None, plen_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """Row ``b``'s ``G`` query heads per kv head (``q_BHGD``: ``[B, kv_heads, G, D]``) over its cache positions
    ``0..pos_B[b]`` (and past ``pos_B[b] - window`` when ``window``), of cache rows ``0..B-1``
    (``k_SHLD`` / ``v_SHLD``: ``[slots, kv_heads, cache length, D]``); ``length`` bounds the positions read.
    ``k_new`` / ``v_new`` (``[B, kv_heads, D]``, both or neither): this step's key and value, written into the
    cache at ``pos_B`` by the same kernel (no separate scatter) and attended to. Returns ``[B, kv_heads, G, D]``
    in ``q``'s dtype. ``cos_BD`` / ``sin_BD`` (``[B, D]``, each row's rotary at ``pos_B``; with ``k_new``): ``q`` and
    ``k_new`` come unrotated and the kernel applies the rotary embedding (``x * cos + rotate_half(x) * sin``) to
    both, saving the step a kernel a layer. ``block`` (keys per loop iteration) and ``launch`` (Triton's ``num_warps`` /
    ``num_stages`` for the split kernel) are tuning knobs for benches. ``counters`` (int32 zeros, at least
    ``B * kv_heads``, kept between calls: every call leaves them zero again) merges the chunks inside the split
    kernel: each chunk counts itself done with an atomic and the pair's last one merges them, one launch, not two.
    ``src_B`` / ``plen_B`` (integer ``[B]``, both or neither): row ``b`` reads its positions below ``plen_B[b]`` from
    cache row ``src_B[b]`` (which must hold the same keys and values there) and the rest from its own; the step's
    key and value are written to its own row."""
    kern = kernels or _kernels()
    if kern is None:
        raise RuntimeError("decode_attention: Triton is not importable here")
    split_kernel, merge_kernel = kern
    b, kvh, g, d = q_BHGD.shape
    if k_SHLD.stride(-1) != 1 or v_SHLD.stride() != k_SHLD.stride() or q_BHGD.stride(-1) != 1:
        raise ValueError("decode_attention: the cache's K and V must share strides with a contiguous last dim")
    store = k_new is not None
    if store != (v_new is not None):
        raise ValueError("decode_attention: pass k_new and v_new together")
    kn = k_new if k_new is not None else k_SHLD
    vn = v_new if v_new is not None else v_SHLD
    if store and (kn.shape != (b, kvh, d) or vn.shape != (b, kvh, d) or kn.stride(-1) != 1 or vn.stride(-1) != 1):
        raise ValueError(f"decode_attention: k_new / v_new must be [{b}, {kvh}, {d}] with a contiguous last dim, "
                         f"got {tuple(kn.shape)} and {tuple(vn.shape)}")
    rope = cos_BD is not None
    if rope != (sin_BD is not None) or (rope and not store):
        raise ValueError("decode_attention: pass cos_BD and sin_BD together, and with k_new / v_new")
    cs = cos_BD if cos_BD is not None else q_BHGD
    sn = sin_BD if sin_BD is not None else q_BHGD
    if rope and (cs.shape != (b, d) or sn.shape != (b, d) or cs.stride() != sn.stride() or cs.stride(-1) != 1):
        raise ValueError(f"decode_attention: cos_BD / sin_BD must be [{b}, {d}] with one contiguous layout, "
                         f"got {tuple(cs.shape)} and {tuple(sn.shape)}")
    prefix = src_B is not None
    if prefix != (plen_B is not None):
        raise ValueError("decode_attention: pass src_B and plen_B together")
    if src_B is not None and plen_B is not None and (src_B.shape != (b,) or plen_B.shape != (b,)
                                                     or src_B.dtype.is_floating_point or plen_B.dtype.is_floating_point):
        raise ValueError(f"decode_attention: src_B / plen_B must be integer [{b}], got {src_B.dtype} "
                         f"{tuple(src_B.shape)} and {plen_B.dtype} {tuple(plen_B.shape)}")
    n_split = splits or splits_for(b, kvh, length, q_BHGD.device)
    per_split = -(-length // n_split)  # positions a chunk covers, rounded up to whole blocks
    chunk = -(-per_split // block) * block
    g_pad = max(16, 1 << (g - 1).bit_length())
    dev = q_BHGD.device
    m = torch.empty((b, kvh, n_split, g_pad), dtype=torch.float32, device=dev)
    ls = torch.empty_like(m)
    acc = torch.empty((b, kvh, n_split, g_pad, d), dtype=torch.float32, device=dev)
    out = torch.empty_like(q_BHGD)
    merge = counters is not None
    if counters is not None and (counters.dtype != torch.int32 or counters.numel() < b * kvh
                                 or not counters.is_contiguous() or counters.device != dev):
        raise ValueError(f"decode_attention: counters must be a contiguous int32 tensor of at least {b * kvh} "
                         f"zeros on {dev}, got {counters.dtype} x {counters.numel()} on {counters.device}")
    split_kernel[(b, kvh, n_split)](
        q_BHGD, k_SHLD, v_SHLD, pos_B, m, ls, acc, kn, vn, cs, sn, counters if merge else pos_B,
        src_B if src_B is not None else pos_B, plen_B if plen_B is not None else pos_B, out,
        q_BHGD.stride(0), q_BHGD.stride(1), q_BHGD.stride(2), k_SHLD.stride(0), k_SHLD.stride(1), k_SHLD.stride(2),
        kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1), cs.stride(0), out.stride(0), out.stride(1),
        out.stride(2), chunk, int(window or 0), float(scale),
        G=g, G_PAD=g_pad, D=d, BLOCK=block, WINDOWED=bool(window), SPLITS=n_split, STORE=store, ROPE=rope,
        MERGE=merge, PREFIX=prefix, **(launch or {}),
    )
    if not merge:
        merge_kernel[(b, kvh)](m, ls, acc, out, out.stride(0), out.stride(1), out.stride(2),
                               G=g, G_PAD=g_pad, D=d, SPLITS=n_split)
    return out


def warm_splits(
    kv_heads: int, groups: int, head_dim: int, dtype: torch.dtype, device: torch.device, scale: float,
    windows: set[int | None], rope: bool, merge: bool, kernels: tuple[Any, Any] | None = None, prefix: bool = False,
) -> int:
    """Launch the split-K kernels once for every chunk count (1, 2, 4, .., ``MAX_SPLITS``) and window, on a scratch
    cache with the flags the decode step uses (``rope``: the rotary in the kernel; ``merge``: the chunks merged in
    it; ``prefix``: shared prefixes read from their source slot). Triton compiles one kernel per chunk count, about
    a second each; met first inside a wave (a burst admitted in two parts meets a batch bucket whose chunk count is
    new), that compile stalls every request in flight. Returns the launches made."""
    length = BLOCK_N * MAX_SPLITS
    k = torch.zeros((1, kv_heads, length, head_dim), dtype=dtype, device=device)
    v = torch.zeros_like(k)
    q = torch.zeros((1, kv_heads, groups, head_dim), dtype=dtype, device=device)
    kn = torch.zeros((1, kv_heads, head_dim), dtype=dtype, device=device)
    vn = torch.zeros_like(kn)
    cos = torch.ones((1, head_dim), dtype=dtype, device=device) if rope else None
    sin = torch.zeros((1, head_dim), dtype=dtype, device=device) if rope else None
    counters = torch.zeros(kv_heads, dtype=torch.int32, device=device) if merge else None
    pos = torch.zeros(1, dtype=torch.long, device=device)
    src = torch.zeros(1, dtype=torch.long, device=device) if prefix else None
    plen = torch.zeros(1, dtype=torch.long, device=device) if prefix else None
    launches = 0
    for window in sorted(windows, key=lambda w: w or 0):
        splits = 1
        while splits <= MAX_SPLITS:
            decode_attention(q, k, v, pos, length, scale, window, kernels=kernels, splits=splits, k_new=kn, v_new=vn,
                             cos_BD=cos, sin_BD=sin, counters=counters, src_B=src, plen_B=plen)
            launches += 1
            splits *= 2
    return launches


__all__ = ["available", "decode_attention", "make_kernels", "shape_ok", "splits_for", "warm_splits"]
