"""What every verifier shares: the result arithmetic, the never-raise wrapper, staging.

The rule all of them keep: a verifier that cannot decide says ``invalid`` with
a reason, never "pass". Anything that goes wrong *inside* a verifier (the
sandbox died, a file is garbled, the oracle replay failed) becomes an invalid
``VerifierResult``; a bad agent state (file missing, wrong rows) is a decided
failure with reward 0. ``BaseVerifier.verify`` enforces the first half: no
exception ever leaves it.

An invalid result also says whose fault it is (``VerifierResult.invalid_cause``):
``AgentCaused`` raised inside a verifier (the agent left a FIFO where a file is
graded, its code hung the tests) becomes ``invalid_cause="agent"``, which
training counts as a failure; everything else that goes wrong is the grader's
(``"grader"``) and is excluded.
"""

from __future__ import annotations

import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentenv.errors import AgentEnvError, OracleError
from agentenv.types import CheckResult, Episode, InvalidCause, Variant, VerifierResult
from agentenv.variants import context, render
from sandboxes.errors import SandboxError, SandboxFileNotFound, SandboxFileTooLarge
from sandboxes.types import Sandbox

#: Largest file a verifier reads from a sandbox; a bigger one is the agent's doing (``AgentCaused``).
MAX_READ_BYTES = 8 << 20

#: Name the oracle's final answer has in verifier templates (``expected: "{{ oracle_answer }}"``).
ORACLE_ANSWER = "oracle_answer"


class VerifierError(AgentEnvError, RuntimeError):
    """A verifier could not run (raised inside, reported as ``invalid``; never escapes ``verify``)."""


class AgentCaused(VerifierError):
    """The agent's final state makes a decision impossible: reported as ``invalid_cause="agent"`` (reward 0)."""


@dataclass(frozen=True)
class VerifierContext:
    """What a verifier is built with besides its spec.

    ``hidden`` maps paths relative to the task's hidden tests folder to bytes
    (``variant.json`` included); verifiers that need them stage them into a
    fresh, unpredictable directory of the grading sandbox at verify time.
    """

    task_dir: Path | None
    variant: Variant
    hidden: Mapping[str, bytes] = field(default_factory=dict)

    def template_values(self) -> dict[str, Any]:
        return context(self.variant.params, self.variant.seed)

    def render(self, template: str, where: str, **extra: Any) -> str:
        return render(template, {**self.template_values(), **extra}, where=where)


def invalid(
    reason: str,
    *,
    details: Sequence[CheckResult] = (),
    started: float | None = None,
    cause: InvalidCause = "grader",
    extra: Mapping[str, Any] | None = None,
) -> VerifierResult:
    """An undecided result. ``cause="agent"`` only where the agent's final state is to blame."""
    duration = time.monotonic() - started if started is not None else 0.0
    return VerifierResult(
        reward=0.0, passed=False, invalid=True, reason=reason, details=tuple(details), duration_s=duration,
        extra=dict(extra or {}), invalid_cause=cause,
    )


def score(checks: Sequence[CheckResult], *, partial_credit: bool, started: float, reason: str = "") -> VerifierResult:
    """Reward from per-check scores: their mean with partial credit, else all-or-nothing."""
    if not checks:
        return invalid("no checks were run", started=started)
    passed = all(c.passed for c in checks)
    if partial_credit:
        reward = sum(min(max(c.score, 0.0), 1.0) for c in checks) / len(checks)
    else:
        reward = 1.0 if passed else 0.0
    if not reason and not passed:
        failed = [c.name for c in checks if not c.passed]
        reason = f"{len(failed)} of {len(checks)} checks failed: " + ", ".join(failed[:5])
    return VerifierResult(
        reward=reward, passed=passed, reason=reason, details=tuple(checks), duration_s=time.monotonic() - started
    )


def check(name: str, ok: bool, detail: str = "") -> CheckResult:
    return CheckResult(name=name, passed=bool(ok), score=1.0 if ok else 0.0, detail=detail)


class BaseVerifier(ABC):
    """Times ``_verify`` and turns every exception it raises into an invalid result."""

    kind: str = "verifier"

    def __init__(self, name: str | None, ctx: VerifierContext) -> None:
        self.name = name or self.kind
        self.ctx = ctx

    def verify(self, sandbox: Sandbox, episode: Episode) -> VerifierResult:
        started = time.monotonic()
        try:
            result = self._verify(sandbox, episode, started)
        except AgentCaused as exc:
            return invalid(f"{self.name}: {exc}", started=started, cause="agent")
        except OracleError as exc:
            return invalid(f"oracle failed: {exc}", started=started)
        except Exception as exc:  # noqa: BLE001 - the boundary: a verifier never raises
            return invalid(f"{self.name}: verifier crashed: {type(exc).__name__}: {exc}", started=started)
        return result

    @abstractmethod
    def _verify(self, sandbox: Sandbox, episode: Episode, started: float) -> VerifierResult: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def fresh_dir(sandbox: Sandbox, purpose: str) -> str:
    """A new directory with an unpredictable name, created now (the agent cannot have planted it).

    ``mktemp -d`` fails rather than reuse an existing path, and the random
    suffix (plus ours) cannot be guessed while the agent still runs.
    """
    suffix = secrets.token_hex(6)
    result = sandbox.exec(["mktemp", "-d", f"/tmp/agentenv-{purpose}-{suffix}-XXXXXXXX"], timeout=30)
    path = result.stdout.strip()
    if not result.ok or not path.startswith("/tmp/agentenv-"):
        raise VerifierError(f"could not create a grading directory: exit {result.exit_code}: {result.stderr[-300:]}")
    return path


def stage(sandbox: Sandbox, files: Mapping[str, bytes], purpose: str) -> str:
    """Copy ``files`` (relative path -> bytes) into a fresh directory; return its path."""
    root = fresh_dir(sandbox, purpose)
    for rel, data in sorted(files.items()):
        clean = rel.lstrip("/")
        if ".." in Path(clean).parts:
            raise VerifierError(f"hidden file path {rel!r} escapes the staging directory")
        sandbox.write_file(f"{root}/{clean}", data)
    return root


def remove_dirs(sandbox: Sandbox, paths: Sequence[str]) -> None:
    """Best effort: delete grading's own staging directories (the sandbox reset is the guarantee)."""
    mine = [p for p in paths if p.startswith("/tmp/agentenv-")]
    if not mine:
        return
    try:
        sandbox.exec(["rm", "-rf", "--", *mine], timeout=30)
    except Exception:  # noqa: BLE001,S110 - cleanup never turns a grade into a crash
        pass


def read_graded_file(sandbox: Sandbox, path: str, *, cap: int = MAX_READ_BYTES, workdir: str = "/workspace") -> bytes | None:
    """Bytes of a file the agent was asked to write; None when nothing is there.

    Looks at the entry (``list_files`` of its directory) before reading, so
    nothing the agent left can hang or exhaust the grader: a directory, a
    symlink (graded files are files, and a link could lead to ``/dev`` or
    ``/proc``) or a file over ``cap`` bytes (sparse or not) raises
    ``AgentCaused``; an entry of size 0 is never opened (a FIFO or a socket
    reads as empty, a decided failure, instead of blocking). The read itself
    is capped too (``read_file(limit=...)``). A relative path is under ``workdir``.
    """
    if not path.startswith("/"):
        path = f"{workdir.rstrip('/')}/{path}"
    parent, _, name = path.rstrip("/").rpartition("/")
    try:
        entries = sandbox.list_files(parent or "/")
    except (SandboxFileNotFound, FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    except SandboxError as exc:
        if isinstance(exc, ConnectionError | TimeoutError):
            raise  # the sandbox itself is gone: not the agent's failure
        return None
    full = f"{parent}/{name}"
    entry = next((e for e in entries if e.path.rstrip("/") == full), None)
    if entry is None:
        return None
    if entry.is_symlink:
        raise AgentCaused(f"{path} is a symlink, not a file")
    if entry.is_dir:
        raise AgentCaused(f"{path} is a directory, not a file")
    if entry.size > cap:
        raise AgentCaused(f"{path} is {entry.size} bytes, over the {cap}-byte cap on a graded file")
    if entry.size == 0:
        return b""  # an empty file, or a FIFO / socket that must not be opened
    try:
        try:
            return sandbox.read_file(path, limit=cap)
        except TypeError:  # a backend from before ``limit``; the size was checked above
            return sandbox.read_file(path)[:cap]
    except SandboxFileTooLarge as exc:
        raise AgentCaused(f"{path} is over the {cap}-byte cap on a graded file") from exc
    except (SandboxFileNotFound, FileNotFoundError):
        return None
    except (IsADirectoryError, PermissionError) as exc:
        raise AgentCaused(f"{path} cannot be read: {exc}") from exc
    except SandboxError as exc:
        if isinstance(exc, ConnectionError | TimeoutError):
            raise
        raise AgentCaused(f"{path} cannot be read: {type(exc).__name__}: {exc}") from exc


def read_hidden(tests_dir: Path | None, variant: Variant) -> dict[str, bytes]:
    """The task folder's hidden files (relative paths) plus ``variant.json``, read from the host."""
    import json

    files: dict[str, bytes] = {}
    if tests_dir is not None and tests_dir.is_dir():
        for path in sorted(p for p in tests_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            files[path.relative_to(tests_dir).as_posix()] = path.read_bytes()
    files["variant.json"] = json.dumps(
        {"task_id": variant.task_id, "seed": variant.seed, "params": dict(variant.params)}, indent=2
    ).encode()
    return files


__all__ = [
    "MAX_READ_BYTES",
    "ORACLE_ANSWER",
    "AgentCaused",
    "BaseVerifier",
    "VerifierContext",
    "VerifierError",
    "check",
    "fresh_dir",
    "invalid",
    "read_graded_file",
    "read_hidden",
    "remove_dirs",
    "score",
    "stage",
]
