"""The run report names its iterations: MOPD for a distill run, RL otherwise (learner/report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from learner.loop import EvalResult, RunHistory
from learner.report import write_outputs

pytestmark = pytest.mark.unit


def _summary(**extra: Any) -> dict[str, Any]:
    split = {"by_harness": {"codex": 0.5}, "by_effort": {"low": 0.5}, "n": 2}
    return {"run_id": "r-1", "tasks": ["general/count_lines"], "eval_seeds": [10000, 10001], "eval_temperature": 1.0,
            "pass_rate_after_warm_start": 0.5, "pass_rate_after_rl": 1.0, "improvement_points": 50.0,
            "final_version": 1, "after_warm_start": split, "after_rl": split, "timings_s": {"total_s": 1.0},
            "rollout": {}, "store": "sqlite://", **extra}


@pytest.mark.parametrize(("extra", "kind"), [({}, "RL"), ({"distill": {"clip": 5.0}}, "MOPD")])
def test_the_report_names_the_iterations(tmp_path: Path, extra: dict[str, Any], kind: str) -> None:
    history = RunHistory(rl=[{"iteration": 1, "pass_rate": 0.5}],
                         evals=[EvalResult(0, 0, 0.5, {}, {}, 2), EvalResult(1, 1, 1.0, {}, {}, 2)])
    out = write_outputs(_summary(**extra), history, tmp_path)
    text = Path(out["report_md"]).read_text()
    other = "RL" if kind == "MOPD" else "MOPD"
    assert f"pass rate after {kind}:" in text and f"| {kind} iteration |" in text
    assert f"after {other}" not in text and f"| {other} iteration" not in text
