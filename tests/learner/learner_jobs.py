"""Start ``python -m learner.job`` as a user would, in its own process session (so a test can kill it whole)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_learner_job(cfg: Path, *extra: str) -> subprocess.Popen[str]:
    """The training job on ``cfg`` from the repo root, stdout and stderr merged, in a new session."""
    return subprocess.Popen(
        [sys.executable, "-m", "learner.job", str(cfg), *extra], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
