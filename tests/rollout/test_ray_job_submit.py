"""The cluster entry point for real: a local Ray head started with the ``ray`` CLI, a job submitted with
``ray job submit --working-dir .``, the store checked afterwards.

The head gets its own ``--temp-dir``; the finalizer stops exactly the processes
whose command line names that directory (the head, its raylet, dashboard and
workers), so Ray sessions of other processes on the machine are never touched.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.config import load_config
from rollout.scheduler import plan_episodes
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.ray, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: `ray` and the `python` the job's entrypoint runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_pids(temp_dir: str) -> list[int]:
    """Pids of the processes whose command line names ``temp_dir``: exactly one Ray session's."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if temp_dir in cmdline:
            pids.append(int(proc.name))
    return pids


def stop_session(temp_dir: str) -> None:
    """SIGTERM, then SIGKILL, every process of the Ray session rooted at ``temp_dir`` (by pid)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(temp_dir):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 15
        while session_pids(temp_dir) and time.time() < deadline:
            time.sleep(0.5)


@pytest.fixture
def ray_head(base_image: str) -> Iterator[dict[str, str]]:
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    port, dash = free_port(), free_port()
    # Ray >= 2.59 turns token auth on for local clusters; give this head its own token, so the
    # test neither depends on nor touches ~/.ray/auth_token
    token = Path(temp_dir) / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = os.environ | {
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(BIN / "ray"), "start", "--head", "--num-cpus=2", f"--port={port}", f"--dashboard-port={dash}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
        '--resources={"docker_daemon": 2}', "--disable-usage-stats",
    ]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, f"ray start failed:\n{out.stdout}\n{out.stderr}"
        yield {"address": f"http://127.0.0.1:{dash}", "env": env}  # type: ignore[misc]
    finally:
        stop_session(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_the_example_and_stores_every_episode(ray_head: dict, tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'job.db'}"
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    cmd = [
        str(BIN / "ray"), "job", "submit", "--address", ray_head["address"], "--working-dir", ".",
        "--", "python", "-m", "rollout.job", "examples/rollout.yaml", "--store", store_url, "--run-id", run_id,
    ]
    job = subprocess.run(cmd, cwd=ROOT, env=ray_head["env"], capture_output=True, text=True, timeout=700)
    logs = f"{job.stdout[-6000:]}\n{job.stderr[-3000:]}"
    assert job.returncode == 0, logs
    assert "succeeded" in job.stdout.lower() and "rollout-report:" in job.stdout, logs

    cfg = load_config(ROOT / "examples" / "rollout.yaml", store=store_url, run_id=run_id)
    from rollout.job import resolve_tasks

    planned = sorted(r.episode_id for r in plan_episodes(cfg, sorted(resolve_tasks(cfg.tasks))))
    with TrajectoryStore(store_url) as store:
        stored = sorted(t.episode_id for t in store.query(run_id=run_id))
    assert stored == planned and len(planned) == 4, logs
