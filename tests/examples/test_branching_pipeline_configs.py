"""examples/branching/pipeline_{plain,tree}.yaml: twins that differ only in tree rollouts and tree training, and the
tree forks where the pipeline task's shared work ends and its deciding call begins."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentenv.registry import get_task
from learner.train_config import load_train_config
from rollout.policy.scripted import oracle_parts

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "branching"


def test_the_pipeline_twins_differ_only_in_branching_and_tree_training(flat_config: Callable[[Path], dict[str, Any]]) -> None:
    plain = flat_config(EXAMPLES / "pipeline_plain.yaml")
    tree = flat_config(EXAMPLES / "pipeline_tree.yaml")
    differ = {k for k in plain.keys() | tree.keys() if plain.get(k) != tree.get(k)}
    assert differ == {"run_id", "trainer.prefix_sharing", "rl.advantage.tree", "rl.advantage.tree_local"} | {
        k for k in tree if k.startswith("rollout.branching.") and tree[k] != plain.get(k)}
    assert tree["rollout.branching.kind"] == "fixed" and plain["rollout.branching.kind"] == "off"
    assert tree["rollout.branching.k"] * tree["rollout.branching.roots_per_group"] == plain["rollout.group_size"]


@pytest.mark.parametrize("seed", [0, 1000, 1001])
def test_the_tree_forks_after_the_last_pipeline_stage_before_the_count(seed: int) -> None:
    cfg = load_train_config(EXAMPLES / "pipeline_tree.yaml")
    (task_id,) = cfg.rollout.tasks.ids
    task = get_task(task_id)
    script = task.oracle_script(task.variant(seed))
    assert script is not None
    parts = oracle_parts(script)
    (turn,) = cfg.rollout.branching.turns
    shared, deciding = parts[: turn + 1], parts[turn + 1]
    assert [p.split("/")[-1].strip() for p in shared] == ["fetch.py", "unpack.py", "clean.py"]
    assert "> /workspace/answer.txt" in deciding and len(parts) == turn + 2
