"""The teacher grid's task families (tag ``teachers_demo``): one command solves every variant, the instruction
gives nothing away, and the max style's verifying call shows what the oracle wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentenv.tasks.builtin as builtin_pkg
from agentenv.task import FolderTask
from rollout.policy.scripted import verify_command

pytestmark = pytest.mark.unit

ROOT = Path(builtin_pkg.__path__[0])


@pytest.mark.parametrize(("task_id", "param", "shown"), [
    ("general/count_lines", "lines", "cat /workspace/answer.txt"),
    ("agent/count_pending", "pending", "cat /workspace/answer.txt"),
    ("coding/fix_add", "a", "cat /workspace/calc.py"),
])
def test_one_command_for_every_variant(task_id: str, param: str, shown: str) -> None:
    task = FolderTask.load(ROOT / task_id)
    variants = [task.variant(seed) for seed in range(40)]
    assert len({v.params[param] for v in variants}) > 10  # the variants do differ
    scripts = {task.oracle_script(v) for v in variants}
    assert len(scripts) == 1 and len({v.instruction for v in variants}) == 1
    assert verify_command(scripts.pop() or "") == shown
    assert task.spec.domain.value == task_id.split("/")[0]
