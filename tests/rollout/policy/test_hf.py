"""HFPolicy: exact logprobs, stops, thinking budget, weight swap, determinism, renderer contract."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch

from rollout.harnesses import get_harness
from rollout.harnesses.rendering import EpisodeRenderer
from rollout.policy.hf import HFPolicy, pick_token
from rollout.policy.models import load_checkpoint, save_checkpoint, tiny_model
from rollout.policy.types import FinishReason, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget
from rollout.tokenizer import EOT

pytestmark = pytest.mark.unit


def _prompt(policy: HFPolicy, text: str = "List the files.") -> list[int]:
    return policy.prompt_ids(Prompt(messages=[{"role": "user", "content": text}]))


def test_is_a_policy(policy: HFPolicy) -> None:
    assert isinstance(policy, Policy) and policy.version == 0


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_equal_full_forward_recomputation(policy: HFPolicy, recompute: Any, temperature: float, top_p: float) -> None:
    ids = _prompt(policy)
    g = policy.generate_sync(Prompt(token_ids=ids), SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=40, seed=3))
    assert len(g.token_ids) == 40 and g.finish_reason is FinishReason.LENGTH
    expected = recompute(policy.model, ids, g.token_ids, temperature)
    assert max(abs(a - b) for a, b in zip(g.logprobs, expected, strict=True)) < 1e-5
    assert g.loss_mask == (1,) * 40 and g.policy_version == 0


def test_sliding_window_model_samples_what_a_full_forward_computes(tiny: Any, recompute: Any) -> None:
    """Local layers (``tiny_config(sliding_window=...)``): the KV-cache sampler and the learner's one
    forward pass see the same window, so the logprobs agree past the window's length too."""
    model, tok = tiny_model(seed=0, tokenizer=tiny[1], sliding_window=8)
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    policy = HFPolicy(model, tok, name="tiny-local")
    ids = _prompt(policy, "List the files of the current directory, one per line, then stop.")
    assert len(ids) > 8
    g = policy.generate_sync(Prompt(token_ids=ids), SamplingParams(temperature=1.0, max_new_tokens=24, seed=3))
    expected = recompute(policy.model, ids, g.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(g.logprobs, expected, strict=True)) < 1e-5
    full, _ = tiny_model(seed=0, tokenizer=tok)  # same weights, full attention: different numbers
    assert max(abs(a - b) for a, b in zip(recompute(full, ids, g.token_ids, 1.0), expected, strict=True)) > 1e-3
    with pytest.raises(ValueError, match="full_attention_layers"):
        tiny_model(seed=0, tokenizer=tok, sliding_window=8, full_attention_layers=3)


def test_top_p_samples_only_from_the_nucleus() -> None:
    logits = torch.tensor([3.0, 2.9, -5.0, -5.0])
    gen = torch.Generator().manual_seed(0)
    drawn = {pick_token(logits, 1.0, 0.5, gen)[0] for _ in range(200)}
    assert drawn == {0}  # p(0) ~ 0.52 >= 0.5: the nucleus is one token
    drawn = {pick_token(logits, 1.0, 0.9, gen)[0] for _ in range(200)}
    assert drawn == {0, 1}
    tok, lp = pick_token(logits, 1.0, 0.5, gen)
    assert lp == pytest.approx(float(torch.log_softmax(logits, -1)[0]))  # untruncated, not log(1)


def test_same_seed_same_tokens_different_seed_different(policy: HFPolicy) -> None:
    p = Prompt(token_ids=_prompt(policy))
    a = policy.generate_sync(p, SamplingParams(max_new_tokens=24, seed=7))
    b = asyncio.run(policy.generate(p, SamplingParams(max_new_tokens=24, seed=7)))
    c = policy.generate_sync(p, SamplingParams(max_new_tokens=24, seed=8))
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids


def test_stop_string_ends_the_turn_at_the_completing_token(policy: HFPolicy) -> None:
    p = Prompt(token_ids=_prompt(policy))
    free = policy.generate_sync(p, SamplingParams(max_new_tokens=30, seed=5))
    tok = policy.tokenizer
    # A stop string that spans tokens 10..12 of what this seed samples.
    stop = tok.decode(list(free.token_ids[10:13]))[1:]
    assert stop and stop not in tok.decode(list(free.token_ids[:12]))
    g = policy.generate_sync(p, SamplingParams(max_new_tokens=30, seed=5, stop=("never-there", stop)))
    assert g.finish_reason is FinishReason.STOP
    assert g.token_ids == free.token_ids[:13] and g.text.endswith(stop)


def test_end_of_turn_token_stops_and_is_kept(tiny: Any) -> None:
    model, tok = tiny
    free = HFPolicy(model, tok).generate_sync(Prompt(token_ids=tok.encode("hello")), SamplingParams(max_new_tokens=12, seed=1))
    eot_like = free.token_ids[6]
    assert eot_like not in free.token_ids[:6]
    g = HFPolicy(model, tok, stop_token_ids=[eot_like]).generate_sync(
        Prompt(token_ids=tok.encode("hello")), SamplingParams(max_new_tokens=12, seed=1)
    )
    assert g.finish_reason is FinishReason.STOP and g.token_ids == free.token_ids[:7]
    assert HFPolicy(model, tok).stop_token_ids == {tok.convert_tokens_to_ids(EOT)}


def test_thinking_budget_closes_the_thinking_and_marks_it_unsampled(policy: HFPolicy, recompute: Any) -> None:
    tok = policy.tokenizer
    close_id = tok.convert_tokens_to_ids("</think>")
    ids = _prompt(policy) + tok.encode("<think>", add_special_tokens=False)  # the model starts inside
    budget = ThinkingBudget(max_thinking_tokens=5)
    g = policy.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=12, seed=2), budget)
    assert close_id not in g.token_ids[:5]  # it did not close by itself...
    assert g.token_ids[5] == close_id  # ...so the policy did, exactly at the budget
    assert g.loss_mask == (1,) * 5 + (0,) + (1,) * 6 and g.logprobs[5] == 0.0
    assert g.thinking_tokens == 5 and g.budget_closed and g.finish_reason is FinishReason.LENGTH
    # Sampled tokens after the insertion are still exact under the full forward pass.
    expected = recompute(policy.model, ids, g.token_ids, 1.0)
    assert all(abs(a - b) < 1e-5 for a, b, m in zip(g.logprobs, expected, g.loss_mask) if m)
    # No room left to act after the close tag: the budget ended the turn.
    short = policy.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=6, seed=2), budget)
    assert short.finish_reason is FinishReason.BUDGET and short.token_ids == g.token_ids[:6]
    # A zero budget closes at once; outside thinking nothing is inserted.
    zero = policy.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=3, seed=2), ThinkingBudget(0))
    assert zero.token_ids[0] == close_id and zero.loss_mask == (0, 1, 1) and zero.thinking_tokens == 0
    plain = policy.generate_sync(Prompt(token_ids=_prompt(policy)), SamplingParams(max_new_tokens=8, seed=2), ThinkingBudget(0))
    assert not plain.budget_closed and plain.sampled_mask == ()


def test_weight_swap_changes_outputs_and_version(policy: HFPolicy, tiny: Any) -> None:
    p = Prompt(token_ids=_prompt(policy))
    before = policy.generate_sync(p, SamplingParams(max_new_tokens=16, seed=4))
    other, _ = tiny_model(seed=1, tokenizer=tiny[1])
    policy.set_weights(other, version=3)
    after = policy.generate_sync(p, SamplingParams(max_new_tokens=16, seed=4))
    assert policy.version == 3 and after.policy_version == 3 and before.policy_version == 0
    assert after.token_ids != before.token_ids
    policy.load_state_dict(tiny[0].state_dict(), version=4)
    assert policy.generate_sync(p, SamplingParams(max_new_tokens=16, seed=4)).token_ids == before.token_ids


def test_a_turn_sees_one_version_during_a_concurrent_swap(policy: HFPolicy, tiny: Any, recompute: Any) -> None:
    ids = _prompt(policy)
    old = {k: v.clone() for k, v in policy.model.state_dict().items()}
    result: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: result.update(g=policy.generate_sync(Prompt(token_ids=ids), SamplingParams(max_new_tokens=300, seed=1)))
    )
    worker.start()
    deadline = time.monotonic() + 10
    while policy.in_flight == 0 and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert policy.in_flight == 1, "the turn should still be in flight when the swap starts"
    other, _ = tiny_model(seed=9, tokenizer=tiny[1])
    policy.set_weights(other, version=1)  # blocks until the turn in flight is done
    worker.join(10)
    g = result["g"]
    assert g.policy_version == 0 and policy.version == 1
    old_model, _ = tiny_model(seed=0, tokenizer=tiny[1])
    old_model.load_state_dict(old)
    expected = recompute(old_model, ids, g.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(g.logprobs, expected)) < 1e-5


def test_token_exact_contract_with_episode_renderer(policy: HFPolicy, recompute: Any) -> None:
    rendered = get_harness("claude_code").render("Fix the failing test.", "high")
    r = EpisodeRenderer(policy.tokenizer, rendered.messages, rendered.tools)
    first = r.prompt_ids()
    g1 = policy.generate_sync(Prompt(token_ids=first), SamplingParams(max_new_tokens=10, seed=1))
    r.add_completion(g1.token_ids, {"content": g1.text}, g1.logprobs)
    assert r.current.ids[: len(first)] == first
    assert tuple(r.current.ids[len(first) : len(first) + 10]) == g1.token_ids
    r.add_observations([{"role": "user", "content": "Go on."}])
    second = r.prompt_ids()
    assert second[: len(first) + 10] == first + list(g1.token_ids)
    g2 = policy.generate_sync(Prompt(token_ids=second), SamplingParams(max_new_tokens=10, seed=2))
    r.add_completion(g2.token_ids, {"content": g2.text}, g2.logprobs)
    # The learner's view: one forward over the sample, logprobs where mask == 1 match the sampler's.
    s = r.current
    full = recompute(policy.model, s.ids[:1], s.ids[1:], 1.0)
    got = [(lp, full[i - 1]) for i, (m, lp) in enumerate(zip(s.mask, s.logprobs)) if m]
    assert len(got) == 20 and max(abs(a - b) for a, b in got) < 1e-5


def test_checkpoint_roundtrip_and_load_by_path(tmp_path: Any, policy: HFPolicy) -> None:
    save_checkpoint(policy.model, policy.tokenizer, tmp_path / "ckpt")
    model, tok = load_checkpoint(tmp_path / "ckpt")
    assert tok.encode("<tool_call>ls</tool_call>") == policy.tokenizer.encode("<tool_call>ls</tool_call>")
    p = Prompt(token_ids=_prompt(policy))
    by_path = HFPolicy(str(tmp_path / "ckpt"))
    assert by_path.generate_sync(p, SamplingParams(max_new_tokens=8, seed=1)).token_ids == \
        policy.generate_sync(p, SamplingParams(max_new_tokens=8, seed=1)).token_ids
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(tmp_path / "nope")


def test_bad_inputs_are_named(policy: HFPolicy) -> None:
    with pytest.raises(PolicyError, match="neither token_ids nor messages"):
        policy.generate_sync(Prompt(), SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        policy.generate_sync(Prompt(token_ids=[1]), SamplingParams(top_p=0))
    with pytest.raises(PolicyError, match="generation failed"):
        policy.generate_sync(Prompt(token_ids=[10**7]), SamplingParams(max_new_tokens=2))
