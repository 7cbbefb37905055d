"""The batching engine: batch-invariant samples, exact logprobs, weight updates mid-turn, many episodes, bad requests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch

from rollout.engine import Engine, EngineRequest, EngineRequestError, EngineTimeout
from rollout.engine_sampling import sample_rows
from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_model
from rollout.policy.types import FinishReason, Prompt, SamplingParams

pytestmark = pytest.mark.unit


def _prompts(tok: Any, n: int) -> list[list[int]]:
    texts = ["List the files.", "Count the lines of a.txt, please.", "hi", "Write the word blue to out.txt and stop now."]
    return [tok.encode(texts[i % len(texts)] + " x" * (i % 5)) for i in range(n)]


@pytest.fixture()
def engine(tiny: Any) -> Any:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, admission_window_s=0.05)
    yield eng
    eng.close()


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
def test_batched_equals_one_at_a_time_and_logprobs_are_exact(engine: Engine, tiny: Any, recompute: Any,
                                                             temperature: float, top_p: float) -> None:
    prompts = _prompts(tiny[1], 6)
    reqs = [EngineRequest(prompt_ids=p, max_new_tokens=20 + 3 * i, temperature=temperature, top_p=top_p, seed=100 + i)
            for i, p in enumerate(prompts)]
    alone = [engine.generate_sync(r) for r in reqs]
    futures = [engine.submit(r) for r in reqs]  # admitted together: one prefill, one decode batch
    together = [f.result(60) for f in futures]
    for a, b, r in zip(alone, together, reqs, strict=True):
        assert a.token_ids == b.token_ids and len(a.token_ids) == r.max_new_tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
        expected = recompute(engine.model, list(r.prompt_ids), a.token_ids, temperature)
        assert max(abs(x - y) for x, y in zip(b.logprobs, expected, strict=True)) < 1e-5
        assert b.versions == (0,) * len(b.token_ids) and b.finish_reason is FinishReason.LENGTH
    assert engine.steps > 0


def test_a_burst_submitted_one_by_one_is_prefilled_together(tiny: Any) -> None:
    """The admission window waits for a quiet gap: a submit's wake-up does not end it (it did: the first request or
    two were prefilled alone and the rest joined in later, smaller prefills)."""
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, admission_window_s=0.25)
    try:
        futs = []
        for i, p in enumerate(_prompts(tok, 6)):
            futs.append(eng.submit(EngineRequest(prompt_ids=p, max_new_tokens=3, seed=i)))
            time.sleep(0.02)
        outs = [f.result(60) for f in futs]
        assert all(len(o.token_ids) == 3 for o in outs)
        assert eng.prefills == 1
        late = eng.submit(EngineRequest(prompt_ids=_prompts(tok, 1)[0], max_new_tokens=2, seed=9)).result(60)
        assert len(late.token_ids) == 2 and eng.prefills == 2
    finally:
        eng.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_prompt_in_a_burst_is_prefilled_once_and_samples_as_if_alone(tiny: Any, recompute: Any,
                                                                         temperature: float) -> None:
    """A GRPO group's first turn: four requests with one prompt (and one other) admitted together. The prompt is
    computed once, the other three copy its cache; every request samples what it samples alone, with logprobs of a
    plain forward, and the engine with sharing off gives the same."""
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    group, other = _prompts(tok, 2)
    reqs = [EngineRequest(prompt_ids=group, max_new_tokens=12, temperature=temperature, seed=40 + i) for i in range(4)]
    reqs.append(EngineRequest(prompt_ids=other, max_new_tokens=12, temperature=temperature, seed=50))
    outs = {}
    for share in (True, False):
        eng = Engine(model, tok, admission_window_s=0.25, share_prompts=share)
        try:
            alone = [eng.generate_sync(r) for r in reqs]
            before = eng.prefills
            futs = [eng.submit(r) for r in reqs]
            outs[share] = [f.result(60) for f in futs]
            assert eng.prefills - before == 1
            assert eng.shared_prefills == (3 if share else 0)
        finally:
            eng.close()
        for a, b, r in zip(alone, outs[share], reqs, strict=True):
            assert a.token_ids == b.token_ids and len(b.token_ids) == 12
            expected = recompute(model, list(r.prompt_ids), b.token_ids, temperature)
            assert max(abs(x - y) for x, y in zip(b.logprobs, expected, strict=True)) < 1e-5
    assert [o.token_ids for o in outs[True]] == [o.token_ids for o in outs[False]]
    if temperature > 0:  # each copy samples with its own seed
        assert len({o.token_ids for o in outs[True][:4]}) > 1


def test_copy_prefix_refuses_slots_outside_the_cache(tiny: Any) -> None:
    from rollout.engine_model import SlotModel

    model, _ = tiny_model(seed=0, tokenizer=tiny[1])
    sm = SlotModel(model, slots=2, length=8)
    sm.copy_prefix(0, [1], 8)
    with pytest.raises(ValueError, match=r"copy_prefix: slots 0 -> \[2\], length 4"):
        sm.copy_prefix(0, [2], 4)
    with pytest.raises(ValueError, match="length 9 outside the cache"):
        sm.copy_prefix(0, [1], 9)
    with pytest.raises(ValueError, match=r"source slot 1 is also among the destinations \[0, 1\]"):
        sm.copy_prefix(1, [0, 1], 4)


def test_seeds_decide_the_samples(engine: Engine, tiny: Any) -> None:
    p = _prompts(tiny[1], 1)[0]
    a, b, c = (engine.generate_sync(EngineRequest(prompt_ids=p, max_new_tokens=24, seed=s)) for s in (7, 7, 8))
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_sampler_keeps_to_the_nucleus_and_reports_the_untruncated_logprob() -> None:
    logits = torch.tensor([[3.0, 2.9, -5.0, -5.0]] * 200)
    u = torch.rand(200, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    one = torch.ones(200)
    tokens, logp = sample_rows(logits, one, one * 0.5, u)
    assert set(tokens.tolist()) == {0}
    assert logp[0].item() == pytest.approx(float(torch.log_softmax(logits[0], -1)[0]))
    assert set(sample_rows(logits, one, one * 0.9, u)[0].tolist()) == {0, 1}


def test_keep_mode_update_mid_generation_splits_versions(engine: Engine, tiny: Any, recompute: Any) -> None:
    p = _prompts(tiny[1], 1)[0]
    fut = engine.submit(EngineRequest(prompt_ids=p, max_new_tokens=400, seed=3))
    deadline = time.monotonic() + 30
    while engine.tokens_out < 5 and time.monotonic() < deadline:
        time.sleep(0.001)
    other, _ = tiny_model(seed=5, tokenizer=tiny[1])
    engine.update_weights(other.state_dict(), version=1, mode="keep")
    out = fut.result(60)
    split = out.versions.index(1)
    assert 0 < split < len(out.token_ids) and out.versions == (0,) * split + (1,) * (len(out.token_ids) - split)
    assert engine.version == 1 and len(out.token_ids) == 400
    # The first tokens are the old weights' samples (and logprobs): the update did not reach back.
    old, _ = tiny_model(seed=0, tokenizer=tiny[1])
    expected = recompute(old, p, out.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(out.logprobs[:split], expected[:split])) < 1e-5


def test_wait_mode_update_lets_turns_finish_on_the_old_weights_and_times_out(engine: Engine, tiny: Any) -> None:
    p = _prompts(tiny[1], 1)[0]
    fut = engine.submit(EngineRequest(prompt_ids=p, max_new_tokens=300, seed=3))
    while engine.tokens_out < 2:
        time.sleep(0.001)
    other, _ = tiny_model(seed=5, tokenizer=tiny[1])
    t0 = time.monotonic()
    engine.pause("keep")  # the running request cannot finish: a wait-mode update must give up in time
    with pytest.raises(EngineTimeout, match="still running"):
        engine.update_weights(other.state_dict(), version=1, mode="wait", timeout_s=0.3)
    assert time.monotonic() - t0 < 5 and engine.version == 0 and engine.is_paused
    engine.resume()
    engine.update_weights(other.state_dict(), version=1, mode="wait", timeout_s=60)
    out = fut.result(60)
    assert set(out.versions) == {0} and engine.version == 1


def test_pause_abort_returns_what_was_generated(engine: Engine, tiny: Any) -> None:
    p = _prompts(tiny[1], 1)[0]
    fut = engine.submit(EngineRequest(prompt_ids=p, max_new_tokens=500, seed=3))
    while engine.tokens_out < 2:
        time.sleep(0.001)
    engine.pause("abort")
    out = fut.result(30)
    assert out.finish_reason is FinishReason.ABORT and 0 < len(out.token_ids) < 500
    engine.resume()
    assert len(engine.generate_sync(EngineRequest(prompt_ids=p, max_new_tokens=3)).token_ids) == 3


def test_many_concurrent_episodes_share_one_engine(tiny: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    policy = HFPolicy(model, tok, stop_token_ids=())
    seen: list[int] = []
    prompts = _prompts(tok, 40)

    async def main() -> list[Any]:
        async def episode(i: int) -> list[Any]:
            turns = []
            ids = prompts[i]
            for turn in range(3):  # each turn's prompt extends the last: an episode
                g = await policy.generate(Prompt(token_ids=ids), SamplingParams(max_new_tokens=8 + i % 5, seed=i))
                seen.append(policy.engine.running)
                turns.append(g)
                ids = ids + list(g.token_ids) + tok.encode(" ok")
            return turns

        return await asyncio.gather(*(episode(i) for i in range(40)))

    results = asyncio.run(main())
    assert all(len(t) == 3 and all(len(g.token_ids) == 8 + i % 5 for g in t) for i, t in enumerate(results))
    assert max(seen) > 1  # turns of different episodes were decoded together
    # Reproducible per episode: one episode's first turn, alone, samples the same tokens.
    alone = policy.generate_sync(Prompt(token_ids=prompts[7]), SamplingParams(max_new_tokens=8 + 7 % 5, seed=7))
    assert alone.token_ids == results[7][0].token_ids
    policy.close()


def test_malformed_requests_are_named(engine: Engine) -> None:
    cases = [
        (EngineRequest(prompt_ids=[]), "prompt_ids is empty"),
        (EngineRequest(prompt_ids=[10**7]), r"prompt_ids holds 10000000"),
        (EngineRequest(prompt_ids=[1], top_p=0.0), "top_p"),
        (EngineRequest(prompt_ids=[1], temperature=-1.0), "temperature"),
        (EngineRequest(prompt_ids=[1], max_new_tokens=-2), "max_new_tokens"),
        (EngineRequest(prompt_ids=[1], max_new_tokens=10**6), "exceeds the engine's max_len"),
    ]
    for req, message in cases:
        with pytest.raises(EngineRequestError, match=message):
            engine.submit(req)
    with pytest.raises(EngineRequestError, match="mode must be"):
        engine.update_weights({}, 1, mode="later")  # type: ignore[arg-type]
    bare = Engine(engine.model)  # no tokenizer: stop strings cannot be watched
    with pytest.raises(EngineRequestError, match="need an engine built with a tokenizer"):
        bare.submit(EngineRequest(prompt_ids=[1], stop=("x",)))
    bare.close()


def test_submit_many_queues_a_burst_whole_or_not_at_all(engine: Engine, tiny: Any) -> None:
    """A burst is admitted together (one admission, one prefill) and samples what each request samples alone; a
    malformed request in it is named by its index and nothing of the burst is queued."""
    tok = tiny[1]
    reqs = [EngineRequest(prompt_ids=p, max_new_tokens=5 + i, temperature=1.0, seed=i)
            for i, p in enumerate(_prompts(tok, 5))]
    with pytest.raises(EngineRequestError, match=r"top_p.*\(request 3 of 6; none was queued\)"):
        engine.submit_many([*reqs[:3], EngineRequest(prompt_ids=[1], top_p=0.0), *reqs[3:]])
    assert engine.waiting == 0 and engine.running == 0
    admissions, prefills = len(engine.admissions), engine.prefills
    burst = [f.result(60) for f in engine.submit_many(reqs)]
    assert list(engine.admissions)[admissions:] == [5] and engine.prefills == prefills + 1
    for r, out in zip(reqs, burst, strict=True):
        assert out.token_ids == engine.generate_sync(r, 60).token_ids and len(out.token_ids) == r.max_new_tokens


def test_legacy_path_is_still_there(tiny: Any, recompute: Any) -> None:
    model, tok = tiny_model(seed=0, tokenizer=tiny[1])
    legacy = HFPolicy(model, tok, engine=False)
    ids = _prompts(tok, 1)[0]
    g = legacy.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=12, seed=1))
    assert legacy._engine is None and len(g.token_ids) == 12
    assert max(abs(a - b) for a, b in zip(g.logprobs, recompute(model, ids, g.token_ids, 1.0))) < 1e-5
