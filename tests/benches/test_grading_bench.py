"""``python -m benches.grading`` at toy size: one task, one seed, one rollout round. Both sides must earn reward 1
(the bench exits non-zero otherwise) and both tables must print, so a broken old-folder checkout, a grader that no
longer pays the oracle, or a rollout side that runs nothing fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_bench_grading_toy() -> None:
    run = subprocess.run([sys.executable, "-m", "benches.grading", "--seeds", "1", "--tasks", "coding/fix_add",
                          "--rollout-rounds", "1", "--group", "2"],
                         cwd=REPO, capture_output=True, text=True, timeout=570)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "grading seconds per episode" in run.stdout and "coding/fix_add" in run.stdout
    assert "rollout episodes/s" in run.stdout and "median" in run.stdout
