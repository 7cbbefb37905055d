"""Physical verifiers: one module per kind, built from ``task.yaml`` specs through one registry.

``build_verifier(spec, task_dir, variant)`` looks the spec's ``type`` up in
``BUILDERS`` (kind -> constructor) -- the only dispatch there is; adding a kind
is adding a module and a line here. ``run_verifiers`` builds a task's
declared verifiers into a weighted composite and runs it; ``FolderTask`` and
``PythonTask`` grade through it.

Usage::

    verifier = build_verifier(spec, Path("tasks/foo"), task.variant(3))
    result = verifier.verify(grading_sandbox, episode)   # never raises
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentenv.errors import TaskSpecError, did_you_mean
from agentenv.types import Episode, Task, Variant, Verifier, VerifierResult, VerifierSpec
from agentenv.verifiers.answer import AnswerVerifier
from agentenv.verifiers.calls import CallsVerifier
from agentenv.verifiers.common import VerifierContext, read_hidden
from agentenv.verifiers.composite import CompositeVerifier, Weighted
from agentenv.verifiers.db_state import DbStateVerifier
from agentenv.verifiers.exit_code import ExitCodeVerifier
from agentenv.verifiers.files import FilesVerifier
from agentenv.verifiers.unit_tests import UnitTestsVerifier
from sandboxes.types import Sandbox

Builder = Callable[[Any, VerifierContext], Verifier]

#: spec ``type`` -> constructor. The one place a kind is chosen.
BUILDERS: dict[str, Builder] = {
    "unit_tests": UnitTestsVerifier,
    "db_state": DbStateVerifier,
    "files": FilesVerifier,
    "answer": AnswerVerifier,
    "exit_code": ExitCodeVerifier,
    "calls": CallsVerifier,
}


def build_verifier(
    spec: VerifierSpec,
    task_dir: Path | str | None,
    variant: Variant,
    *,
    hidden: Mapping[str, bytes] | None = None,
    tests: str = "tests",
) -> Verifier:
    """The verifier for one declared spec.

    ``hidden`` (relative path -> bytes) are the files only grading may see;
    by default they are read from ``task_dir/tests`` plus ``variant.json``.
    """
    builder = BUILDERS.get(spec.type)
    if builder is None:
        raise TaskSpecError(f"verifier type {spec.type!r} has no builder{did_you_mean(spec.type, BUILDERS)}")
    folder = Path(task_dir) if task_dir is not None else None
    files = dict(hidden) if hidden is not None else read_hidden(folder / tests if folder else None, variant)
    return builder(spec, VerifierContext(task_dir=folder, variant=variant, hidden=files))


def build_composite(
    specs: Sequence[VerifierSpec], task_dir: Path | str | None, variant: Variant, *, hidden: Mapping[str, bytes] | None = None
) -> CompositeVerifier:
    parts: list[Weighted] = []
    seen: dict[str, int] = {}
    for spec in specs:
        verifier = build_verifier(spec, task_dir, variant, hidden=hidden)
        count = seen.get(verifier.name, 0)
        seen[verifier.name] = count + 1
        if count:  # two 'files' verifiers: keep their details apart
            verifier.name = f"{verifier.name}#{count + 1}"
        parts.append(Weighted(verifier, spec.weight))
    if parts and all(p.weight == 0 for p in parts):
        raise TaskSpecError(
            f"verifiers[*].weight: all {len(parts)} weights are 0, so nothing decides the reward; "
            "give at least one verifier a weight > 0"
        )
    return CompositeVerifier(parts)


def _hidden_of(task: Task, variant: Variant) -> dict[str, bytes]:
    """The task's hidden files as paths relative to its hidden folder."""
    roots = [p.rstrip("/") + "/" for p in task.hidden_paths()]
    out: dict[str, bytes] = {}
    for path, data in task.hidden_files(variant).items():
        rel = next((path[len(r) :] for r in roots if path.startswith(r)), path.lstrip("/"))
        out[rel] = data
    return out


def run_verifiers(task: Task, specs: Sequence[VerifierSpec], sandbox: Sandbox, episode: Episode) -> VerifierResult:
    """Grade ``episode`` in ``sandbox`` with a task's declared verifiers (a weighted composite).

    Building errors (a broken template in a spec) come back as an invalid
    result naming the task, like every other failure to decide.
    """
    try:
        composite = build_composite(specs, task.folder, episode.variant, hidden=_hidden_of(task, episode.variant))
    except Exception as exc:  # noqa: BLE001
        return VerifierResult(0.0, False, True, f"{task.id}: cannot build verifiers: {type(exc).__name__}: {exc}")
    return composite.verify(sandbox, episode)


__all__ = ["BUILDERS", "CompositeVerifier", "VerifierContext", "build_composite", "build_verifier", "run_verifiers"]
