"""The task and verifier contract of ``agentenv``.

A *task* is something an agent can be asked to do in a sandbox and then be
graded on by physical checks. It is either a folder (``task.yaml`` plus files,
see ``TaskSpec``) or a plain Python subclass of ``Task`` for tasks that
generate their data. Both expose the same hooks, so the rest of the system
never asks which kind it has.

A *variant* is the task with its parameters drawn from a seed; the same seed
always gives the same variant (``agentenv check`` proves it).

A *verifier* looks at a grading sandbox (forked from the agent's final state,
with hidden files copied in only then) and returns a ``VerifierResult``. A
verifier that cannot decide says ``invalid`` with a reason, never "pass".
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from sandboxes.types import Sandbox, SandboxSpec

__all__ = [
    "AnswerVerifierSpec",
    "CallsVerifierSpec",
    "CheckResult",
    "ChoiceParam",
    "DbStateVerifierSpec",
    "Domain",
    "EnvironmentSpec",
    "Episode",
    "ExitCodeVerifierSpec",
    "FileCheck",
    "FilesVerifierSpec",
    "FloatParam",
    "IntParam",
    "InvalidCause",
    "Limits",
    "OracleReplay",
    "ParamSpec",
    "RowAssertion",
    "Task",
    "TaskSpec",
    "UnitTestsVerifierSpec",
    "Variant",
    "Verifier",
    "VerifierResult",
    "VerifierSpec",
    "WordParam",
]



class Domain(str, enum.Enum):
    GENERAL = "general"
    AGENT = "agent"
    CODING = "coding"


class Limits(BaseModel):
    """Per-episode limits. ``max_tokens`` is the model's output budget for the episode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(default=30, ge=1)
    wall_time_s: float = Field(default=600.0, gt=0)
    command_timeout_s: float = Field(default=60.0, gt=0)
    max_tokens: int = Field(default=8192, ge=1)


# ---------------------------------------------------------------- variants


class ChoiceParam(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["choice"] = "choice"
    choices: list[Any] = Field(min_length=1)


class IntParam(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["int"] = "int"
    low: int
    high: int  # inclusive


class FloatParam(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["float"] = "float"
    low: float
    high: float
    digits: int = 2


class WordParam(BaseModel):
    """A random lowercase identifier (file names, keys) of ``length`` letters."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["word"] = "word"
    length: int = Field(default=6, ge=1, le=32)


ParamSpec = Annotated[ChoiceParam | IntParam | FloatParam | WordParam, Field(discriminator="type")]


# ---------------------------------------------------------------- verifiers (declared in task.yaml)


class _VerifierBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    weight: float = Field(default=1.0, ge=0)
    name: str | None = None


class UnitTestsVerifierSpec(_VerifierBase):
    """Hidden pytest files (under the task's ``tests/``) run in the grading sandbox."""

    type: Literal["unit_tests"] = "unit_tests"
    in_process: Literal[True] = Field(
        default=True,
        description="the declaration this mode makes: the agent's code is imported into the pytest process that "
        "records the verdict (a repository's own test suite, SWE-style). Per-run canaries, source-only imports and "
        "the tampering scan guard it; what stays possible is in docs/sandboxes.md. For checks that can call the "
        "agent's functions from outside its process, use type: calls",
    )
    fail_to_pass: list[str] = Field(default_factory=list, description="test ids that must pass (pytest node ids or names)")
    pass_to_pass: list[str] = Field(default_factory=list, description="test ids that must keep passing")
    command: str | None = Field(default=None, description="override; default runs pytest on the hidden tests")
    timeout_s: float = Field(default=120.0, gt=0)
    partial_credit: bool = False
    detect_tampering: Literal["off", "flag", "strict", "fail"] = Field(
        default="strict",
        description="scan the workspace's Python files for code that inspects its caller or the test runner; "
        "findings are strong (pytest internals imported from non-test code, gc object walks, frame walking, "
        "/proc/self/mem, ctypes, settrace, computed-name imports, builtins patching, an always-equal __eq__) "
        "or weak (atexit, os._exit, inspect imports, PYTEST_CURRENT_TEST): 'strict' makes a strong finding "
        "an agent-caused invalid (reward 0) and records weak ones, 'fail' does so for any finding, 'flag' "
        "only records findings in the result's extra, 'off' skips the scan",
    )


class RowAssertion(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    query: str = Field(description="SQL returning rows to check")
    expect: list[list[Any]] | None = Field(default=None, description="exact rows, in order")
    expect_count: int | None = None


class DbStateVerifierSpec(_VerifierBase):
    """Database state through SQLAlchemy: row assertions and/or the oracle's state hash."""

    type: Literal["db_state"] = "db_state"
    url: str = Field(description="SQLAlchemy URL as seen inside the sandbox, e.g. sqlite:////workspace/app.db")
    assertions: list[RowAssertion] = Field(default_factory=list)
    compare_oracle_hash: bool = True
    tables: list[str] | None = Field(default=None, description="tables in the state hash; None = all")
    prepare: str | None = Field(
        default=None,
        description="command run in the grading sandbox before connecting (e.g. start the database server: "
        "snapshots keep files, not processes)",
    )


class FileCheck(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    exists: bool = True
    contains: list[str] = Field(default_factory=list)
    excludes: list[str] = Field(default_factory=list, description="text that must not be in the file")
    equals: str | None = None
    json_equals: Any = None
    csv_equals: list[list[str]] | None = None
    tolerance: float = 1e-6
    match_oracle: Literal["text", "json", "csv"] | None = Field(
        default=None,
        description="compare with the same file the oracle writes on a fresh copy of the variant, as text/JSON/CSV",
    )


class FilesVerifierSpec(_VerifierBase):
    type: Literal["files"] = "files"
    checks: list[FileCheck] = Field(min_length=1)
    partial_credit: bool = False


class AnswerVerifierSpec(_VerifierBase):
    """The agent's final answer (given with the submit intent) against the expected one."""

    type: Literal["answer"] = "answer"
    expected: str = Field(description="templated with the variant's parameters")
    mode: Literal["exact", "numeric", "normalized"] = "exact"
    tolerance: float = 1e-6
    file: str | None = Field(default=None, description="read the answer from this sandbox file when none was submitted")


class ExitCodeVerifierSpec(_VerifierBase):
    type: Literal["exit_code"] = "exit_code"
    command: str
    expect: int = 0
    timeout_s: float = Field(default=60.0, gt=0)


class CallsVerifierSpec(_VerifierBase):
    """The agent's functions called in a fresh sandbox process per check; plain data compared on the host.

    The checks (targets, arguments, expected values) are in ``file``, a Jinja template over the
    variant's parameters in the task folder, read on the host and never copied into a sandbox.
    See ``agentenv.verifiers.calls`` for the format and what it protects.
    """

    type: Literal["calls"] = "calls"
    file: str = Field(default="grading/calls.yaml", description="checks file, relative to the task folder; host only")
    timeout_s: float = Field(default=20.0, gt=0, description="deadline of each check's process")
    budget_s: float = Field(default=120.0, gt=0, description="deadline of all checks together; checks past it fail")
    partial_credit: bool = False


VerifierSpec = Annotated[
    UnitTestsVerifierSpec
    | DbStateVerifierSpec
    | FilesVerifierSpec
    | AnswerVerifierSpec
    | ExitCodeVerifierSpec
    | CallsVerifierSpec,
    Field(discriminator="type"),
]


class EnvironmentSpec(BaseModel):
    """Where a task runs: an image name, or a Dockerfile folder built on the base image."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str | None = Field(default=None, description="image reference; default is the base image")
    dockerfile: str | None = Field(default=None, description="folder with a Dockerfile, relative to the task")
    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 256
    network: bool = False
    workdir: str = "/workspace"


class TaskSpec(BaseModel):
    """``task.yaml`` of a task folder. Paths are relative to the folder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.\-/]*$")
    domain: Domain
    description: str = ""
    instruction: str = Field(default="instruction.md", description="Jinja2 template file")
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    workspace: str = Field(default="workspace", description="folder copied into the workdir before setup (optional)")
    setup: str | None = Field(
        default=None, description="templated setup: a script file in the folder, or the script itself"
    )
    tests: str = Field(default="tests", description="hidden folder, copied in only at grading")
    solution: str = Field(default="solution/solve.sh", description="templated oracle script")
    params: dict[str, ParamSpec] = Field(default_factory=dict)
    verifiers: list[VerifierSpec] = Field(min_length=1)
    limits: Limits = Field(default_factory=Limits)
    tags: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------- runtime records


@dataclass(frozen=True)
class Variant:
    """A task with its parameters drawn from ``seed``. ``instruction`` is rendered."""

    task_id: str
    seed: int
    params: Mapping[str, Any]
    instruction: str


@runtime_checkable
class OracleReplay(Protocol):
    """A fresh sandbox of the episode's variant with the oracle applied, for verifiers that compare to it.

    ``compute(key, fn)`` returns ``fn(oracle_sandbox, oracle_answer)``, cached
    per (task, variant, image, key) so a variant's oracle runs once. Raises
    ``agentenv.errors.OracleError`` when the oracle fails (a broken task, not
    an agent failure). ``agentenv.grading`` provides the implementation.
    """

    def compute(self, key: str, fn: Callable[[Sandbox, str | None], Any]) -> Any: ...


@dataclass(frozen=True)
class Episode:
    """What a verifier may know of the episode besides the sandbox.

    ``oracle`` is set by grading (not pickled along with trajectories' data in
    spirit: it holds a backend); verifiers that compare with the oracle's state
    report ``invalid`` when it is missing.
    """

    task_id: str
    variant: Variant
    final_answer: str | None = None
    workdir: str = "/workspace"
    oracle: OracleReplay | None = field(default=None, compare=False, repr=False)


#: Who made a verifier result invalid (see ``VerifierResult.invalid_cause``).
InvalidCause = Literal["agent", "grader"]


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    score: float
    detail: str = ""


@dataclass(frozen=True)
class VerifierResult:
    """``reward`` in [0, 1]; ``invalid`` means "could not decide" and ``reason`` says why.

    ``invalid_cause`` says whose fault an invalid result is, because training treats the two
    differently. ``"agent"``: the agent's final state made grading impossible (the code under
    test hangs, exits the process, skips every test, breaks collection, contradicts its own
    report; a FIFO, a directory or a huge file where a file is graded). That is a failure:
    reward 0, counted, not dropped, or an agent could turn every failing episode into a free
    pass. ``"grader"``: the task, the oracle, the infrastructure or the verifier itself failed;
    such an episode says nothing about the policy and is excluded. ``None`` when not invalid.
    """

    reward: float
    passed: bool
    invalid: bool = False
    reason: str = ""
    details: tuple[CheckResult, ...] = ()
    duration_s: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)
    invalid_cause: InvalidCause | None = None

    def __post_init__(self) -> None:
        if self.invalid and self.invalid_cause is None:
            object.__setattr__(self, "invalid_cause", "grader")  # cannot tell: never charge the agent
        elif not self.invalid and self.invalid_cause is not None:
            raise ValueError(f"VerifierResult.invalid_cause: expected None for a decided result, got {self.invalid_cause!r}")
        if self.invalid_cause not in (None, "agent", "grader"):
            raise ValueError(f"VerifierResult.invalid_cause: expected 'agent', 'grader' or None, got {self.invalid_cause!r}")

    @property
    def agent_invalid(self) -> bool:
        """Invalid because of the agent's final state: train on it as a failure (reward 0)."""
        return self.invalid and self.invalid_cause == "agent"


@runtime_checkable
class Verifier(Protocol):
    name: str

    def verify(self, sandbox: Sandbox, episode: Episode) -> VerifierResult: ...


class Task(ABC):
    """The hooks every task has, folder-based or plain Python.

    Lifecycle of one episode: ``sandbox_spec()`` -> backend creates a sandbox ->
    ``setup(sandbox, variant)`` -> the agent acts -> a grading sandbox is forked
    from the agent's final state -> ``grade(grading_sandbox, episode)``.
    ``oracle(sandbox, variant)`` does what a perfect agent would do.
    """

    id: str
    domain: Domain
    limits: Limits
    folder: Path | None = None  # a folder task's folder (its verifiers' files, the oracle cache's key); else None

    @abstractmethod
    def variant(self, seed: int) -> Variant: ...

    @abstractmethod
    def sandbox_spec(self, *, build: bool = True) -> SandboxSpec:
        """The sandbox to create. ``build=False`` never touches Docker (the local backend ignores images)."""

    @abstractmethod
    def setup(self, sandbox: Sandbox, variant: Variant) -> None: ...

    @abstractmethod
    def oracle(self, sandbox: Sandbox, variant: Variant) -> str | None:
        """Solve the variant in ``sandbox``; return the final answer if the task wants one."""

    @abstractmethod
    def grade(self, sandbox: Sandbox, episode: Episode) -> VerifierResult: ...

    @property
    def tags(self) -> Sequence[str]:
        """Labels a task selection filters on (``tasks.tags``); a folder task's come from its ``task.yaml``."""
        return ()

    def hidden_paths(self) -> list[str]:
        """Absolute paths in the sandbox that only grading may see (cleared before copying in)."""
        return []

    def oracle_script(self, variant: Variant) -> str | None:
        """The oracle as one bash script rendered for ``variant``, or ``None`` when it is Python code.

        Why: a scripted policy replays the oracle *through a harness* (one shell
        tool call) so benchmarks and warm-start data exercise the same path a
        model does; ``oracle()`` runs it behind the harness's back.
        """
        return None

    def oracle_answers(self) -> bool:
        """Whether the oracle's final answer (its script's last stdout line) is to be submitted."""
        return False

    def hidden_files(self, variant: Variant) -> dict[str, bytes]:
        """Files grading copies into the grading sandbox (absolute path -> bytes) after clearing
        ``hidden_paths()``; ``variant.json`` (seed and parameters) included. ``agentenv check``
        proves none of them is visible to the agent."""
        return {}
