"""``python -m benches.branching`` at toy size: one round of a 2-leaf tree against 2 independent episodes on Docker,
and one killed episode resumed against rerun.
Every episode must end ok (the bench exits non-zero otherwise), the table must print with its ratio row, and no
branch may have failed (a tree that silently fell back to independent episodes would measure nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_bench_branching_toy() -> None:
    run = subprocess.run([sys.executable, "-m", "benches.branching", "--rounds", "1", "--k", "2", "--walk", "2",
                          "--turn", "0", "--sleep", "0", "--resume-episodes", "1", "--kill-at", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=570)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "tree / independent" in run.stdout and "sandbox-s" in run.stdout
    assert "branch failures" not in run.stdout, run.stdout[-2000:]
    assert "saved by resume" in run.stdout  # and (exit 0) the killed episode was resumed once, and ended ok
