"""The sweep's policies, built on a worker: the two references and the model kinds, each counted.

* ``oracle``: ``rollout.policy.scripted.ScriptedPolicy`` (replays the task's oracle).
* ``do_nothing``: ``DoNothingPolicy`` submits on its first turn without touching
  the sandbox (with no answer), the same agent ``agentenv check`` proves earns zero.
* ``checkpoint``: ``HFPolicy`` on a local folder or ``tiny``.
* ``openai``: ``OpenAIPolicy`` with the spec's HTTP retries and backoff.

Every policy is wrapped in ``Counted``, which binds per episode (like the
scripted policy does) and adds up what ``Turn`` does not record: thinking
tokens, and the prompt / completion tokens a server reports in ``usage`` when
the prompt went as chat messages (no token ids to count on our side).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from agentenv.intents import Intent
from rollout.attempt import EpisodeContext
from rollout.harnesses.base import BaseHarness
from rollout.policy.types import FinishReason, Generation, Policy, PolicyError, Prompt, SamplingParams, ThinkingBudget

if TYPE_CHECKING:
    from rollout.eval.config import PolicySpec

__all__ = ["Counted", "DoNothingPolicy", "build_eval_policy"]


class DoNothingPolicy(Policy):
    """Submits at once, in the episode's harness, with no answer: a task proven by ``agentenv check`` scores 0."""

    name = "do-nothing"

    def __init__(self, *, version: int = 0) -> None:
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = int(version)

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        return _Submit(self, ctx)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        raise PolicyError("DoNothingPolicy needs its episode's harness: run it through EpisodeRunner")


class _Submit(Policy):
    def __init__(self, parent: DoNothingPolicy, ctx: EpisodeContext) -> None:
        self.name, self._parent, self._harness = parent.name, parent, ctx.harness

    @property
    def version(self) -> int:
        return self._parent.version

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        if not isinstance(self._harness, BaseHarness):
            raise PolicyError(f"DoNothingPolicy writes calls with BaseHarness.from_intent; {type(self._harness).__name__} is not one")
        text = self._harness.render_turn([Intent("submit", {"answer": None})])
        return Generation(text, (), (), FinishReason.STOP, self.version)


class Counted(Policy):
    """Wraps a policy; ``counts[episode_id]`` holds the tokens of that episode's latest attempt."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.counts: dict[str, dict[str, int]] = {}

    @property
    def version(self) -> int:
        return int(self.inner.version)

    def __getattr__(self, item: str) -> Any:  # set_weights / set_version / tokenizer reach the inner policy
        return getattr(self.inner, item)

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        inner = self.inner.for_episode(ctx)
        counts = {"thinking_tokens": 0, "usage_prompt_tokens": 0, "usage_completion_tokens": 0, "generations": 0}
        self.counts[ctx.request.episode_id] = counts
        return _CountedEpisode(inner, counts)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        return await self.inner.generate(prompt, sampling, budget)  # type: ignore[no-any-return]


class _CountedEpisode(Policy):
    def __init__(self, inner: Any, counts: dict[str, int]) -> None:
        self.inner, self.counts = inner, counts
        self.name = getattr(inner, "name", "policy")

    @property
    def version(self) -> int:
        return int(self.inner.version)

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: ThinkingBudget | None = None) -> Generation:
        gen: Generation = await self.inner.generate(prompt, sampling, budget)
        c = self.counts
        c["generations"] += 1
        c["thinking_tokens"] += int(gen.thinking_tokens or 0)
        usage = gen.extra.get("usage") if isinstance(gen.extra, dict) else None
        if isinstance(usage, dict):
            c["usage_prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
            c["usage_completion_tokens"] += int(usage.get("completion_tokens") or 0)
        elif isinstance(gen.extra.get("prompt_token_ids"), (list, tuple)):  # a chat prompt the server tokenised
            c["usage_prompt_tokens"] += len(gen.extra["prompt_token_ids"])
        return gen


def build_eval_policy(spec: PolicySpec) -> tuple[Any, Any]:
    """The policy object and its tokenizer (None when the runner needs none). Model code imports lazily."""
    if spec.kind == "oracle":
        from rollout.policy.scripted import ScriptedPolicy

        return ScriptedPolicy(), None
    if spec.kind == "do_nothing":
        return DoNothingPolicy(), None
    if spec.kind == "checkpoint":
        from rollout.policy.hf import HFPolicy

        policy = HFPolicy(str(spec.checkpoint), device=spec.device, name=f"{spec.name}:{spec.checkpoint}")
        return policy, policy.tokenizer
    from rollout.policy.openai_policy import OpenAIPolicy

    assert spec.url is not None and spec.model is not None  # PolicySpec validates kind "openai" has both
    return (
        OpenAIPolicy(
            spec.url, spec.model, api_key=os.environ.get(spec.api_key_env, "EMPTY"), timeout_s=spec.timeout_s,
            max_retries=spec.max_retries, backoff_s=spec.backoff_s, version=spec.version or 0, name=spec.name,
        ),
        None,
    )
