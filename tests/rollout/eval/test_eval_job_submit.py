"""The cluster entry point for real: a Ray head from the `ray` CLI, `ray job submit -- python -m rollout.eval`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ray_heads import submit_job
from sweep_files import sweep_data, write_sweep

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_ray_job_submit import BIN, ROOT, ray_head  # noqa: E402,F401 - the head fixture (own temp dir, port, token)

from rollout.store import TrajectoryStore  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]


def test_ray_job_submit_runs_a_sweep(ray_head: dict, tmp_path: Path) -> None:  # noqa: F811
    data = sweep_data(tmp_path, tasks={"ids": ["general/answer_number"]}, harnesses=["codex"], efforts=["high"], seeds=2)
    path = write_sweep(tmp_path, data)
    cmd = [str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--working-dir", ".",
           "--", "python", "-m", "rollout.eval", str(path), "--json", str(tmp_path / "job.json")]
    job = submit_job(cmd, cwd=ROOT, env=ray_head["env"], timeout=700)
    logs = f"{job.stdout[-6000:]}\n{job.stderr[-3000:]}"
    assert job.returncode == 0 and "eval-report:" in job.stdout, logs
    doc = json.loads((tmp_path / "job.json").read_text())
    assert doc["complete"] and doc["planned"] == 4
    assert doc["by_policy"]["oracle"]["pass_rate"] == 1.0 and doc["by_policy"]["nothing"]["pass_rate"] == 0.0
    with TrajectoryStore(data["store"]) as store:
        assert len({t.episode_id for t in store.iter_trajectories(run_id=data["sweep_id"])}) == 4
