"""The trajectory records of ``rollout``: what one episode leaves behind for training.

A ``Trajectory`` is written once to the ``TrajectoryStore`` (keyed by
``episode_id``) and read back by the learner, by evaluation and by people
debugging a run, so it carries everything needed to train on it, to split
metrics by it (harness, effort, domain) and to explain it (status, error,
verifier details, timings) without the sandbox that produced it.

Why ``samples`` and not one token sequence: a chat template that is not
append-only (one that drops earlier thinking, say) re-renders the history, so
the tokens the model saw at turn 5 are not a prefix extension of turn 4's. Such
an episode becomes several training samples, each a sequence the model really
conditioned on. An append-only episode has exactly one sample, and
``Trajectory.token_ids`` / ``logprobs`` / ``loss_mask`` read it directly.

Token arrays are fixed-width by contract: token ids fit int32, logprobs are
float32 (what inference servers return), the loss mask is 0/1. ``Sample``
converts on construction, so a record read back from the store compares equal,
bit for bit, to the one written.

A failed episode is a record, not an exception (``Status`` plus ``error``);
only ``TRAINABLE`` statuses feed group-relative advantages.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rollout.errors import RecordError
__all__ = ["TRAINABLE", "Sample", "Status", "Timings", "Trajectory", "Turn"]


class Status(str, enum.Enum):
    """How an episode ended.

    ``truncated``: turn or token budget spent before submit (still graded).
    ``timeout``: the episode's wall-clock limit hit (still graded).
    ``sandbox_lost``: the container died; nothing to grade, the scheduler retries.
    ``policy_error``: the model server failed (not a malformed tool call: that is a
    tool error inside an ``ok`` episode).
    ``invalid``: the verifier could not decide; never counted as pass or fail.
    ``worker_lost``: the rollout worker (process or node) died under the episode more
    often than its rerun budget allows; infrastructure, not the policy.
    ``error``: a bug in the runner or worker (an exception outside the episode loop);
    infrastructure, not the policy and not the verifier.
    """

    OK = "ok"
    TRUNCATED = "truncated"
    TIMEOUT = "timeout"
    SANDBOX_LOST = "sandbox_lost"
    POLICY_ERROR = "policy_error"
    INVALID = "invalid"
    WORKER_LOST = "worker_lost"
    ERROR = "error"


#: Statuses whose reward is a real grade of what the model did. The others say
#: nothing about the policy (infrastructure failed, or the grader could not decide).
TRAINABLE: frozenset[Status] = frozenset({Status.OK, Status.TRUNCATED, Status.TIMEOUT})

_INT32 = "i"
_FLOAT32 = "f"
assert array(_INT32).itemsize == 4 and array(_FLOAT32).itemsize == 4  # noqa: S101 - platform contract


@dataclass(frozen=True)
class Sample:
    """One training sequence: prompt and response tokens of some turns, as the model saw them.

    ``loss_mask[i]`` is 1 exactly where token ``i`` was sampled by the policy and
    0 on prompt, tool-output and template tokens. ``logprobs[i]`` is the
    sampling-time log-probability of token ``i`` where the mask is 1 (0.0 elsewhere
    by convention); the learner uses it for rollout-vs-trainer importance weights.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]

    def __post_init__(self) -> None:
        try:
            ids = tuple(array(_INT32, self.token_ids))
        except (OverflowError, TypeError) as exc:
            raise RecordError(f"Sample.token_ids: expected int32 token ids, got {exc}") from exc
        lps = tuple(array(_FLOAT32, self.logprobs))  # rounds to float32, see module docstring
        mask = tuple(int(m) for m in self.loss_mask)
        if not len(ids) == len(lps) == len(mask):
            raise RecordError(
                "Sample: token_ids, logprobs and loss_mask must have one entry per token, "
                f"got lengths {len(ids)}, {len(lps)}, {len(mask)}"
            )
        if any(m not in (0, 1) for m in mask):
            raise RecordError(f"Sample.loss_mask: expected only 0 and 1, got {sorted(set(mask) - {0, 1})}")
        object.__setattr__(self, "token_ids", ids)
        object.__setattr__(self, "logprobs", lps)
        object.__setattr__(self, "loss_mask", mask)

    @property
    def num_sampled(self) -> int:
        """Tokens the policy generated (the ones the loss sees)."""
        return sum(self.loss_mask)


@dataclass(frozen=True)
class Turn:
    """One generate -> execute step. ``policy_version`` is the weights that sampled this turn.

    Versions may change between turns of one episode (weights are swapped
    between generations), which is why they are recorded per turn.
    """

    index: int
    policy_version: int
    policy_s: float = 0.0
    sandbox_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    tool_errors: int = 0


@dataclass(frozen=True)
class Timings:
    """Where an episode's wall-clock time went, in seconds.

    ``total_s`` is measured end to end, so ``total_s - policy_s - sandbox_s -
    verifier_s`` is the overhead (harness, queueing, store) worth watching.
    """

    policy_s: float = 0.0
    sandbox_s: float = 0.0
    verifier_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class Trajectory:
    """Everything one episode produced, keyed by ``episode_id`` (unique across runs).

    ``policy_version`` is the *oldest* weights version that sampled any token of
    the episode, the number the staleness bound is checked against; per-turn
    versions are in ``turns``. ``domain`` and ``effort`` take the values of
    ``agentenv.types.Domain`` and ``agentenv.intents.EFFORT_LEVELS``; they are
    plain strings so this module stays importable without ``agentenv``.
    ``verifier`` is the verifier's details as JSON-serialisable data.
    """

    episode_id: str
    run_id: str
    task_id: str
    domain: str
    seed: int
    harness: str
    effort: str
    policy_version: int
    status: Status
    reward: float
    error: str = ""
    verifier: Mapping[str, Any] = field(default_factory=dict)
    samples: tuple[Sample, ...] = ()
    turns: tuple[Turn, ...] = ()
    tool_errors: int = 0
    timings: Timings = field(default_factory=Timings)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def __post_init__(self) -> None:
        if not self.episode_id:
            raise RecordError(f"Trajectory.episode_id: expected a non-empty id, got {self.episode_id!r}")
        try:
            object.__setattr__(self, "status", Status(self.status))
        except ValueError:
            allowed = ", ".join(s.value for s in Status)
            raise RecordError(f"Trajectory.status: expected one of {allowed}, got {self.status!r}") from None
        if self.created_at.tzinfo is None:
            raise RecordError("Trajectory.created_at: expected a timezone-aware datetime, got a naive one")
        object.__setattr__(self, "created_at", self.created_at.astimezone(timezone.utc))
        object.__setattr__(self, "samples", tuple(self.samples))
        object.__setattr__(self, "turns", tuple(self.turns))

    def _only_sample(self, what: str) -> Sample:
        if len(self.samples) != 1:
            raise RecordError(
                f"Trajectory.{what}: episode {self.episode_id} has {len(self.samples)} samples "
                "(a non-append-only template splits it); read Trajectory.samples instead"
            )
        return self.samples[0]

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Token ids of the single sample of an append-only episode."""
        return self._only_sample("token_ids").token_ids

    @property
    def logprobs(self) -> tuple[float, ...]:
        """Sampled-token logprobs of the single sample of an append-only episode."""
        return self._only_sample("logprobs").logprobs

    @property
    def loss_mask(self) -> tuple[int, ...]:
        """Loss mask of the single sample of an append-only episode."""
        return self._only_sample("loss_mask").loss_mask

    @property
    def trainable(self) -> bool:
        return self.status in TRAINABLE

