"""The cluster entry point for real: a local Ray head started with the ``ray`` CLI, a job submitted with
``ray job submit --working-dir .``, the store checked afterwards.

The head gets its own ``--temp-dir`` (``tests/ray_heads.py``); the finalizer stops exactly the
processes whose command line names that directory, so Ray sessions of other processes on the
machine are never touched.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_heads import BIN, start_head, submit_job

from rollout.config import load_config
from rollout.scheduler import plan_episodes
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.ray, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ray_head(base_image: str) -> Iterator[dict[str, str]]:
    head = start_head(num_cpus=2, resources={"docker_daemon": 2})
    try:
        yield {"address": head.dashboard, "env": head.env}  # type: ignore[misc]
    finally:
        head.stop()


def test_ray_job_submit_runs_the_example_and_stores_every_episode(ray_head: dict, tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'job.db'}"
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    cmd = [
        str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--working-dir", ".",
        "--", "python", "-m", "rollout.job", "examples/rollout.yaml", "--store", store_url, "--run-id", run_id,
    ]
    job = submit_job(cmd, cwd=ROOT, env=ray_head["env"], timeout=700)
    logs = f"{job.stdout[-6000:]}\n{job.stderr[-3000:]}"
    assert job.returncode == 0, logs
    assert "succeeded" in job.stdout.lower() and "rollout-report:" in job.stdout, logs

    cfg = load_config(ROOT / "examples" / "rollout.yaml", store=store_url, run_id=run_id)
    from rollout.job import resolve_tasks

    planned = sorted(r.episode_id for r in plan_episodes(cfg, sorted(resolve_tasks(cfg.tasks))))
    with TrajectoryStore(store_url) as store:
        stored = sorted(t.episode_id for t in store.query(run_id=run_id))
    assert stored == planned and len(planned) == 4, logs
