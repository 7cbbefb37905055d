"""What every verifier shares: the result arithmetic, the never-raise wrapper, staging.

The rule all of them keep: a verifier that cannot decide says ``invalid`` with
a reason, never "pass". Anything that goes wrong *inside* a verifier (the
sandbox died, a file is garbled, the oracle replay failed) becomes an invalid
``VerifierResult``; a bad agent state (file missing, wrong rows) is a decided
failure with reward 0. ``BaseVerifier.verify`` enforces the first half: no
exception ever leaves it.
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
from agentenv.types import CheckResult, Episode, Variant, VerifierResult
from agentenv.variants import context, render
from sandboxes.types import Sandbox

#: Name the oracle's final answer has in verifier templates (``expected: "{{ oracle_answer }}"``).
ORACLE_ANSWER = "oracle_answer"


class VerifierError(AgentEnvError, RuntimeError):
    """A verifier could not run (raised inside, reported as ``invalid``; never escapes ``verify``)."""


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


def invalid(reason: str, *, details: Sequence[CheckResult] = (), started: float | None = None) -> VerifierResult:
    duration = time.monotonic() - started if started is not None else 0.0
    return VerifierResult(reward=0.0, passed=False, invalid=True, reason=reason, details=tuple(details), duration_s=duration)


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
    "ORACLE_ANSWER",
    "BaseVerifier",
    "VerifierContext",
    "VerifierError",
    "check",
    "fresh_dir",
    "invalid",
    "read_hidden",
    "score",
    "stage",
]
