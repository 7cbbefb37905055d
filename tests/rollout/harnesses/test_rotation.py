"""Harness rotation: seeded, reproducible, order-independent."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from rollout.harnesses.rotation import RotationPolicy

pytestmark = pytest.mark.unit
ALL = ("claude_code", "codex", "kimi_code", "kimi_cli", "bash")


def test_same_seed_same_schedule_and_pick_is_order_independent() -> None:
    p = RotationPolicy(kind="uniform", harnesses=ALL, seed=7)
    assert p.schedule(50) == RotationPolicy(kind="uniform", harnesses=ALL, seed=7).schedule(50)
    assert [p.pick(i) for i in reversed(range(50))] == list(reversed(p.schedule(50)))
    assert p.schedule(50) != RotationPolicy(kind="uniform", harnesses=ALL, seed=8).schedule(50)
    assert set(p.schedule(200)) == set(ALL)


def test_round_robin_cycles_and_fixed_is_fixed() -> None:
    rr = RotationPolicy(kind="round_robin", harnesses=("codex", "bash"), seed=3).schedule(6)
    assert rr[0] != rr[1] and rr[:2] * 3 == rr
    assert set(RotationPolicy(kind="fixed", harnesses=("codex",)).schedule(20)) == {"codex"}


def test_weighted_follows_weights() -> None:
    counts = Counter(RotationPolicy(kind="weighted", harnesses=("codex", "bash"), weights=(9, 1), seed=1).schedule(2000))
    assert 0.85 < counts["codex"] / 2000 < 0.95


@pytest.mark.parametrize(
    "kwargs",
    [
        {"harnesses": ("nope",)},
        {"kind": "weighted", "harnesses": ("codex",)},
        {"kind": "weighted", "harnesses": ("codex",), "weights": (-1,)},
        {"kind": "fixed", "harnesses": ("codex", "bash")},
        {"kind": "uniform", "weights": (1, 1, 1)},
    ],
)
def test_bad_policies_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RotationPolicy(**kwargs)  # type: ignore[arg-type]
