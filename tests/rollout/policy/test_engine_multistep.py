"""Multi-step decode (several steps on the device, one host look) and the fused kernels give one-step's outputs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rollout.engine import Engine, EngineRequest
from rollout.engine_model import SlotModel
from rollout.engine_sampling import sample_rows, sample_static
from rollout.policy.models import load_checkpoint, save_checkpoint, tiny_model
from rollout.policy.types import FinishReason, ThinkingBudget

pytestmark = pytest.mark.unit


def _prompts(tok: Any, n: int) -> list[list[int]]:
    texts = ["List the files.", "Count the lines of a.txt, please.", "hi", "Write the word blue to out.txt and stop now."]
    return [tok.encode(texts[i % len(texts)] + " x" * (i % 5)) for i in range(n)]


@pytest.fixture()
def engines(tiny: Any) -> Iterator[dict[str, Engine]]:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    made = {
        "one": Engine(model, tok, admission_window_s=0.05),
        "multi": Engine(model, tok, admission_window_s=0.05, decode_steps=8),
        "multi_fused": Engine(model, tok, admission_window_s=0.05, decode_steps=4, fuse=True),
        # the next call started before the host takes this one's tokens (overlap)
        "multi_overlap": Engine(model, tok, admission_window_s=0.05, decode_steps=4, overlap=True),
        # packed q/k/v and gate/up GEMMs (the CUDA default) on a model of its own: packing rebinds its weights
        "multi_packed": Engine(tiny_model(seed=0, tokenizer=tiny[1])[0], tok, admission_window_s=0.05, decode_steps=4,
                               fuse=True, pack=True),
    }
    assert made["one"].decode_steps == 1 and not made["one"].slots.fuse  # the CPU default: one step, the modules
    assert not made["multi"].overlap  # overlap's default is on with CUDA graphs only
    assert made["multi_fused"].slots.fuse and not made["multi_fused"].slots.pack  # packing is CUDA's default only
    assert made["multi_packed"].slots.pack
    yield made
    for e in made.values():
        e.close()


def _run(engine: Engine, reqs: list[EngineRequest]) -> list[Any]:
    return [f.result(60) for f in [engine.submit(r) for r in reqs]]


def _same_up_to_a_tie(want: Any, got: Any) -> bool:
    """The same tokens, or the same up to a first difference between two tokens of one probability (within fp32
    noise; the runs after it then differ). Nucleus rows sort the vocabulary: two tokens whose probabilities tie
    swap places on a one-ulp difference between two runs' logits (attention summed over other lengths), and the
    inverse CDF then lands on the other one of the pair. Any other difference is a different sample."""
    k = next((i for i, (a, b) in enumerate(zip(want.token_ids, got.token_ids)) if a != b), None)
    return k is None or abs(want.logprobs[k] - got.logprobs[k]) < 1e-5


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
def test_multi_step_samples_what_one_step_samples(engines: dict[str, Engine], tiny: Any, recompute: Any,
                                                  temperature: float, top_p: float) -> None:
    reqs = [EngineRequest(prompt_ids=p, max_new_tokens=13 + 3 * i, temperature=temperature, top_p=top_p, seed=40 + i)
            for i, p in enumerate(_prompts(tiny[1], 6))]
    want = _run(engines["one"], reqs)
    for name in ("multi", "multi_fused", "multi_packed", "multi_overlap"):
        got = _run(engines[name], reqs)
        for a, b, r in zip(want, got, reqs, strict=True):
            assert _same_up_to_a_tie(a, b) and len(b.token_ids) == r.max_new_tokens, name
            assert b.finish_reason is FinishReason.LENGTH and b.versions == (0,) * len(b.token_ids)
            expected = recompute(engines[name].model, list(r.prompt_ids), b.token_ids, temperature)
            assert max(abs(x - y) for x, y in zip(b.logprobs, expected, strict=True)) < 1e-5, name
    assert engines["multi"].syncs < engines["one"].syncs / 3  # it did run several steps per host look
    assert engines["multi_overlap"].overlapped > 0  # and calls started ahead of the host were kept
    # a turn of 1 + 4 tokens (the prefill's, then one call): no call is started past its last token
    last = engines["multi_overlap"].generate_sync(EngineRequest(prompt_ids=reqs[0].prompt_ids, max_new_tokens=5, seed=1))
    assert len(last.token_ids) == 5 and engines["multi_overlap"]._spec is None
    # a turn of 1 + 8 x 4 tokens: every call after the first was started by the one before it (chained), not
    # every other one; and none is left running past the turn's last token
    before = engines["multi_overlap"].syncs, engines["multi_overlap"].overlapped
    long = engines["multi_overlap"].generate_sync(EngineRequest(prompt_ids=reqs[0].prompt_ids, max_new_tokens=33, seed=2))
    calls = engines["multi_overlap"].syncs - before[0], engines["multi_overlap"].overlapped - before[1]
    assert len(long.token_ids) == 33 and calls == (8, 7) and engines["multi_overlap"]._spec is None


def test_stops_land_mid_chunk(engines: dict[str, Engine], tiny: Any) -> None:
    tok = tiny[1]
    p = _prompts(tok, 1)[0]
    free = engines["one"].generate_sync(EngineRequest(prompt_ids=p, max_new_tokens=30, seed=5))
    stop = tok.decode(list(free.token_ids[10:13]))[1:]  # completed by token 12: the middle of the second 8-step chunk
    assert stop and stop not in tok.decode(list(free.token_ids[:12]))
    eot_like = free.token_ids[5]
    first = free.token_ids.index(eot_like)
    cases = [
        EngineRequest(prompt_ids=p, max_new_tokens=30, seed=5, stop=("never-there", stop)),
        EngineRequest(prompt_ids=p, max_new_tokens=30, seed=5, stop_token_ids=frozenset({eot_like})),
        EngineRequest(prompt_ids=p, max_new_tokens=11, seed=5),  # max tokens mid-chunk
    ]
    for name in ("one", "multi", "multi_fused", "multi_packed", "multi_overlap"):
        outs = _run(engines[name], cases)
        assert outs[0].finish_reason is FinishReason.STOP and outs[0].token_ids == free.token_ids[:13], name
        assert outs[1].finish_reason is FinishReason.STOP and outs[1].token_ids == free.token_ids[: first + 1], name
        assert outs[2].finish_reason is FinishReason.LENGTH and outs[2].token_ids == free.token_ids[:11], name
        assert outs[0].logprobs == pytest.approx(free.logprobs[:13], abs=1e-5)


@pytest.mark.parametrize("budget", [0, 5, 11])
def test_thinking_budget_closes_at_the_same_token(engines: dict[str, Engine], tiny: Any, budget: int) -> None:
    tok = tiny[1]
    ids = _prompts(tok, 1)[0] + tok.encode("<think>", add_special_tokens=False)
    reqs = [EngineRequest(prompt_ids=ids, max_new_tokens=n, seed=2, budget=ThinkingBudget(budget)) for n in (budget + 1, 24)]
    want = _run(engines["one"], reqs)
    assert want[1].budget_closed and want[1].thinking_tokens == budget
    for name in ("multi", "multi_fused", "multi_packed", "multi_overlap"):
        got = _run(engines[name], reqs)
        for a, b in zip(want, got, strict=True):
            assert (b.token_ids, b.sampled_mask, b.finish_reason, b.thinking_tokens) == (
                a.token_ids, a.sampled_mask, a.finish_reason, a.thinking_tokens), name
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)


@pytest.mark.parametrize("name", ["multi", "multi_overlap"])
def test_a_request_joining_a_running_batch_samples_what_it_samples_alone(engines: dict[str, Engine], tiny: Any,
                                                                         name: str) -> None:
    engine = engines[name]
    ps = _prompts(tiny[1], 4)
    long_runs = [engine.submit(EngineRequest(prompt_ids=p, max_new_tokens=60, seed=i)) for i, p in enumerate(ps[:3])]
    while engine.tokens_out < 20:
        pass
    late = engine.submit(EngineRequest(prompt_ids=ps[3], max_new_tokens=17, temperature=0.7, seed=9)).result(60)
    [f.result(60) for f in long_runs]
    alone = engines["one"].generate_sync(EngineRequest(prompt_ids=ps[3], max_new_tokens=17, temperature=0.7, seed=9))
    assert late.token_ids == alone.token_ids
    assert [f.result(60).token_ids for f in long_runs] == [
        engines["one"].generate_sync(EngineRequest(prompt_ids=p, max_new_tokens=60, seed=i)).token_ids
        for i, p in enumerate(ps[:3])]


def test_packed_projections_are_views_that_follow_every_weight_update(tiny: Any, tmp_path: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    ref_model, _ = tiny_model(seed=0, tokenizer=tiny[1])
    plain = SlotModel(ref_model, slots=4, length=64, fuse=True, pack=False)
    packed = SlotModel(model, slots=4, length=64, fuse=True, pack=True)
    names = list(model.state_dict())

    def shared(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()

    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert shared(attn.q_proj.weight, attn.v_proj.weight) and shared(attn.q_proj.bias, attn.k_proj.bias)
    assert shared(mlp.gate_proj.weight, mlp.up_proj.weight) and not shared(attn.q_proj.weight, mlp.up_proj.weight)
    prompts = _prompts(tok, 4)
    pos = [len(p) for p in prompts]

    def both_decode() -> tuple[torch.Tensor, torch.Tensor]:
        return plain.decode([5, 6, 7, 8], pos, 4, 64), packed.decode([5, 6, 7, 8], pos, 4, 64)

    a, b = plain.prefill([0, 1, 2, 3], prompts), packed.prefill([0, 1, 2, 3], prompts)
    assert (a - b).abs().max().item() < 1e-5
    a, b = both_decode()
    assert (a - b).abs().max().item() < 1e-5
    g = torch.Generator().manual_seed(1)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in ref_model.state_dict().items()}
    for m in (ref_model, model):  # a weight update copies into the views: the packed tensors have it
        m.load_state_dict(new)
    a2, b2 = both_decode()
    assert (a2 - b2).abs().max().item() < 1e-5 and (a2 - a).abs().max().item() > 1e-3
    for m in (ref_model, model):  # a moved weight (what ``.to`` does: new ``param.data``) is noticed and packed again
        w = m.model.layers[1].mlp.up_proj.weight
        w.data = w.data.clone() * 1.5
    a3, b3 = both_decode()
    assert (a3 - b3).abs().max().item() < 1e-5 and (a3 - a2).abs().max().item() > 1e-3
    mlp1 = model.model.layers[1].mlp
    assert shared(mlp1.gate_proj.weight, mlp1.up_proj.weight)
    # packed again inside a decode (inference mode): the new views still take a weight update in place
    new = {k: v - 0.05 * torch.randn(v.shape, generator=g) for k, v in ref_model.state_dict().items()}
    for m in (ref_model, model):
        m.load_state_dict(new)
    a4, b4 = both_decode()
    assert (a4 - b4).abs().max().item() < 1e-5 and (a4 - a3).abs().max().item() > 1e-3
    # a second SlotModel on the same model takes the packed tensors as they are (no copy, no repacking back and
    # forth): an update reaches both
    twin = SlotModel(model, slots=4, length=64, fuse=True, pack=True)
    plain_twin = SlotModel(ref_model, slots=4, length=64, fuse=True, pack=False)
    assert twin._packed[1][2].data_ptr() == packed._packed[1][2].data_ptr()
    for m in (ref_model, model):
        m.load_state_dict({k: v * 0.9 for k, v in new.items()})
    a5, b5 = both_decode()
    assert (a5 - b5).abs().max().item() < 1e-5 and (a5 - a4).abs().max().item() > 1e-3
    assert (twin.prefill([0, 1, 2, 3], prompts) - plain_twin.prefill([0, 1, 2, 3], prompts)).abs().max().item() < 1e-5
    twin_b, twin_a = twin.decode([5, 6, 7, 8], pos, 4, 64), plain_twin.decode([5, 6, 7, 8], pos, 4, 64)
    assert (twin_a - twin_b).abs().max().item() < 1e-5
    assert (packed.decode([5, 6, 7, 8], pos, 4, 64) - b5).abs().max().item() < 1e-5  # no repacking by the twin
    assert list(model.state_dict()) == names  # the same parameters, by name, for every weight transfer
    saved, _ = load_checkpoint(save_checkpoint(model, tok, tmp_path / "ckpt"))  # save_pretrained takes the views
    assert all(torch.equal(v, saved.state_dict()[k]) for k, v in model.state_dict().items())
    lone, _ = tiny_model(seed=0, tokenizer=tiny[1])
    lone.model.layers[0].self_attn.k_proj.bias = None  # mixed biases in one group: left unpacked
    assert not SlotModel(lone, slots=2, length=32, fuse=True, pack=True).pack


def test_fused_step_and_static_sampler_match_the_modules_and_sample_rows(tiny: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    plain = SlotModel(model, slots=4, length=64, fuse=False)
    fused = SlotModel(model, slots=4, length=64, fuse=True)
    prompts = _prompts(tok, 4)
    for sm in (plain, fused):
        sm.prefill([0, 1, 2, 3], prompts)
    pos = [len(p) for p in prompts]
    a = plain.decode([5, 6, 7, 8], pos, 4, 64)
    b = fused.decode([5, 6, 7, 8], pos, 4, 64)
    assert (a - b).abs().max().item() < 1e-5
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50, generator=g) * 3
    temp = torch.tensor([0.0, 1.0, 0.7, 1.0, 1.3])
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0])
    u = torch.rand(5, generator=g, dtype=torch.float64)
    want = sample_rows(logits, temp, top_p, u)
    got = sample_static(logits, temp, top_p, u, nucleus=True)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])
    plain_rows = top_p >= 1
    got_plain = sample_static(logits, temp, top_p, u, nucleus=False)
    assert torch.equal(want[0][plain_rows], got_plain[0][plain_rows])


@pytest.mark.parametrize("overlap", [False, True])
def test_keep_update_and_abort_between_host_looks(tiny: Any, recompute: Any, overlap: bool) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    engine = Engine(model, tok, decode_steps=8, overlap=overlap)
    try:
        p = _prompts(tok, 1)[0]
        fut = engine.submit(EngineRequest(prompt_ids=p, max_new_tokens=400, seed=3))
        while engine.tokens_out < 9:
            pass
        other, _ = tiny_model(seed=5, tokenizer=tok)
        engine.update_weights(other.state_dict(), version=1, mode="keep")
        out = fut.result(60)
        split = out.versions.index(1)
        assert 0 < split < 400 and out.versions == (0,) * split + (1,) * (400 - split)
        old, _ = tiny_model(seed=0, tokenizer=tok)
        assert max(abs(a - b) for a, b in zip(out.logprobs[:split], recompute(old, p, out.token_ids, 1.0)[:split])) < 1e-5
        fut = engine.submit(EngineRequest(prompt_ids=p, max_new_tokens=400, seed=3))
        while engine.tokens_out < 400 + 9:
            pass
        engine.pause("abort")
        aborted = fut.result(30)
        assert aborted.finish_reason is FinishReason.ABORT and 0 < len(aborted.token_ids) < 400
    finally:
        engine.close()
