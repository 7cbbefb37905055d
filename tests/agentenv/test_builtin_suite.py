"""Every built-in task, for real in Docker: the oracle earns full reward, doing nothing earns zero.

One agent sandbox per (task, seed): graded first untouched (do-nothing agent),
then after the oracle ran in it. Both gradings go through ``grade_episode``
(snapshot, restore into a clean sandbox, hidden files copied in then), and
share the cached oracle replay of the variant. Seeds 0 and 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentenv.tasks.builtin as builtin_pkg
from agentenv.grading import grade_episode
from agentenv.registry import default_registry
from agentenv.task import FolderTask
from agentenv.types import Domain, Episode

SEEDS = (0, 1)


def _folder_tasks() -> list[FolderTask]:
    root = Path(builtin_pkg.__path__[0])
    return [FolderTask.load(p.parent) for p in sorted(root.glob("*/*/task.yaml"))]


TASKS = {task.id: task for task in _folder_tasks()}


@pytest.mark.unit
def test_suite_covers_every_domain_three_times() -> None:
    by_domain: dict[Domain, int] = {}
    for task in TASKS.values():
        by_domain[task.domain] = by_domain.get(task.domain, 0) + 1
    assert all(by_domain.get(d, 0) >= 3 for d in Domain), by_domain
    tags = {tag for task in TASKS.values() for tag in task.spec.tags}
    assert {"quickstart", "long_horizon"} <= tags


@pytest.mark.unit
def test_every_builtin_is_registered() -> None:
    assert set(TASKS) <= set(default_registry().ids())


@pytest.mark.unit
@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_variants_are_deterministic(task_id: str) -> None:
    task = TASKS[task_id]
    assert task.variant(3) == task.variant(3)


@pytest.fixture(scope="module")
def backend(docker_client, base_image) -> Iterator[object]:  # noqa: ANN001
    from sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(docker_client)
    yield backend
    backend.close()


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_oracle_full_reward_and_do_nothing_zero(backend, task_id: str, seed: int) -> None:  # noqa: ANN001
    task = TASKS[task_id]
    variant = task.variant(seed)
    started = time.monotonic()
    sandbox = backend.create(task.sandbox_spec())
    try:
        task.setup(sandbox, variant)
        idle = grade_episode(backend, sandbox, task, Episode(task.id, variant))
        assert not idle.invalid, idle.reason
        assert idle.reward == 0.0, (idle.reason, idle.details)
        answer = task.oracle(sandbox, variant)
        solved = grade_episode(backend, sandbox, task, Episode(task.id, variant, final_answer=answer))
        assert not solved.invalid, solved.reason
        assert solved.reward == 1.0 and solved.passed, (solved.reason, solved.details)
    finally:
        sandbox.close()
    print(f"{task_id} seed {seed}: {time.monotonic() - started:.1f}s")
