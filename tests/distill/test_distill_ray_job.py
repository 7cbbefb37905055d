"""``ray job submit -- python -m distill.job CONFIG`` for real: a local Ray head from the ``ray`` CLI, tiny teachers,
Docker sandboxes; the job's summary line and the store checked afterwards."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ray_heads import BIN, start_head, submit_job

from distill.tiny_grid import write_tiny_grid
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


def test_ray_job_submit_runs_distill(ray_head: dict, tmp_path: Path) -> None:
    grid = write_tiny_grid(tmp_path / "teachers", per="one")
    store_url = f"sqlite:///{tmp_path / 'job.db'}"
    run_id = f"distill-job-{uuid.uuid4().hex[:8]}"
    cfg = {
        "run_id": "distill-job", "out_dir": str(tmp_path / "runs"),
        "rollout": {"tasks": {"ids": ["general/answer_number"]}, "efforts": {"levels": ["low", "max"]}, "group_size": 2,
                    "sampling": {"temperature": 1.0, "max_new_tokens": 8}, "concurrency": 2},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
        "sft": {"episodes": 0}, "rl": {"iterations": 1, "groups_per_iter": 1, "loss": {"is_correction": "mis"}},
        "eval": {"seeds": {"start": 9000, "count": 2}}, "train_seeds": 9000,
        "distill": {"teachers": str(grid)},
    }
    config = tmp_path / "distill.yaml"
    config.write_text(yaml.safe_dump(cfg))
    cmd = [
        str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--working-dir", ".",
        "--", "python", "-m", "distill.job", str(config), "--store", store_url, "--run-id", run_id,
    ]
    job = submit_job(cmd, cwd=ROOT, env=ray_head["env"], timeout=700)
    logs = f"{job.stdout[-6000:]}\n{job.stderr[-3000:]}"
    assert job.returncode == 0, logs
    assert "succeeded" in job.stdout.lower() and "distill-report:" in job.stdout and "MOPD: KL" in job.stdout, logs
    report = json.loads(job.stdout.split("distill-report: ", 1)[1].splitlines()[0])
    with TrajectoryStore(store_url) as store:
        stored = store.query(run_id=report["run_id"])
        names = {m.name for m in store.metrics(report["run_id"])}
    assert len(stored) == 2 + 2 * 2 and "rl/mopd/kl" in names, logs
