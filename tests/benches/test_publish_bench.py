"""``python -m benches.publish --small``: the publish-latency bench end to end on tiny shapes (moved here from
``tests/learner/test_publish.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(600)  # about 30 s on an idle 2-core machine; a loaded one starts 4 actors slowly
def test_bench_publish_small(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "benches.publish", "--small", "--json", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=570)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["workers"] == 4 and report["dtype"] == "bfloat16" and report["repeats"] >= 3
    for name in ("object_store", "checkpoint_reload"):
        row = report["methods"][name]
        assert len(row["seconds"]) == report["repeats"] and row["median_s"] > 0
        assert row["verified"] is True  # every worker ended with the published weights
    assert report["ratio_checkpoint_over_object_store"] == pytest.approx(
        report["methods"]["checkpoint_reload"]["median_s"] / report["methods"]["object_store"]["median_s"])
    assert "object_store" in run.stdout and "ratio" in run.stdout
