"""The contract of evaluation sweeps: outcomes, cell keys and per-episode results.

An evaluation episode ends as exactly one ``Outcome``. The split is the point of
this package: an infrastructure failure (a lost sandbox or worker, an endpoint
that kept answering 429/5xx, a runner bug) says nothing about the policy, so it
is retried and, if the retries run out, *counted beside* the score, never inside
its denominator as a failure; an ``invalid`` episode (the grader could not
decide) is counted apart too. Only ``passed`` and ``failed`` are scored.

No opting out: an episode leaves the denominator only for a cause proven to
lie outside the agent and its policy (issue 26). ``invalid`` is stored only
for the grader's own failures, with evidence (``agentenv.grading``: a host
fault, or the oracle's state is undecidable too); an invalid the agent made
is a failure under the episode's own status. A ``policy_error`` is the
infrastructure's only when its error shows the endpoint failed (no
connection, no response in time, HTTP 5xx or 429/408/409 after retries); any
other (HTTP 400 for a prompt over the context length: a context flood the
agent's own tool output made; a response the client could not use) is the
policy's failure, scored as ``failed``. A malformed tool call never ends an
episode (it is a tool error inside an ``ok`` one), so it is scored too.

A ``CellKey`` holds everything that can change an episode's result, so two
episodes with equal keys are interchangeable (resume reuses a stored one) and
two with different keys never are (an edited temperature makes new cells).
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from agentenv.errors import ConfigError
from rollout.errors import RolloutError

__all__ = [
    "INFRA_STATUSES",
    "CellKey",
    "EpisodeResult",
    "EvalError",
    "Outcome",
    "ResumeRefused",
    "SweepConfigError",
    "outcome_of",
    "policy_fault_is_infrastructure",
]


class EvalError(RolloutError):
    """Base of every error raised by ``rollout.eval``."""


class SweepConfigError(EvalError, ConfigError):
    """A sweep file, one of its fields, or a command argument is invalid (the message names it)."""


class ResumeRefused(EvalError, ValueError):
    """``--resume`` against a sweep whose stored config differs in a field that changes results."""


class Outcome(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    INVALID = "invalid"
    INFRASTRUCTURE = "infrastructure"


#: Trajectory statuses (by value, so a status added later, like ``error``, needs no import) that mean
#: the infrastructure failed: retried, then counted apart, never as the policy's failure.
INFRA_STATUSES: frozenset[str] = frozenset({"sandbox_lost", "policy_error", "worker_lost", "error"})
_RUNNER_BUG = "runner error:"  # EpisodeRunner's record of its own exception, before Status.ERROR existed
# The grading sandbox died under the verifier (seen under heavy load: "verifier crashed: SandboxLost: ... agent
# did not start"): the runner records a grader-caused invalid, but nothing was decided about the policy.
_GRADER_LOST = "verifier crashed: SandboxLost"
#: What a ``policy_error`` says when the endpoint itself failed (``OpenAIPolicy._request``'s reasons, and the
#: episode runner's own deadline on a policy call); any other policy error is the policy's failure.
_ENDPOINT_FAULT = re.compile(
    r"(connection failed|no response within|HTTP (5\d\d|429|408|409)\b|policy timed out)"
)


def policy_fault_is_infrastructure(error: str) -> bool:
    """True when a ``policy_error``'s text proves the endpoint failed, not the policy (see the module docstring)."""
    return bool(_ENDPOINT_FAULT.search(error))


def outcome_of(status: str, reward: float, error: str = "", passed: bool | None = None) -> Outcome:
    """The outcome of a stored episode: infrastructure and invalid first, then the verifier's verdict.

    ``passed`` is the verifier's own flag when it gave one; otherwise full reward means passed.
    Truncated and timed-out episodes are graded, so they pass or fail like any other. A ``policy_error``
    counts as infrastructure only when ``error`` shows the endpoint failed (``policy_fault_is_infrastructure``).
    """
    status = str(getattr(status, "value", status))
    if status == "policy_error" and not policy_fault_is_infrastructure(error):
        return Outcome.FAILED  # a context flood, an unusable response: the policy's, counted
    if status in INFRA_STATUSES or (status == "invalid" and (error.startswith(_RUNNER_BUG) or _GRADER_LOST in error)):
        return Outcome.INFRASTRUCTURE
    if status == "invalid":
        return Outcome.INVALID
    ok = bool(passed) if passed is not None else reward >= 1.0 - 1e-9
    return Outcome.PASSED if ok else Outcome.FAILED


@dataclass(frozen=True)
class CellKey:
    """One planned episode of a sweep. ``policy_id`` is the policy's identity: its kind, its weights'
    hash or served version, and its sampling settings, hashed (see ``PolicySpec.identity``)."""

    policy: str
    policy_id: str
    task_id: str
    seed: int
    harness: str
    effort: str
    sample: int

    @property
    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def episode_id(self, sweep_id: str) -> str:
        """Readable and unique: the axes in order, then the digest of the whole key."""
        return f"{sweep_id}/{self.policy}/{self.task_id}/s{self.seed}/{self.harness}/{self.effort}/k{self.sample}#{self.digest}"

    @property
    def variant(self) -> tuple[str, int, str, str]:
        """The cluster of a standard error: one task variant under one harness and effort."""
        return (self.task_id, self.seed, self.harness, self.effort)


@dataclass(frozen=True)
class EpisodeResult:
    """One stored episode of a sweep, flattened for statistics and for ``episodes.parquet``."""

    episode_id: str
    policy: str
    policy_id: str
    task_id: str
    domain: str
    seed: int
    harness: str
    effort: str
    sample: int
    status: str
    outcome: Outcome
    reward: float
    error: str = ""
    policy_version: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    thinking_tokens: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    wall_s: float = 0.0
    infra_retries: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        return self.outcome in (Outcome.PASSED, Outcome.FAILED)

    @property
    def variant(self) -> tuple[str, int, str, str]:
        return (self.task_id, self.seed, self.harness, self.effort)

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out["outcome"] = self.outcome.value
        out["passed"] = self.outcome is Outcome.PASSED
        out["extra"] = json.dumps(self.extra, sort_keys=True)
        return out
