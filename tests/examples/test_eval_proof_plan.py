"""``examples.eval_proof``: the references part's planned count comes from the task list, not a constant."""

from __future__ import annotations

import pytest

from examples.eval_proof.run import REFERENCES, planned_episodes, sweep_config
from rollout.eval.cells import plan_cells
from rollout.eval.runner import identities
from rollout.job import resolve_tasks

pytestmark = pytest.mark.unit


def test_references_plan_every_registered_task_and_nothing_else() -> None:
    cfg = sweep_config({"sweep_id": "proof-references-test", **REFERENCES})
    tasks = sorted(resolve_tasks(cfg.tasks))
    assert len(tasks) >= 16  # the built-in suite; 13 when the proof hard-coded 468
    expected = planned_episodes(cfg)
    assert expected == len(tasks) * 2 * 3 * 3 * 2  # policies x harnesses x efforts x seeds
    assert len(plan_cells(cfg, tasks, identities(cfg))) == expected
