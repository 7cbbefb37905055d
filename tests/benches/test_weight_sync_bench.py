"""``python -m benches.weight_sync --small``: the weight-sync bench end to end on tiny shapes (CPU, gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)  # about a minute on an idle 2-core machine: two server processes start
def test_bench_weight_sync_small(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "benches.weight_sync", "--small", "--repeats", "2", "--json", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=570)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    rows = report["transports"]
    assert set(rows) == {"in_process", "gloo_1", "gloo_2", "disk_1", "disk_2"}
    for name, row in rows.items():
        assert len(row["seconds"]) == 2 and row["median_s"] > 0, name
        assert row["verified"] is True, name  # every receiver ended with the learner's weights
    assert rows["gloo_2"]["disk_over_this"] == pytest.approx(rows["disk_2"]["median_s"] / rows["gloo_2"]["median_s"])
    assert "disk reload / this" in run.stdout and "gloo_2" in run.stdout
