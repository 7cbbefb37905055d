"""Run by ``test_engine_attention.py`` in a child pytest with ``TRITON_INTERPRET=1`` (the kernels on CPU): the
split-K decode attention and the fused sampler."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from rollout import engine_attention, engine_sampling
from rollout.engine import Engine, EngineRequest
from rollout.engine_model import SlotModel
from rollout.engine_sampling import sample_fused, sample_static
from rollout.policy.models import tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture()
def interpreted() -> Iterator[tuple[Any, Any]]:
    """The kernels as Triton's interpreter runs them (numpy on the CPU), also as the module's cached pair."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through test_engine_attention.py"
    yield engine_attention._kernels() or pytest.fail("Triton did not import")


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, length: int,
               window: int | None) -> torch.Tensor:
    j = torch.arange(length)
    mask = j[None] <= pos[:, None]
    if window:
        mask &= j[None] > pos[:, None] - window
    b = q.shape[0]
    return F.scaled_dot_product_attention(q, k[:b, :, :length], v[:b, :, :length], attn_mask=mask[:, None, None, :],
                                          scale=0.125)


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("splits", [1, 2, 8])
def test_kernels_match_masked_sdpa(interpreted: tuple[Any, Any], window: int | None, splits: int) -> None:
    g = torch.Generator().manual_seed(3)
    slots, heads, groups, dim, cache_len, length = 6, 2, 7, 64, 300, 256
    k = torch.randn(slots, heads, cache_len, dim, generator=g)
    v = torch.randn(slots, heads, cache_len, dim, generator=g)
    q = torch.randn(5, heads, groups, dim, generator=g)
    pos = torch.tensor([0, 17, 64, 200, 255])  # one key; a chunk's edge; the bucket's last position
    got = engine_attention.decode_attention(q, k, v, pos, length, 0.125, window=window, kernels=interpreted,
                                            splits=splits)
    assert (got - _reference(q, k, v, pos, length, window)).abs().max().item() < 1e-5
    # positions past a row's own are never read: poisoning them changes nothing
    k2, v2 = k.clone(), v.clone()
    for row, p in enumerate(pos.tolist()):
        k2[row, :, p + 1:] = float("nan")
        v2[row, :, p + 1:] = float("nan")
    again = engine_attention.decode_attention(q, k2, v2, pos, length, 0.125, window=window, kernels=interpreted,
                                              splits=splits)
    assert torch.equal(again, got)


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("splits", [1, 4, 8])
def test_the_split_kernel_merges_the_chunks_itself_with_counters(interpreted: tuple[Any, Any], window: int | None,
                                                                 splits: int) -> None:
    g = torch.Generator().manual_seed(5)
    slots, heads, groups, dim, cache_len, length = 6, 2, 7, 64, 300, 256
    k = torch.randn(slots, heads, cache_len, dim, generator=g)
    v = torch.randn(slots, heads, cache_len, dim, generator=g)
    q = torch.randn(5, heads, groups, dim, generator=g)
    pos = torch.tensor([0, 17, 64, 200, 255])  # row 0: one key, every other chunk empty
    two = engine_attention.decode_attention(q, k, v, pos, length, 0.125, window=window, kernels=interpreted,
                                            splits=splits)
    counters = torch.zeros(slots * heads, dtype=torch.int32)
    for _ in range(2):  # the second call finds the counters back at zero
        one = engine_attention.decode_attention(q, k, v, pos, length, 0.125, window=window, kernels=interpreted,
                                                splits=splits, counters=counters)
        assert (one - two).abs().max().item() < 1e-6
        assert (one - _reference(q, k, v, pos, length, window)).abs().max().item() < 1e-5
        assert not counters.any()
    with pytest.raises(ValueError, match="counters must be"):
        engine_attention.decode_attention(q, k, v, pos, length, 0.125, kernels=interpreted, counters=counters[:3])
    with pytest.raises(ValueError, match="counters must be"):
        engine_attention.decode_attention(q, k, v, pos, length, 0.125, kernels=interpreted,
                                          counters=counters.long())


@pytest.mark.parametrize("splits", [1, 4])
def test_the_kernel_writes_the_steps_key_and_value_and_attends_to_them(interpreted: tuple[Any, Any], splits: int) -> None:
    g = torch.Generator().manual_seed(5)
    k = torch.randn(4, 2, 128, 16, generator=g)
    v = torch.randn(4, 2, 128, 16, generator=g)
    q = torch.randn(3, 2, 2, 16, generator=g)
    k_new = torch.randn(3, 2, 1, 16, generator=g)[:, :, 0]  # a strided view, as the decode step passes it
    v_new = torch.randn(3, 2, 1, 16, generator=g)[:, :, 0]
    pos = torch.tensor([0, 31, 100])
    want_k, want_v = k.clone(), v.clone()
    for row, p in enumerate(pos.tolist()):
        want_k[row, :, p] = k_new[row]
        want_v[row, :, p] = v_new[row]
    want = _reference(q, want_k, want_v, pos, 128, None)
    got = engine_attention.decode_attention(q, k, v, pos, 128, 0.125, kernels=interpreted, splits=splits,
                                            k_new=k_new, v_new=v_new)
    assert (got - want).abs().max().item() < 1e-5
    assert torch.equal(k, want_k) and torch.equal(v, want_v)  # written at each row's position, nowhere else
    with pytest.raises(ValueError, match="together"):
        engine_attention.decode_attention(q, k, v, pos, 128, 0.125, kernels=interpreted, k_new=k_new)
    with pytest.raises(ValueError, match=r"k_new / v_new must be \[3, 2, 16\]"):
        engine_attention.decode_attention(q, k, v, pos, 128, 0.125, kernels=interpreted, k_new=k_new[:2],
                                          v_new=v_new[:2])


def test_the_kernel_applies_the_rotary_embedding_to_q_and_the_new_key(interpreted: tuple[Any, Any]) -> None:
    g = torch.Generator().manual_seed(6)
    k = torch.randn(3, 2, 96, 16, generator=g)
    v = torch.randn(3, 2, 96, 16, generator=g)
    q = torch.randn(3, 1, 4, 16, generator=g)[:, 0].reshape(3, 2, 2, 16)  # [B, heads, D] viewed as [B, kv, G, D]
    k_new = torch.randn(3, 1, 2, 16, generator=g)[:, 0]  # [B, kv_heads, D], unrotated
    v_new = torch.randn(3, 1, 2, 16, generator=g)[:, 0]
    pos = torch.tensor([7, 40, 95])
    angle = pos[:, None].float() * torch.rand(1, 8, generator=g)
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)  # [B, D], as HF's rotary gives

    def rotate(x: torch.Tensor) -> torch.Tensor:  # HF's x * cos + rotate_half(x) * sin, the row's angle on every head
        c, s = cos.view(3, *([1] * (x.dim() - 2)), 16), sin.view(3, *([1] * (x.dim() - 2)), 16)
        return x * c + torch.cat((-x[..., 8:], x[..., :8]), -1) * s

    k2, v2 = k.clone(), v.clone()
    want = engine_attention.decode_attention(rotate(q), k2, v2, pos, 96, 0.25, kernels=interpreted,
                                             k_new=rotate(k_new), v_new=v_new)
    got = engine_attention.decode_attention(q, k, v, pos, 96, 0.25, kernels=interpreted, k_new=k_new, v_new=v_new,
                                            cos_BD=cos, sin_BD=sin)
    assert (got - want).abs().max().item() < 1e-5
    assert (k - k2).abs().max().item() < 1e-5 and torch.equal(v, v2)  # the cache holds the rotated key
    with pytest.raises(ValueError, match="cos_BD and sin_BD together"):
        engine_attention.decode_attention(q, k, v, pos, 96, 0.25, kernels=interpreted, cos_BD=cos, sin_BD=sin)
    with pytest.raises(ValueError, match=r"cos_BD / sin_BD must be \[3, 16\]"):
        engine_attention.decode_attention(q, k, v, pos, 96, 0.25, kernels=interpreted, k_new=k_new, v_new=v_new,
                                          cos_BD=cos[:, :8], sin_BD=sin[:, :8])


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("window", [None, 40])
def test_rows_read_a_shared_prefix_from_its_source_slot(interpreted: tuple[Any, Any], splits: int,
                                                         window: int | None) -> None:
    """Rows 1 and 3 copied row 0's first 150 positions (not a whole block: one block reads both slots): with
    ``src_B`` / ``plen_B`` they read them from slot 0, so poisoning their own copies changes nothing, and the step's
    key and value still go to their own slots."""
    g = torch.Generator().manual_seed(8)
    slots, heads, groups, dim, length, plen = 5, 2, 7, 16, 256, 150
    k = torch.randn(slots, heads, length, dim, generator=g)
    v = torch.randn(slots, heads, length, dim, generator=g)
    for row in (1, 3):
        k[row, :, :plen], v[row, :, :plen] = k[0, :, :plen], v[0, :, :plen]
    q = torch.randn(4, heads, groups, dim, generator=g)
    k_new = torch.randn(4, heads, dim, generator=g)
    v_new = torch.randn(4, heads, dim, generator=g)
    pos = torch.tensor([200, 170, 30, 255])
    k_want, v_want = k.clone(), v.clone()
    want = engine_attention.decode_attention(q, k_want, v_want, pos, length, 0.125, window=window, kernels=interpreted,
                                             splits=splits, k_new=k_new, v_new=v_new)
    for row in (1, 3):
        k[row, :, :plen] = float("nan")
        v[row, :, :plen] = float("nan")
    src, plens = torch.tensor([0, 0, 2, 0]), torch.tensor([0, plen, 0, plen])
    got = engine_attention.decode_attention(q, k, v, pos, length, 0.125, window=window, kernels=interpreted,
                                            splits=splits, k_new=k_new, v_new=v_new, src_B=src, plen_B=plens)
    assert torch.equal(got, want)
    for row, p in enumerate(pos.tolist()):  # written into the row's own slot only
        assert torch.equal(k[row, :, p], k_new[row]) and torch.equal(v[row, :, p], v_new[row])
    assert torch.equal(k[0], k_want[0]) and torch.equal(v[0], v_want[0])
    # without them the poisoned copies are read: the test can fail
    poisoned = engine_attention.decode_attention(q, k, v, pos, length, 0.125, window=window, kernels=interpreted,
                                                 splits=splits)
    assert poisoned[[1, 3]].isnan().any() if window is None else poisoned[1].isnan().any()
    with pytest.raises(ValueError, match="src_B and plen_B together"):
        engine_attention.decode_attention(q, k, v, pos, length, 0.125, kernels=interpreted, src_B=src)
    with pytest.raises(ValueError, match=r"src_B / plen_B must be integer \[4\]"):
        engine_attention.decode_attention(q, k, v, pos, length, 0.125, kernels=interpreted, src_B=src[:3],
                                          plen_B=plens[:3])


def test_copies_read_their_prompt_from_the_source_slot_until_it_is_vacated(interpreted: tuple[Any, Any],
                                                                            tiny: Any) -> None:
    """``copy_prefix`` points the copies' reads at the source slot; ``vacate`` (its request ended) hands the source
    role to the first copy, so a new request's prefill over the old source changes nothing the copies read."""
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    prompt, other = tok.encode("Count the lines of a.txt, please."), tok.encode("hi there")
    n = len(prompt)
    sm = SlotModel(model, slots=4, length=64, attention="triton")
    assert sm.shared_reads
    sm.prefill([0], [prompt])
    want = sm.decode([5, 5, 5], [n, n, n], 3, 64)[0]

    def poison(slot: int) -> None:
        for cache in sm.k + sm.v:
            cache[slot, :, :n] = float("nan")

    sm.prefill([0], [prompt])
    sm.copy_prefix(0, [1, 2], n)
    assert sm._reads == {1: (0, n), 2: (0, n)}
    poison(1)
    poison(2)
    got = sm.decode([5, 5, 5], [n, n, n], 3, 64)
    assert (got - want).abs().max().item() < 1e-5  # every row: the copies read slot 0's prompt
    sm.prefill([0], [prompt])
    sm.copy_prefix(0, [1, 2], n)
    sm.vacate(0)
    assert sm._reads == {2: (1, n)}
    sm.prefill([0], [other])  # the freed slot gets a new request
    poison(0)
    got = sm.decode([5, 5, 5], [n, n, n], 3, 64)
    assert (got[1:3] - want).abs().max().item() < 1e-5
    sm.vacate(2)
    assert sm._reads == {}
    off = SlotModel(model, slots=4, length=64, attention="triton", shared_reads=False)
    off.prefill([0], [prompt])
    off.copy_prefix(0, [1], n)
    assert not off.shared_reads and off._reads == {}


@pytest.mark.parametrize("overlap", [False, True])
def test_engine_copies_keep_their_prompt_when_its_source_request_ends_first(interpreted: tuple[Any, Any],
                                                                             tiny: Any, overlap: bool) -> None:
    """A group's first request ends after two tokens, its slot idles through a decode call, then a new request takes
    it while the copies decode: the copies' tokens and logprobs are those of an engine whose copies read their own
    slots (with ``overlap`` too: the source ends while the next call is already under way)."""
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    prompt = tok.encode("Count the lines of a.txt, please.")
    group = [EngineRequest(prompt_ids=prompt, max_new_tokens=2 if i == 0 else 14, temperature=1.0, seed=i)
             for i in range(4)]
    late = EngineRequest(prompt_ids=tok.encode("hi there, list the files"), max_new_tokens=6, temperature=1.0, seed=9)
    outs = {}
    for shared in (True, False):
        engine = Engine(model, tok, admission_window_s=0.05, decode_steps=2, attention="triton", share_prompts=True,
                        shared_reads=shared, overlap=overlap and shared)
        try:
            futs = [engine.submit(r) for r in group]
            first = futs[0].result(120)
            steps = engine.steps  # the freed slot sits idle through a decode call (whose idle rows write it) first
            deadline = time.monotonic() + 60
            while engine.steps < steps + 2 and time.monotonic() < deadline:
                time.sleep(0.001)
            rest = engine.submit(late)
            outs[shared] = [first, *(f.result(120) for f in futs[1:]), rest.result(120)]
            assert engine.shared_prefills == 3 and engine.slots.shared_reads is shared
        finally:
            engine.close()
    assert [len(o.token_ids) for o in outs[True]] == [2, 14, 14, 14, 6]
    for a, b in zip(outs[True], outs[False], strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_decode_attention_refuses_mismatched_caches(interpreted: tuple[Any, Any]) -> None:
    k = torch.zeros(2, 2, 64, 16)
    with pytest.raises(ValueError, match="share strides"):
        engine_attention.decode_attention(torch.zeros(1, 2, 2, 16), k, k.transpose(2, 3).contiguous().transpose(2, 3),
                                          torch.zeros(1, dtype=torch.long), 64, 0.25, kernels=interpreted)


@pytest.mark.parametrize(("fuse", "rope", "merge"), [(False, False, False), (True, False, False), (True, True, False),
                                                     (True, True, True)])
def test_decode_step_with_the_kernels_matches_sdpa(interpreted: tuple[Any, Any], tiny: Any, fuse: bool,
                                                   rope: bool, merge: bool) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1], sliding_window=6)  # layer 0 full, layer 1 windowed
    prompts = [tok.encode(t) for t in ("List the files.", "hi", "Count the lines of a.txt, please.")]
    pos = [len(p) for p in prompts]
    out = {}
    for attention in ("sdpa", "triton"):
        sm = SlotModel(model, slots=4, length=64, fuse=fuse, attention=attention, rope_in_attention=rope,
                       merge_in_split=merge)
        first = sm.prefill([0, 1, 2], prompts)
        out[attention] = (first, sm.decode([5, 6, 7], pos, 3, 64),
                          sm.decode_sample([5, 6, 7], pos, 3, 64, 4, [1.0] * 3, [1.0] * 3, [[0.3, 0.6, 0.9]] * 4))
    (f_a, d_a, (t_a, l_a)), (f_b, d_b, (t_b, l_b)) = out["sdpa"], out["triton"]
    assert torch.equal(f_a, f_b)  # prefill does not use the kernels
    assert (d_a - d_b).abs().max().item() < 1e-5
    assert torch.equal(t_a, t_b) and (l_a - l_b).abs().max().item() < 1e-5


def test_engine_with_the_kernels_generates_what_it_generates_with_sdpa(interpreted: tuple[Any, Any], tiny: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    reqs = [EngineRequest(prompt_ids=tok.encode("Count the lines" + " x" * i), max_new_tokens=9 + i,
                          temperature=0.0 if i % 2 else 1.0, seed=i) for i in range(4)]
    outs = {}
    for attention in ("sdpa", "triton"):
        engine = Engine(model, tok, admission_window_s=0.05, decode_steps=4, attention=attention)
        try:
            assert engine.slots.attention == attention
            outs[attention] = [f.result(120) for f in [engine.submit(r) for r in reqs]]
        finally:
            engine.close()
    for a, b in zip(outs["sdpa"], outs["triton"], strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


# ---------------------------------------------------------------- the fused sampler


@pytest.fixture()
def sampler_kernels() -> tuple[Any, Any]:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through test_engine_attention.py"
    return engine_sampling._kernels() or pytest.fail("Triton did not import")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [300, 2 * engine_sampling.CHUNK + 77])  # one chunk; three, the last one short
def test_fused_sampler_draws_what_sample_static_draws(sampler_kernels: tuple[Any, Any], dtype: torch.dtype,
                                                      vocab: int) -> None:
    g = torch.Generator().manual_seed(11)
    rows = 12
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    logits[3, vocab - 5] = 40.0  # nearly all the mass on the last chunk's tail
    logits[4, :] = -30.0
    logits[4, 7] = logits[4, vocab - 1] = 5.0  # two equal maxima: greedy takes the first
    temp = torch.tensor([0.0, 1.0, 0.7, 1.5, 0.0, 1.0, 1.0, 1.0, 0.3, 2.0, 1.0, 0.0])
    u = torch.rand(rows, generator=g, dtype=torch.float64)
    u[5], u[6], u[7] = 0.0, 1 - 1e-9, 0.5  # the CDF's two ends
    tok, logp = sample_fused(logits, temp, u, kernels=sampler_kernels)
    want_tok, want_logp = sample_static(logits, temp, torch.ones(rows), u, nucleus=False)
    assert tok.dtype == torch.int64 and logp.dtype == torch.float32
    assert tok.tolist() == want_tok.tolist()
    assert (logp - want_logp).abs().max().item() < 1e-5
    assert tok[4].item() == 7 and tok[3].item() == vocab - 5


def test_fused_sampler_follows_the_uniforms_across_chunks(sampler_kernels: tuple[Any, Any]) -> None:
    # a flat distribution over three chunks: the token is floor(u * V), wherever the chunk edges fall
    vocab = 2 * engine_sampling.CHUNK + 100
    u = torch.tensor([0.0, 0.3, engine_sampling.CHUNK / vocab + 1e-6, 0.75, 0.9999], dtype=torch.float64)
    tok, logp = sample_fused(torch.zeros(len(u), vocab), torch.ones(len(u)), u, kernels=sampler_kernels)
    assert tok.tolist() == [int(x * vocab) for x in u.tolist()]
    assert logp.tolist() == pytest.approx([-math.log(vocab)] * len(u), abs=1e-5)
    with pytest.raises(ValueError, match="contiguous last dim"):
        sample_fused(torch.zeros(vocab, 2).t(), torch.ones(2), u[:2], kernels=sampler_kernels)


def test_decode_sample_with_the_fused_sampler_matches_torch(interpreted: tuple[Any, Any], tiny: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    prompts = [tok.encode(t) for t in ("List the files.", "hi", "Count the lines of a.txt, please.")]
    pos = [len(p) for p in prompts]
    out = {}
    for sampler in ("torch", "triton"):
        sm = SlotModel(model, slots=4, length=64, attention="triton", sampler=sampler)
        assert sm.sampler == sampler
        sm.prefill([0, 1, 2], prompts)
        out[sampler] = sm.decode_sample([5, 6, 7], pos, 4, 64, 5, [1.0, 0.0, 0.8], [1.0] * 3,
                                        [[0.3, 0.6, 0.9], [0.01, 0.5, 0.99]] * 2 + [[0.5] * 3])
    (t_a, l_a), (t_b, l_b) = out["torch"], out["triton"]
    assert torch.equal(t_a, t_b) and (l_a - l_b).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="sampler must be"):
        SlotModel(model, slots=2, length=64, sampler="gumbel")
