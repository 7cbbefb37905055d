"""Append-only token rendering on a multi-turn episode, for every harness."""

from __future__ import annotations

from typing import Any

import pytest
from episodes import SCRIPTS, completion_text, fake_result

from agentenv.intents import Intent
from rollout.harnesses import get_harness
from rollout.harnesses.rendering import EpisodeRenderer
from rollout.tokenizer import EOT, build_tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_tokenizer(cache_dir=tmp_path_factory.mktemp("tok"))


def play(tok: Any, name: str, **template_kwargs: Any) -> tuple[EpisodeRenderer, list[list[int]], list[list[int]]]:
    """Run the scripted episode; return the renderer, each turn's prompt and each completion."""
    h = get_harness(name)
    prompt = h.render("Fix a.py so x is 2.", effort="high")
    r = EpisodeRenderer(tok, prompt.messages, prompt.tools, template_kwargs=template_kwargs)
    prompts, completions = [], []
    for turn, (tool, args) in enumerate(SCRIPTS[name]):
        prompts.append(r.prompt_ids())
        ids = tok.encode(completion_text(turn, tool, args), add_special_tokens=False) + [tok.convert_tokens_to_ids(EOT)]
        completions.append(ids)
        parsed = h.parse(tok.decode(ids[:-1]))
        assert not parsed.errors, parsed.errors
        message = {
            "content": parsed.text,
            "reasoning_content": parsed.reasoning,
            "tool_calls": [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in parsed.calls],
        }
        r.add_completion(ids, message, logprobs=[-0.5] * len(ids))
        results = []
        for item in h.turn_intents(parsed):
            assert isinstance(item, Intent), item
            results.append(h.format_result(fake_result(item)))
        r.add_observations(results)
    prompts.append(r.prompt_ids())
    return r, prompts, completions


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_prompt_of_next_turn_extends_prompt_plus_completion(tok: Any, name: str) -> None:
    r, prompts, completions = play(tok, name)
    assert r.breaks == 0 and len(r.samples) == 1
    for k, completion in enumerate(completions):
        assert prompts[k + 1][: len(prompts[k]) + len(completion)] == prompts[k] + completion
    sample = r.samples[0]
    assert [t for t, m in zip(sample.ids, sample.mask) if m] == [t for c in completions for t in c]
    assert sum(1 for lp in sample.logprobs if lp == -0.5) == sum(map(len, completions))
    # The sampled text re-renders through the template to the same string: the deltas are consistent.
    assert tok.decode(sample.ids) == r._render(r.history, True)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_template_that_drops_thinking_starts_new_samples(tok: Any, name: str) -> None:
    r, _, completions = play(tok, name, keep_thinking=False)
    # Every observation follows a turn whose thinking the template then drops: one break each,
    # and the last sample is the fresh prompt of a turn not yet sampled.
    assert r.breaks == len(completions) and len(r.samples) == len(completions) + 1
    assert 1 not in r.samples[-1].mask
    for sample, completion in zip(r.samples, completions):
        assert [t for t, m in zip(sample.ids, sample.mask) if m] == completion
        assert sample.mask[: sample.prompt_len] == [0] * sample.prompt_len


def test_cut_off_completion_is_closed_with_an_unsampled_eot(tok: Any) -> None:
    h = get_harness("bash")
    p = h.render("x")
    r = EpisodeRenderer(tok, p.messages, p.tools)
    ids = tok.encode("I was cut", add_special_tokens=False)
    r.add_completion(ids, {"content": "I was cut"})
    r.add_observations([{"role": "user", "content": "continue"}])
    s = r.samples[0]
    assert s.mask.count(1) == len(ids) and r.closed_by_env == 1
    assert s.ids[s.prompt_len + len(ids)] == tok.convert_tokens_to_ids(EOT)
    with pytest.raises(RuntimeError):
        r.add_observations([])
