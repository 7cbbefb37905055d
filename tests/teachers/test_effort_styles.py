"""Effort levels at generation, through real episodes: the styled oracle's demonstrations, the effort message
left out for an expert, and the level's thinking cap reaching the policy (Docker sandboxes, real verifiers)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from learner.effort import episode_tokens
from rollout.episode import EpisodeContext, EpisodeRequest, EpisodeRunner
from rollout.harnesses import get_harness
from rollout.policy.hf import HFPolicy
from rollout.policy.models import tiny_model
from rollout.policy.scripted import EFFORT_PLANS, EFFORT_PLANS_STEPS, ScriptedPolicy, oracle_parts
from rollout.policy.types import Generation, Policy, Prompt, SamplingParams, ThinkingBudget
from rollout.types import Trajectory

pytestmark = pytest.mark.docker

HARNESSES = ("claude_code", "codex", "kimi_code")


@pytest.fixture(scope="module")
def backend(docker_client: Any, base_image: str) -> Iterator[Any]:
    from sandboxes.docker_backend import DockerBackend

    b = DockerBackend(docker_client)
    yield b
    b.close()


def _run(policy: Any, backend: Any, tok: Any, reqs: list[EpisodeRequest]) -> list[Trajectory]:
    runner = EpisodeRunner(policy, backend=backend, tokenizer=tok, pool_size=1)

    async def go() -> list[Trajectory]:
        return list(await asyncio.gather(*(runner.run(r) for r in reqs)))

    try:
        return asyncio.run(go())
    finally:
        runner.close()


def _req(tag: str, harness: str, effort: str | None, **kw: Any) -> EpisodeRequest:
    return EpisodeRequest(episode_id=f"styles/{tag}/{harness}/{effort}", run_id="styles", task_id="general/count_lines",
                          seed=4, harness=harness, effort=effort, **kw)


def test_styled_oracle_lengths_rise_low_high_max_in_every_harness(backend: Any, tok: Any) -> None:
    reqs = [_req("styled", h, e, show_effort=False) for h in HARNESSES for e in ("low", "high", "max")]
    trajs = _run(ScriptedPolicy(styled=True), backend, tok, reqs)
    assert all(t.reward == 1.0 for t in trajs), [(t.harness, t.effort, t.status, t.error) for t in trajs]
    for h in HARNESSES:
        low, high, max_ = (t for t in trajs if t.harness == h)
        assert episode_tokens(low) < episode_tokens(high) < episode_tokens(max_), h
        assert [len(t.turns) for t in (low, high, max_)] == [2, 2, 3]  # max: call, verifying call, submit
        text = tok.decode(list(max_.samples[0].token_ids))
        assert f"<think>{EFFORT_PLANS['max']}</think>" in text and "cat /workspace/answer.txt" in text
        effort_text = get_harness(h).effort_text("max")
        assert effort_text not in text  # show_effort=False: the expert's prompt has no effort message
    unstyled = _run(ScriptedPolicy(), backend, tok, [_req("plain", "codex", "max")])[0]
    assert len(unstyled.turns) == 2 and "<think>" not in tok.decode(list(unstyled.samples[0].token_ids))
    assert get_harness("codex").effort_text("max") in tok.decode(list(unstyled.samples[0].token_ids))


def test_an_oracle_cut_into_parts_is_one_call_a_part_in_every_harness_and_style(backend: Any, tok: Any) -> None:
    """general/count_lines_pipeline's oracle: three pipeline stages and the count, a shell call each, then submit."""
    reqs = [EpisodeRequest(episode_id=f"styles/parts/{h}/{e}", run_id="styles", task_id="general/count_lines_pipeline",
                           seed=1004, harness=h, effort=e, show_effort=False) for h in HARNESSES for e in ("low", "max")]
    trajs = _run(ScriptedPolicy(styled=True), backend, tok, reqs)
    assert all(t.reward == 1.0 for t in trajs), [(t.harness, t.effort, t.status, t.error) for t in trajs]
    for t in trajs:
        assert len(t.turns) == (6 if t.effort == "max" else 5), (t.harness, t.effort)  # 4 calls (+ verifying), submit
        text = tok.decode(list(t.samples[0].token_ids))
        order = [text.find(s) for s in ("pipeline/fetch.py", "pipeline/unpack.py", "pipeline/clean.py", "> /workspace/answer.txt")]
        assert -1 not in order and order == sorted(order), (t.harness, order)
        assert (f"<think>{EFFORT_PLANS_STEPS['max'].format(n=4)}</think>" in text) == (t.effort == "max")


def test_oracle_parts_split_on_the_break_line_only() -> None:
    script = "a\n# --- next call ---\nb\nc\n  # --- next call ---  \n\n# --- next call ---\n"
    assert oracle_parts(script) == ["a\n", "b\nc\n"]
    assert oracle_parts("\necho 1\necho 2\n\n") == ["\necho 1\necho 2\n\n"]  # no break: one call, the script as it is
    assert oracle_parts("echo '# --- next call --- no'\n") == ["echo '# --- next call --- no'\n"]


class _Recording:
    """The real HF policy, recording the thinking budget each turn was given."""

    def __init__(self, policy: HFPolicy) -> None:
        self.inner, self.name, self.budgets = policy, "recording", []  # type: list[ThinkingBudget | None]

    @property
    def version(self) -> int:
        return self.inner.version

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        return self  # type: ignore[return-value]

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        self.budgets.append(budget)
        return await self.inner.generate(prompt, sampling, budget)


def test_the_levels_thinking_cap_reaches_the_policy(backend: Any, tok: Any) -> None:
    model, _ = tiny_model(seed=0, tokenizer=tok)
    policy = _Recording(HFPolicy(model, tok))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    _run(policy, backend, tok, [_req("cap", "codex", "low", thinking_budget=3, sampling=sampling)])
    assert policy.budgets and all(b == ThinkingBudget(3) for b in policy.budgets)
    policy.budgets.clear()
    _run(policy, backend, tok, [_req("uncapped", "codex", "low", sampling=sampling)])
    assert policy.budgets and all(b is None for b in policy.budgets)
