"""learner.loop: an iteration's items split into its updates (with prefix sharing, trees stay whole); run ids."""

from __future__ import annotations

import random

import pytest

from learner.loop import deal_updates
from learner.types import TrainItem

pytestmark = pytest.mark.unit


def _items(groups: dict[str, int]) -> list[TrainItem]:
    return [TrainItem(token_ids=(1, 2, 3), rollout_logprobs=(0.0, 0.0, 0.0), loss_mask=(0, 1, 1), advantage=1.0,
                      sample_id=f"{g}-{i}/0", group_id=g)
            for g, n in groups.items() for i in range(n)]


def test_whole_groups_never_straddle_two_updates_and_every_item_is_dealt_once() -> None:
    items = _items({f"g{j}": 8 for j in range(8)} | {"small": 3})
    for seed in range(20):
        parts = deal_updates(list(items), 2, random.Random(seed), whole_groups=True)
        assert len(parts) == 2 and sorted(i.sample_id for p in parts for i in p) == sorted(i.sample_id for i in items)
        homes = {g: {n for n, p in enumerate(parts) if any(i.group_id == g for i in p)} for g in {i.group_id for i in items}}
        assert all(len(h) == 1 for h in homes.values()), homes
        assert abs(len(parts[0]) - len(parts[1])) <= 8


def test_item_shuffle_is_unchanged_without_prefix_sharing() -> None:
    """The plain path draws from the rng exactly as before (the main job's runs repeat to the last digit)."""
    items = _items({f"g{j}": 8 for j in range(8)})
    before = list(items)
    random.Random(3).shuffle(before)
    parts = deal_updates(list(items), 2, random.Random(3))
    assert parts == [before[:32], before[32:]]
    assert deal_updates(_items({"g": 1}), 2, random.Random(0)) == [_items({"g": 1})]


def test_runs_of_one_config_started_in_one_second_get_distinct_ids() -> None:
    from learner.loop import new_run_id

    ids = {new_run_id("quickstart") for _ in range(200)}
    assert len(ids) == 200 and all(i.startswith("quickstart-") and len(i.split("-")) == 4 for i in ids)
