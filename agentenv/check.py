"""Prove a task before it reaches a training run (what ``agentenv check`` prints).

A broken task poisons training quietly: an oracle that cannot pass teaches
nothing, a test the agent can read teaches cheating, a verifier that pays a
do-nothing agent teaches idling. So each task must show, in real sandboxes:

* ``spec``       the folder loads (every problem listed);
* ``image``      its image builds (skipped on the local backend, which has none);
* ``variants``   the same seed gives the same variant, twice;
* ``hidden``     after setup, no hidden test or verifier file is in the agent's view
                 (by path and by content, anywhere the agent can list);
* ``oracle``     the oracle earns full reward on each of several seeds;
* ``do-nothing`` an agent that does nothing earns zero.

Every check is a verdict with a detail line; nothing raises out of ``check_task``.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from agentenv.errors import AgentEnvError
from agentenv.types import Episode, Task, Variant
from sandboxes.errors import SandboxError
from sandboxes.types import Sandbox, SandboxBackend, runs_images

# Directories never searched for leaked files (kernel views, not the agent's files).
_SKIP_PREFIXES = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class Verdict:
    name: str
    passed: bool
    detail: str = ""
    duration_s: float = 0.0
    skipped: bool = False


@dataclass
class TaskReport:
    task_id: str
    source: str
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(v.passed for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "source": self.source, "passed": self.passed, "checks": [asdict(v) for v in self.verdicts]}


def _timed(name: str, fn: Callable[[], tuple[bool, str]]) -> Verdict:
    """Run one check; any exception is a failed verdict naming it, never a crash of the checker."""
    start = time.monotonic()
    try:
        ok, detail = fn()
    except (AgentEnvError, SandboxError, OSError, ValueError, RuntimeError, ImportError) as exc:
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a checker reports, it does not crash
        ok, detail = False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
    return Verdict(name, ok, detail, time.monotonic() - start)


def failed_load(task_id: str, source: str, error: BaseException) -> TaskReport:
    return TaskReport(task_id, source, [Verdict("spec", False, str(error))])


def check_task(task: Task, backend: SandboxBackend, *, seeds: int = 3, source: str = "") -> TaskReport:
    """Run every check on ``task`` with sandboxes from ``backend`` (each one closed after use)."""
    report = TaskReport(task.id, source or repr(task), [Verdict("spec", True, "loaded")])
    build = runs_images(backend)

    def image() -> tuple[bool, str]:
        spec = task.sandbox_spec(build=True)
        return True, spec.image

    if build:
        report.verdicts.append(_timed("image", image))
        if not report.verdicts[-1].passed:
            return report  # nothing else can run without the image
    else:
        report.verdicts.append(Verdict("image", True, "skipped: the local backend runs no image", skipped=True))

    report.verdicts.append(_timed("variants", lambda: _check_variants(task, seeds)))
    sandbox_spec = task.sandbox_spec(build=build)

    def do_nothing() -> tuple[bool, str]:
        variant = task.variant(0)
        with _Closing(backend.create(sandbox_spec)) as sandbox:
            task.setup(sandbox, variant)
            leaks = _find_leaks(task, sandbox, variant, local=not build)
            report.verdicts.append(
                Verdict("hidden", not leaks, "; ".join(leaks) if leaks else "no hidden file visible after setup")
            )
            result = _grade(backend, sandbox, task, Episode(task.id, variant, None, sandbox.spec.workdir))
        detail = f"reward {result.reward:g}" + (f" (invalid: {result.reason})" if result.invalid else "")
        return result.reward == 0.0, detail

    verdict = _timed("do-nothing", do_nothing)
    if not any(v.name == "hidden" for v in report.verdicts):
        report.verdicts.append(Verdict("hidden", False, f"not checked: {verdict.detail}"))
    report.verdicts.append(verdict)

    for seed in range(seeds):
        report.verdicts.append(_timed(f"oracle seed={seed}", partial(_check_oracle, task, backend, sandbox_spec, seed)))
    return report


def _check_variants(task: Task, seeds: int) -> tuple[bool, str]:
    distinct: set[str] = set()
    for seed in range(max(seeds, 2)):
        a, b = task.variant(seed), task.variant(seed)
        if a != b:
            return False, f"seed {seed} gave two different variants: {dict(a.params)} vs {dict(b.params)}"
        distinct.add(repr(sorted(a.params.items())))
    return True, f"deterministic; {len(distinct)} distinct variants over {max(seeds, 2)} seeds"


def _check_oracle(task: Task, backend: SandboxBackend, spec: Any, seed: int) -> tuple[bool, str]:
    variant = task.variant(seed)
    with _Closing(backend.create(spec)) as sandbox:
        task.setup(sandbox, variant)
        answer = task.oracle(sandbox, variant)
        result = _grade(backend, sandbox, task, Episode(task.id, variant, answer, sandbox.spec.workdir))
    if result.invalid:
        return False, f"invalid: {result.reason}"
    failing = [f"{d.name}: {d.detail}" for d in result.details if not d.passed]
    detail = f"reward {result.reward:g}" + (f"; failing: {'; '.join(failing)[:500]}" if failing else "")
    return result.reward >= 1.0 - 1e-9, detail


def _grade(backend: SandboxBackend, sandbox: Sandbox, task: Task, episode: Episode) -> Any:
    from agentenv.grading import grade_episode  # owned by the verifiers package

    return grade_episode(backend, sandbox, task, episode)


def _find_leaks(task: Task, sandbox: Sandbox, variant: Variant, *, local: bool) -> list[str]:
    """Hidden paths that exist, and files whose bytes equal a hidden file's, in the agent's view."""
    leaks = []
    for path in task.hidden_paths():
        if sandbox.exec(["test", "-e", path]).exit_code == 0:
            leaks.append(f"hidden path {path} exists")
    hidden = {data: p for p, data in task.hidden_files(variant).items() if data and not p.endswith("/variant.json")}
    if not hidden:
        return leaks
    sizes = {len(data) for data in hidden}
    for entry in _agent_files(sandbox, local=local):
        if entry[1] in sizes:
            try:
                data = sandbox.read_file(entry[0])
            except SandboxError:
                continue
            if data in hidden:
                leaks.append(f"{entry[0]} is the hidden file {hidden[data]}")
    return leaks


def _agent_files(sandbox: Sandbox, *, local: bool) -> list[tuple[str, int]]:
    """(path, size) of every regular file the agent can see.

    A container is searched from ``/`` (a Dockerfile may have copied tests
    anywhere); the local backend only from its workdir, since its ``/`` is the host's.
    """
    root = sandbox.spec.workdir if local else "/"
    prune = " -o ".join(f"-path {p}" for p in _SKIP_PREFIXES)
    cmd = f"find {root} -xdev \\( {prune} \\) -prune -o -type f -size -4M -printf '%s\\t%p\\n' 2>/dev/null"
    result = sandbox.exec(["sh", "-c", cmd], timeout=60)
    files = []
    for line in result.stdout.splitlines():
        size, _, path = line.partition("\t")
        if size.isdigit() and path:
            files.append((path, int(size)))
    return files


class _Closing:
    """``with`` for sandboxes: closed on every exit path, so a failed check leaks nothing."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def __enter__(self) -> Sandbox:
        return self.sandbox

    def __exit__(self, *exc: object) -> None:
        self.sandbox.close()


def load_for_check(target: str) -> tuple[Task | None, TaskReport | None]:
    """The task named by a path or id, or a failed report saying why it does not load."""
    from agentenv.registry import get_task

    try:
        return get_task(target), None
    except AgentEnvError as exc:
        return None, failed_load(Path(target).name if Path(target).exists() else target, target, exc)


__all__ = ["TaskReport", "Verdict", "check_task", "failed_load", "load_for_check"]
