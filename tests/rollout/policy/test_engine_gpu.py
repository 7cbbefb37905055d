"""The engine on an accelerator (marker ``gpu``; never in CI): CUDA graphs give the eager numbers. Self-contained:
runs with ``--noconftest`` on a machine that has torch + transformers but none of the project's services."""

from __future__ import annotations

import time

import pytest
import torch

from rollout.engine import Engine, EngineRequest
from rollout.policy.models import tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _recompute(model: torch.nn.Module, prompt: list[int], completion: tuple[int, ...], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + list(completion)], device="cuda")
    with torch.no_grad():
        logp_TV = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, dim=-1)
    return [float(logp_TV[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def test_graph_decode_matches_eager_and_a_full_forward() -> None:
    model, tok = tiny_model(seed=0)
    model = model.to("cuda").eval()
    prompts = [tok.encode("List the files." + " x" * i) for i in range(9)]
    reqs = [EngineRequest(prompt_ids=p, max_new_tokens=40 + i, temperature=0.8, top_p=0.95, seed=i) for i, p in enumerate(prompts)]
    graphed = Engine(model, tok, admission_window_s=0.05)
    eager = Engine(model, tok, admission_window_s=0.05, cuda_graphs=False)
    try:
        assert graphed.slots.graphs and not eager.slots.graphs
        assert graphed.overlap and not eager.overlap  # overlap: on by default with graphs and multi-step calls
        together = [f.result(120) for f in [graphed.submit(r) for r in reqs]]
        alone = [eager.generate_sync(r, 120) for r in reqs]
        for a, b, r in zip(together, alone, reqs, strict=True):
            assert a.token_ids == b.token_ids and len(a.token_ids) == r.max_new_tokens
            worst = max(abs(x - y) for x, y in zip(a.logprobs, _recompute(model, list(r.prompt_ids), a.token_ids, 0.8)))
            assert worst < 1e-4, worst
        assert graphed.overlapped > 0  # calls started ahead of the host were kept
        other, _ = tiny_model(seed=3, tokenizer=tok)
        graphed.update_weights(other.to("cuda").state_dict(), version=2)  # copy_ in place: the graphs stay valid
        out = graphed.generate_sync(reqs[0], 120)
        assert out.versions == (2,) * len(out.token_ids)
        worst = max(abs(x - y) for x, y in zip(out.logprobs, _recompute(model, list(reqs[0].prompt_ids), out.token_ids, 0.8)))
        assert worst < 1e-4, worst
    finally:
        graphed.close()
        eager.close()


def test_a_group_with_one_prompt_is_prefilled_once_and_samples_as_if_alone_on_the_device() -> None:
    """The shared prefill on CUDA (its default there): eight requests with one prompt, graphs and multi-step decode;
    each gets the tokens it gets alone from an engine with sharing off, and the logprobs of a full forward."""
    model, tok = tiny_model(seed=0)
    model = model.to("cuda").eval()
    prompt = tok.encode("Count the lines of a.txt, please." + " x" * 40)
    reqs = [EngineRequest(prompt_ids=prompt, max_new_tokens=33, temperature=1.0, seed=70 + i) for i in range(8)]
    shared = Engine(model, tok, admission_window_s=0.05)
    alone = Engine(model, tok, admission_window_s=0.05, share_prompts=False)
    try:
        together = [f.result(120) for f in [shared.submit(r) for r in reqs]]
        assert shared.shared_prefills == 7 and shared.prefills == 1
        for a, r in zip(together, reqs, strict=True):
            b = alone.generate_sync(r, 120)
            assert a.token_ids == b.token_ids and len(a.token_ids) == r.max_new_tokens
            worst = max(abs(x - y) for x, y in zip(a.logprobs, _recompute(model, prompt, a.token_ids, 1.0)))
            assert worst < 1e-4, worst
        assert len({o.token_ids for o in together}) > 1
    finally:
        shared.close()
        alone.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_copies_reading_their_prompt_from_one_slot_sample_what_they_sample_from_their_own_in_bf16(overlap: bool) -> None:
    """bf16 (the split-K kernels), graphs, multi-step decode: a group's copies read the prompt from the slot it was
    prefilled in; its first request ends early and a later request takes that slot while the copies decode. Every
    request gets the tokens and logprobs of an engine whose copies read their own slots (and, with ``overlap``, of
    one that does not start a call before the host took the last)."""
    model, tok = tiny_model(seed=0)
    model = model.to("cuda", torch.bfloat16).eval()
    prompt = tok.encode("Count the lines of a.txt, please." + " x" * 60)
    group = [EngineRequest(prompt_ids=prompt, max_new_tokens=4 if i == 0 else 120, temperature=1.0, seed=50 + i)
             for i in range(8)]
    late = EngineRequest(prompt_ids=tok.encode("hi there, list the files" + " y" * 30), max_new_tokens=16,
                         temperature=1.0, seed=9)
    outs = {}
    for shared in (True, False):
        engine = Engine(model, tok, admission_window_s=0.05, shared_reads=shared, overlap=overlap and shared)
        try:
            assert engine.slots.attention == "triton" and engine.slots.shared_reads is shared
            futs = [engine.submit(r) for r in group]
            first = futs[0].result(120)
            steps = engine.steps
            while engine.steps < steps + 16 and not futs[1].done():  # the freed slot idles through decode calls
                time.sleep(0.001)
            rest = engine.submit(late)
            outs[shared] = [first, *(f.result(120) for f in futs[1:]), rest.result(120)]
            assert engine.shared_prefills == 7
            assert not (overlap and shared) or engine.overlapped > 0  # calls started ahead of the host were kept
        finally:
            engine.close()
    for a, b in zip(outs[True], outs[False], strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
    assert len({o.token_ids for o in outs[True][1:8]}) > 1


def test_split_k_attention_matches_sdpa_in_bf16_on_the_device() -> None:
    """The Triton kernels (the engine's default for 16-bit models on CUDA) against SDPA at the 0.5B shape's heads."""
    import torch.nn.functional as F

    from rollout import engine_attention
    from rollout.engine_model import SlotModel

    assert engine_attention.available(torch.device("cuda"), torch.bfloat16, 64)
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(80, 2, 2304, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(80, 2, 2304, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(72, 2, 7, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    pos = torch.randint(0, 2048, (72,), device="cuda", generator=g)
    pos[0], pos[1] = 0, 2047
    j = torch.arange(2048, device="cuda")
    for window in (None, 300):
        mask = j[None] <= pos[:, None]
        if window:
            mask &= j[None] > pos[:, None] - window
        want = F.scaled_dot_product_attention(q.float(), k[:72, :, :2048].float(), v[:72, :, :2048].float(),
                                              attn_mask=mask[:, None, None, :], scale=0.125)
        got = engine_attention.decode_attention(q, k, v, pos, 2048, 0.125, window)
        assert (got.float() - want).abs().max().item() < 2e-2
    model, tok = tiny_model(seed=0)
    model = model.to("cuda", torch.bfloat16).eval()
    prompts = [tok.encode("List the files." + " x" * i) for i in range(5)]
    pos_list = [len(p) for p in prompts]
    logits = {}
    for attention in ("sdpa", "triton"):
        sm = SlotModel(model, slots=8, length=256, graphs=True, attention=attention)
        sm.prefill(list(range(5)), prompts)
        first = sm.decode([5, 6, 7, 8, 9], pos_list, 8, 256)[:5]
        # the next step reads the key and value the kernel wrote for the first (SDPA: the scatter wrote them)
        logits[attention] = torch.cat([first, sm.decode([9, 8, 7, 6, 5], [p + 1 for p in pos_list], 8, 256)[:5]])
    assert (logits["sdpa"] - logits["triton"]).abs().max().item() < 5e-2


def test_the_split_kernel_merges_its_chunks_under_a_race_on_the_device() -> None:
    """``merge_in_split``: the last chunk of a (row, kv head) to finish merges them all, found with an atomic count.
    Its result is the two-kernel result (up to fp32 summation order) on every one of many launches, in and out of a
    CUDA graph, with the counters back at zero after each."""
    from rollout import engine_attention
    from rollout.engine_model import SlotModel

    g = torch.Generator(device="cuda").manual_seed(1)
    k = torch.randn(80, 2, 2304, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(80, 2, 2304, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(72, 2, 7, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    pos = torch.randint(0, 2048, (72,), device="cuda", generator=g)
    counters = torch.zeros(80 * 2, dtype=torch.int32, device="cuda")
    for splits in (2, 8, 16):
        want = engine_attention.decode_attention(q, k, v, pos, 2048, 0.125, splits=splits).float()
        outs = [engine_attention.decode_attention(q, k, v, pos, 2048, 0.125, splits=splits, counters=counters)
                for _ in range(200)]
        worst = max((o.float() - want).abs().max().item() for o in outs)
        assert worst < 1e-2, (splits, worst)
        assert not counters.any()
    model, tok = tiny_model(seed=0)
    model = model.to("cuda", torch.bfloat16).eval()
    prompts = [tok.encode("List the files." + " x" * i) for i in range(5)]
    pos_list = [len(p) for p in prompts]
    logits = {}
    for merge in (False, True):
        sm = SlotModel(model, slots=8, length=256, graphs=True, attention="triton", merge_in_split=merge)
        sm.prefill(list(range(5)), prompts)
        logits[merge] = torch.cat([sm.decode([5, 6, 7, 8, 9], [p + i for p in pos_list], 8, 256)[:5] for i in range(6)])
    assert (logits[False] - logits[True]).abs().max().item() < 5e-2


def test_fused_sampler_on_the_device_at_the_05b_vocabulary() -> None:
    """``sample_fused`` (the engine's default multi-step sampler on CUDA) on bf16 logits at Qwen2's vocabulary: the
    token is the fp64 inverse-CDF draw (up to fp32 rounding at a CDF step's edge, so a handful of rows at most) and
    the logprob the fp64 log-softmax of the bf16 logits."""
    from rollout.engine_sampling import fused_available, sample_fused

    assert fused_available(torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, vocab = 256, 151936
    logits = (torch.randn(rows, vocab, device="cuda", generator=g) * 4).to(torch.bfloat16)
    temp = torch.rand(rows, device="cuda", generator=g) * 1.5 + 0.2
    temp[::7] = 0.0  # greedy rows
    u = torch.rand(rows, device="cuda", generator=g, dtype=torch.float64)
    tok, logp = sample_fused(logits, temp, u)
    x = logits.double() / torch.where(temp > 0, temp, 1.0).double()[:, None]
    logp_ref = torch.log_softmax(x, dim=-1)
    cdf = logp_ref.exp().cumsum(-1)
    drawn = torch.searchsorted(cdf, u[:, None], right=True)[:, 0].clamp_max(vocab - 1)
    want = torch.where(temp > 0, drawn, logits.float().argmax(-1))
    assert torch.equal(tok[temp == 0], want[temp == 0])
    assert (tok != want).sum().item() <= 3
    assert (logp.double() - logp_ref.gather(-1, tok[:, None])[:, 0]).abs().max().item() < 1e-4
