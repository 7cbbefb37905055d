"""Replay ``boundary_attacks`` against whichever agentenv is on ``PYTHONPATH``: which attacks paid there.

Not a test (it asserts nothing): the record of *before*. Run it once against an older checkout (the
built-in coding tasks graded in-process) and once against this one::

    PYTHONPATH=/path/to/old/checkout:tests/adversarial python tests/adversarial/boundary_replay.py
    PYTHONPATH=$PWD:tests/adversarial python tests/adversarial/boundary_replay.py

Each row: the attack, the task, how that checkout grades it, and the result (reward, passed,
invalid and whose fault). Docker required.
"""

from __future__ import annotations

import sys
from pathlib import Path

import docker
from boundary_attacks import ATTACKS
from rich.console import Console
from rich.table import Table

import agentenv
import agentenv.tasks.builtin as builtin_pkg
from agentenv.grading import grade_episode
from agentenv.task import FolderTask
from agentenv.types import Episode
from sandboxes.docker_backend import DockerBackend


def main() -> int:
    builtin = Path(builtin_pkg.__path__[0])
    backend = DockerBackend(docker.from_env())
    table = Table(title=f"attacks against {Path(agentenv.__file__).parents[1]}")
    for col in ("attack", "task", "graded by", "reward", "passed", "invalid"):
        table.add_column(col)
    try:
        for attack in ATTACKS:
            task = FolderTask.load(builtin / attack.task)
            variant = task.variant(0)
            sandbox = backend.create(task.sandbox_spec())
            try:
                task.setup(sandbox, variant)
                for command in attack.commands:
                    sandbox.exec(["bash", "-c", command], timeout=120, cwd="/workspace")
                result = grade_episode(backend, sandbox, task, Episode(task.id, variant))
            finally:
                sandbox.close()
            kinds = "+".join(type(v).__name__.removesuffix("VerifierSpec") for v in task.spec.verifiers)
            paid = "[red]PAID[/red] " if result.reward > 0 or result.passed else ""
            table.add_row(attack.id, attack.task, kinds, f"{paid}{result.reward:g}", str(result.passed),
                          f"{result.invalid_cause}: {result.reason[:60]}" if result.invalid else "no")
    finally:
        backend.close()
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
