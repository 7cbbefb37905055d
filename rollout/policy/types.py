"""The policy contract: what the episode runner asks of a model.

A policy turns a prompt (token ids for a local model, chat messages for a
server that renders its own template) into one assistant turn: the sampled
token ids, each sampled token's logprob (fp32, at the sampling temperature),
the decoded text, why it stopped, and the weight version that produced it.
The runner never needs to know which kind of policy it has.

Three implementations live beside this module: ``HFPolicy`` (a local Hugging
Face causal LM, CPU or GPU), ``OpenAIPolicy`` (any OpenAI-compatible server
asked for token ids and logprobs: vLLM / SGLang in production, ``agentenv
serve`` here) and ``ScriptedPolicy`` (replays a task's oracle, for tests and
benchmarks without a model).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# SamplingParams is part of the episode request (rollout.attempt); it is re-exported here as part of the call.
from rollout.attempt import EpisodeContext, SamplingParams


class FinishReason(str, enum.Enum):
    STOP = "stop"  # hit a stop string / end-of-turn token
    LENGTH = "length"  # max_new_tokens reached
    # The thinking budget closed the thinking and no room was left for the model to act
    # (max_new_tokens ran out during or right after the inserted close tag). When the model
    # did go on to act, the reason is STOP / LENGTH and ``Generation.budget_closed`` is True.
    BUDGET = "budget"
    # The engine was paused with mode "abort" (vLLM's ``/pause?mode=abort``) or the request was cancelled.
    ABORT = "abort"


@dataclass(frozen=True)
class ThinkingBudget:
    """The effort level's thinking budget: after ``max_thinking_tokens`` inside
    ``<think>`` the policy closes the thinking itself and the model must act."""

    max_thinking_tokens: int
    open_tag: str = "<think>"
    close_tag: str = "</think>"


@dataclass(frozen=True)
class Prompt:
    """A prompt in both forms; a policy uses the one it needs.

    ``token_ids`` is the token-exact, append-only sequence from
    ``rollout.harnesses.rendering.EpisodeRenderer`` (local models must use it);
    ``messages``/``tools`` are the chat form for servers that template themselves.
    """

    token_ids: Sequence[int] = ()
    messages: Sequence[Mapping[str, Any]] = ()
    tools: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class Generation:
    """One sampled assistant turn. ``len(token_ids) == len(logprobs)``.

    ``sampled_mask[i] == 0`` marks a token the *policy* inserted rather than
    sampled (the close tag a thinking budget forces); the runner gives those
    loss mask 0, and their logprob is reported as 0.0. An empty
    ``sampled_mask`` means every token was sampled; use ``loss_mask`` to read it.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    policy_version: int
    tool_calls: tuple[Mapping[str, Any], ...] = ()  # OpenAI-style, when a server parsed them
    thinking_tokens: int = 0
    latency_s: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)
    sampled_mask: tuple[int, ...] = ()  # empty: all sampled; else 1 sampled / 0 inserted, per token
    budget_closed: bool = False  # the thinking budget inserted the close tag in this turn
    # The weight version of every token when they differ (a ``keep``-mode update mid-turn); empty: all
    # ``policy_version``. ``policy_version`` is then the oldest, as staleness counts it.
    token_versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Generation: {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs"
            )
        if self.sampled_mask and len(self.sampled_mask) != len(self.token_ids):
            raise ValueError(
                f"Generation: {len(self.token_ids)} token ids but {len(self.sampled_mask)} sampled_mask entries"
            )
        if self.token_versions and len(self.token_versions) != len(self.token_ids):
            raise ValueError(
                f"Generation: {len(self.token_ids)} token ids but {len(self.token_versions)} token_versions entries"
            )

    @property
    def loss_mask(self) -> tuple[int, ...]:
        """1 per sampled token, 0 per token the policy inserted (``sampled_mask`` made explicit)."""
        return self.sampled_mask if self.sampled_mask else (1,) * len(self.token_ids)


class PolicyError(RuntimeError):
    """The policy could not produce a turn (server down after retries, bad response).

    The episode runner turns it into a trajectory with status ``policy_error``.
    """


@runtime_checkable
class Policy(Protocol):
    """A model the episode runner samples from. ``version`` is the weight version now loaded.

    ``for_episode(ctx)`` is called once per attempt, before its first turn, and the
    attempt samples from what it returns. The default returns the policy itself;
    a policy that needs to know its episode (the scripted oracle replays the
    task's own solution in the episode's harness) returns a per-episode policy.
    Subclass ``Policy`` to inherit the default.
    """

    name: str

    @property
    def version(self) -> int: ...

    async def generate(
        self,
        prompt: Prompt,
        sampling: SamplingParams,
        budget: ThinkingBudget | None = None,
    ) -> Generation: ...

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        """The policy that plays the episode ``ctx`` describes (by default, this one)."""
        return self


@runtime_checkable
class WeightSwappingPolicy(Protocol):
    """A policy holding its weights itself (a local model): new ones are loaded in place, between its turns."""

    def set_weights(self, weights: Any, version: int) -> None: ...


@runtime_checkable
class VersionedPolicy(Protocol):
    """A policy whose weights live elsewhere (a served model): it is told the version now loaded there."""

    def set_version(self, version: int) -> None: ...


__all__ = [
    "FinishReason",
    "Generation",
    "Policy",
    "VersionedPolicy",
    "WeightSwappingPolicy",
    "PolicyError",
    "Prompt",
    "SamplingParams",
    "ThinkingBudget",
]
