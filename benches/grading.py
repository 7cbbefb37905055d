"""Grading time per episode of the built-in coding tasks: the in-process graders vs the ``calls`` boundary.

    python -m benches.grading [--seeds 3] [--baseline 22636ff]

For each built-in coding task, the same oracle state is graded by the task as it is now (``calls``:
one sandbox process per check, plain data compared on the host) and by the task as it was at
``--baseline`` (hidden pytest tests importing the agent's code, graded by this tree's ``unit_tests``
verifier, or an ``exit_code`` command),
interleaved per seed in one process on the Docker backend, so the ratio survives a noisy machine.
The old task folders are taken from git (``git archive`` of the baseline revision). Grading runs
in place (the rollout hot path: no snapshot or restore in the timing), on a fresh sandbox per
episode, after setup and the oracle; both must earn reward 1. Prints a table (rich); timing
thresholds never go in tests.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import docker
from rich.console import Console
from rich.table import Table

import agentenv.tasks.builtin as builtin_pkg
from agentenv.grading import clear_oracle_cache, grade_episode
from agentenv.task import FolderTask
from agentenv.types import Episode
from sandboxes.docker_backend import DockerBackend

TASKS = ("coding/fix_add", "coding/fix_bug", "coding/implement_function", "coding/multi_file")
BASELINE = "22636ff"  # the last revision before the coding tasks were graded through calls
REPO = Path(__file__).resolve().parents[1]


def old_folders(rev: str, into: Path) -> dict[str, Path]:
    """The built-in coding task folders as they were at ``rev``."""
    prefix = "agentenv/tasks/builtin/coding"
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev, prefix], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return {task: into / prefix / task.split("/", 1)[1] for task in TASKS}


def grade_once(backend: DockerBackend, task: FolderTask, seed: int) -> tuple[float, float]:
    """(seconds to grade the oracle's state in place, reward)."""
    variant = task.variant(seed)
    sandbox = backend.create(task.sandbox_spec())
    try:
        task.setup(sandbox, variant)
        task.oracle(sandbox, variant)
        started = time.perf_counter()
        result = grade_episode(backend, sandbox, task, Episode(task.id, variant), in_place=True)
        return time.perf_counter() - started, result.reward
    finally:
        sandbox.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args(argv)
    backend = DockerBackend(docker.from_env())
    builtin = Path(builtin_pkg.__path__[0])
    table = Table(title=f"grading seconds per episode (oracle state, in place, {args.seeds} seeds, medians)")
    for col in ("task", f"old ({args.baseline})", "old verifier", "boundary (calls)", "checks", "boundary / old"):
        table.add_column(col, justify="right" if col not in ("task", "old verifier") else "left")
    ratios = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            olds = old_folders(args.baseline, Path(tmp))
            for task_id in TASKS:
                new, old = FolderTask.load(builtin / task_id), FolderTask.load(olds[task_id])
                clear_oracle_cache()
                t_new: list[float] = []
                t_old: list[float] = []
                for seed in range(args.seeds):
                    for which, task, times in (("old", old, t_old), ("new", new, t_new)):
                        seconds, reward = grade_once(backend, task, seed)
                        if reward != 1.0:
                            raise SystemExit(f"{task_id} ({which}) seed {seed}: the oracle earned {reward}, not 1")
                        times.append(seconds)
                m_old, m_new = statistics.median(t_old), statistics.median(t_new)
                ratios.append(m_new / m_old)
                kinds = "+".join(v.type for v in old.spec.verifiers)
                checks = sum(len(v.checks()) for v in _calls(new, seed=0))
                table.add_row(task_id, f"{m_old:.2f}", kinds, f"{m_new:.2f}", str(checks), f"{m_new / m_old:.2f}x")
    finally:
        backend.close()
    table.caption = f"geometric mean of the ratios: {statistics.geometric_mean(ratios):.2f}x"
    Console(width=120).print(table)
    return 0


def _calls(task: FolderTask, seed: int) -> list:  # the calls verifiers of a task, for their check counts
    from agentenv.types import CallsVerifierSpec
    from agentenv.verifiers import build_verifier

    variant = task.variant(seed)
    return [build_verifier(v, task.folder, variant, hidden={}) for v in task.spec.verifiers if isinstance(v, CallsVerifierSpec)]


if __name__ == "__main__":
    raise SystemExit(main())
