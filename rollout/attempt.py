"""The episode contract: what one attempt at an episode is given, may learn, and leaves behind.

An episode (``rollout.episode.EpisodeRunner``) is one or more *attempts*: each runs
the request on a fresh sandbox, and an attempt whose sandbox dies raises
``EpisodeLost`` so the runner retries it (``sandbox_retries``) before it records
``sandbox_lost``. Two implementations run an attempt over this contract:

* ``rollout.emulated_attempt``: our loop drives an emulated harness (render,
  generate, parse, execute intents, repeat), for every harness in
  ``rollout.harnesses``;
* ``rollout.native_attempt``: a third-party agent program (``native:claude_code``,
  ``native:codex``, ``native:kimi_cli``) drives its own loop in the sandbox, and the
  gateway records its model calls.

Both receive what the runner resolved (the request, its ``Task``, the policy
named by the request, the sampling to use) plus an ``AttemptHost``, the
runner's shared services (backend, warm pools, threads, tokenizer, gate), and
both return a ``Trajectory``: a failed attempt is a record, except a lost
sandbox, which is ``EpisodeLost``.

Why this module is its own: the request, the context a policy binds to, the lost
error and the verifier's record are what the runner, both attempt kinds and the
policies (``Policy.for_episode``) share. Kept here, below all of them, nothing in
``rollout`` has to import an attempt module's internals or import in a circle.
``SamplingParams`` lives here for the same reason (a request carries it, and
``rollout.policy.types`` re-exports it as part of the policy call).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from agentenv.intents import Harness
from agentenv.types import Task, Variant, VerifierResult
from rollout.branching import BranchRole, TreeRegistry
from rollout.errors import RolloutError
from rollout.gate import TurnGate
from rollout.harnesses import canonical_harness
from rollout.pristine import Lease, PristineSandboxes
from sandboxes.types import Sandbox, SandboxBackend, SnapshotRef

T = TypeVar("T")

__all__ = [
    "AttemptHost", "EpisodeContext", "EpisodeLost", "EpisodeRequest", "SamplingParams", "verifier_record",
]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn. ``stop`` strings end the turn (e.g. a harness's end-of-call marker)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class EpisodeRequest:
    """What to run. ``attempt`` counts reruns of the same ``episode_id`` (a retry after a lost sandbox).

    ``policy`` names which of the runner's policies acts (``""``: its default), and
    ``sampling`` overrides the runner's sampling for this episode: so one runner (a
    Ray worker) serves the oracle warm start, training rollouts and greedy
    evaluations without being rebuilt, and a request says everything that decides
    its result.

    ``harness`` is a harness name (``rollout.harnesses``) or a native agent program
    (``native:codex``); the older prefix ``cli:`` is read as ``native:``.
    """

    episode_id: str
    run_id: str
    task_id: str
    seed: int
    harness: str
    effort: str | None = None
    group_id: str = ""
    attempt: int = 0
    policy: str = ""
    sampling: SamplingParams | None = None
    # Observations carry no measured quantity (a command's wall time renders as 0.0): what a run with
    # ``trainer.deterministic`` asks for, since a measured duration in a prompt makes the same seed
    # tokenize differently on every run.
    fixed_observations: bool = False
    # The effort level's generation-time cap: thinking is closed after this many tokens in a turn
    # (``ThinkingBudget``; the inserted close tag gets loss mask 0). None: uncapped.
    thinking_budget: int | None = None
    # False: the prompt carries no effort message although ``effort`` is set (an expert of one effort
    # cell is trained, and scores, without it; the effort still selects its budget, style and metrics).
    show_effort: bool = True
    # Its place in a tree rollout (``rollout.branching``): None, an independent episode (the default).
    branch: BranchRole | None = None
    # A lost sandbox resumes from the last turn-boundary snapshot (up to ``MAX_RESUMES`` times) instead of the
    # attempt failing: a FAST snapshot at every turn boundary (the emulated attempt only).
    resume_from_snapshots: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "harness", canonical_harness(self.harness))  # "cli:x" is recorded as "native:x"
        if isinstance(self.branch, dict):  # read back from JSON (a checkpointed run's pending groups)
            object.__setattr__(self, "branch", BranchRole.from_json(self.branch))


@dataclass(frozen=True)
class EpisodeContext:
    """What a policy's ``for_episode`` learns about the episode it is about to play.

    ``harness`` is the harness whose tool surface the policy writes in (for a
    native program, the emulated harness of the same tools). ``sandbox`` is there
    for tests and debugging hooks (killing it, say); a policy that acts on it
    bypasses the harness and is not a policy any more.
    """

    request: EpisodeRequest
    task: Task
    variant: Variant
    harness: Harness
    sandbox: Sandbox = field(repr=False)


class EpisodeLost(RolloutError, ConnectionError):
    """The attempt's sandbox died or hung (or none could be had): the runner retries on a fresh one,
    and records ``sandbox_lost`` when its retries are spent."""


class AttemptHost(Protocol):
    """What an attempt uses of the runner that started it (``EpisodeRunner`` is the one implementation).

    ``blocking`` runs a blocking call (a sandbox or grading call) in the runner's
    thread pool and waits for it without blocking the event loop; ``quiesce``
    lets an attempt, cancelled mid tool call, wait for the calls it started
    before its sandbox is released.
    """

    backend: SandboxBackend
    sandboxes: PristineSandboxes
    tokenizer: Any
    gate: TurnGate | None
    grade_in_place: bool
    trees: TreeRegistry

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T: ...

    def leaf_wait_s(self, req: EpisodeRequest) -> float:
        """How long a branch leaf waits for its point's checkpoint."""
        ...

    async def acquire(self, task: Task, variant: Variant) -> Lease:
        """A sandbox at ``variant``'s pristine state; cancelled while it is being acquired, it leaks nothing."""
        ...

    async def restore(self, task: Task, ref: SnapshotRef) -> Lease:
        """A sandbox at the FAST snapshot ``ref`` (a branch leaf, a resume); cancelled meanwhile, it leaks nothing."""
        ...

    async def quiesce(self) -> None:
        """Wait for the blocking calls of this attempt that still run (also when it is being cancelled)."""
        ...


def verifier_record(result: VerifierResult) -> dict[str, Any]:
    """The verifier's result as the JSON-serialisable dict a ``Trajectory.verifier`` carries."""
    return {
        "reward": result.reward,
        "passed": result.passed,
        "invalid": result.invalid,
        "invalid_cause": result.invalid_cause,  # "agent": counted as a failure; "grader": status invalid, excluded
        "agent_invalid": result.invalid and result.invalid_cause == "agent",
        "invalid_evidence": result.extra.get("invalid_evidence"),  # why an invalid is the grader's (or not): agentenv.grading
        **{k: result.extra[k] for k in ("tampering", "neutralised") if k in result.extra},
        "reason": result.reason,
        "details": [{"name": d.name, "passed": d.passed, "score": d.score, "detail": d.detail} for d in result.details],
        "duration_s": result.duration_s,
        "graded_in": result.extra.get("graded_in"),  # "place" (quiesced agent sandbox) or "fork"
    }
