"""The CPU learner-step bench runs, writes its JSON, and both sides compute the same gradients."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benches import learner_step

pytestmark = pytest.mark.unit


def test_bench_step_small(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert learner_step.main(["--samples", "4", "--prompt", "60", "--response", "8", "--hidden", "32",
                            "--layers", "1", "--repeats", "1", "--threads", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["step_s"]) == {"full logits", "loss tokens only"}
    assert res["speedup"] > 0 and res["max_grad_diff"] < 1e-5


def test_agent_items_mask_only_the_response() -> None:
    items = learner_step.agent_items(3, 100, prompt=5, response=2)
    assert all(it.loss_mask == (0,) * 5 + (1,) * 2 for it in items)
    assert [it.advantage for it in items] == [1.0, -1.0, 1.0]
