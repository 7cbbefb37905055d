"""The CPU tree-packing bench runs, writes its JSON, and its table is derived from what it measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benches import tree_packing

pytestmark = pytest.mark.unit


def test_bench_tree_packing_small(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert tree_packing.main(["--trees", "2", "--leaves", "3", "--prompt", "8", "--prefix", "24", "--suffix", "5",
                              "--hidden", "32", "--layers", "1", "--repeats", "1", "--threads", "1",
                              "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    # tokens: unshared forwards every leaf whole; shared forwards each tree's prefix once
    assert res["forward_tokens"]["unshared"] == 2 * 3 * (8 + 24 + 5)
    assert res["forward_tokens"]["prefix-shared"] == 2 * (8 + 24 + 3 * 5)
    assert res["token_ratio"] == pytest.approx(res["forward_tokens"]["prefix-shared"] / res["forward_tokens"]["unshared"])
    assert res["time_ratio"] == pytest.approx(res["step_s"]["prefix-shared"] / res["step_s"]["unshared"])
    assert res["fallback_groups"] == {"unshared": 0, "prefix-shared": 0}
    assert res["micro_batches"] == {"unshared": 1, "prefix-shared": 1}
    assert res["loss"]["prefix-shared"] == pytest.approx(res["loss"]["unshared"], abs=1e-6)
    assert res["grad_scale"] > 0 and res["max_grad_diff"] < 1e-6


def test_branched_group_shares_exactly_the_prefix() -> None:
    group = tree_packing.branched_group("g", 100, leaves=3, prompt=4, prefix=8, suffix=2)
    a, b = group[0].samples[0], group[1].samples[0]
    assert a.token_ids[:12] == b.token_ids[:12] and a.logprobs[:12] == b.logprobs[:12]
    assert a.loss_mask[:4] == (0,) * 4 and a.loss_mask[-2:] == (1, 1)
    assert [t.reward for t in group] == [0.0, 1.0, 0.0]
