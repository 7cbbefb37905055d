"""Faults mid-sweep, for real: the driver SIGKILLed then resumed; a Ray worker and the sweep's containers killed.

Every planned cell ends stored exactly once; infrastructure errors are retried and reported, never failures;
with the scripted policies a resumed sweep's results equal those of an uninterrupted one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sweep_files import sweep_data, write_sweep

from rollout.eval.config import parse_sweep
from rollout.eval.report import summarise
from rollout.eval.runner import run_sweep
from rollout.eval.types import Outcome
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.ray, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[3]


def n_stored(url: str, sweep_id: str) -> int:
    from sqlalchemy import func, select

    from rollout.store import EpisodeRow

    try:
        with TrajectoryStore(url) as store, store.engine.connect() as conn:
            return int(conn.execute(select(func.count()).where(EpisodeRow.run_id == sweep_id)).scalar_one())
    except Exception:  # noqa: BLE001 - the driver may still be creating the tables
        return 0


def kill_session(sid: int) -> None:
    """SIGKILL what the killed driver left (its Ray head, raylet, workers): the processes of its session, by pid."""
    for _ in range(3):
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if os.getsid(int(proc.name)) == sid:
                        os.kill(int(proc.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        time.sleep(0.5)


def cells(results: list[Any]) -> dict[tuple[Any, ...], tuple[str, float]]:
    return {(r.policy, r.task_id, r.seed, r.harness, r.effort, r.sample): (r.outcome.value, r.reward) for r in results}


def test_sigkill_the_driver_then_resume_runs_only_the_missing_cells(local_ray: Any, tmp_path: Path) -> None:
    from sandboxes.reaper import gc

    data = sweep_data(tmp_path, seeds=3, efforts=["high"])  # 2 policies x 2 tasks x 2 harnesses x 3 seeds = 24
    path = write_sweep(tmp_path, data)
    log = (tmp_path / "driver.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout.eval", str(path)], cwd=ROOT, start_new_session=True,
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_ADDRESS": ""},
    )
    try:
        deadline = time.monotonic() + 480  # start-up under load: Ray, workers, warm pools
        while n_stored(data["store"], data["sweep_id"]) < 6:
            assert proc.poll() is None, "the sweep ended before it could be killed:\n" + (tmp_path / "driver.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the sweep stored nothing in time"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        kill_session(proc.pid)
    before = n_stored(data["store"], data["sweep_id"])
    assert 6 <= before < 24, before
    gc(run_id=data["sweep_id"])  # the dead driver's containers (their owners are gone)

    cfg = parse_sweep(data)
    resumed = run_sweep(cfg, resume=True)
    assert resumed.complete and resumed.counters["skipped"] == before and resumed.counters["ran"] == 24 - before
    with TrajectoryStore(cfg.store) as store:
        ids = Counter(t.episode_id for t in store.iter_trajectories(run_id=cfg.sweep_id))
    assert len(ids) == 24 and set(ids.values()) == {1}

    reference = run_sweep(parse_sweep({**data, "sweep_id": data["sweep_id"] + "-ref"}))
    assert cells(resumed.results) == cells(reference.results)
    assert summarise(resumed.results)["by_policy"] == summarise(reference.results)["by_policy"]


def test_killed_worker_and_containers_are_infrastructure_retried_never_failures(local_ray: Any, tmp_path: Path) -> None:
    import docker

    from sandboxes.labels import RUN_ID

    data = sweep_data(tmp_path, seeds=2, policies=[{"name": "oracle", "kind": "oracle"}],
                      retries={"backoff_s": 0.1, "sandbox_acquire": 0, "infrastructure": 3})
    cfg = parse_sweep(data)
    client = docker.from_env()
    holder: dict[str, Any] = {}
    done = {"stored": 0, "killed_worker": 0, "killed_containers": 0}

    def on_event(event: str, _req: Any, _traj: Any) -> None:
        s = holder["s"]
        if event == "stored":
            done["stored"] += 1
        if event == "start" and not done["killed_worker"] and done["stored"] >= 2 and s._load[0] >= 1:
            done["killed_worker"] = 1
            local_ray.kill(s.workers[0].actor, no_restart=False)
        if event == "stored" and done["stored"] in (5, 9):
            for c in client.containers.list(filters={"label": f"{RUN_ID}={cfg.sweep_id}"}):
                try:
                    c.kill()
                    done["killed_containers"] += 1
                except docker.errors.APIError:
                    pass

    run = run_sweep(cfg, on_event=on_event, on_start=lambda s, *_: holder.setdefault("s", s))
    assert done["killed_worker"] and done["killed_containers"], done
    assert run.complete and len(run.results) == 2 * 2 * 2 * 2
    with TrajectoryStore(cfg.store) as store:
        ids = Counter(t.episode_id for t in store.iter_trajectories(run_id=cfg.sweep_id))
    assert len(ids) == 16 and set(ids.values()) == {1}
    assert run.counters["worker_reruns"] >= 1 and run.counters["worker_restarts"] >= 1
    retried = sum(r.infra_retries for r in run.results)
    assert retried >= 1 or run.counters.get("infra_retries", 0) >= 1, (run.counters, done)
    outcomes = Counter(r.outcome for r in run.results)
    assert outcomes[Outcome.FAILED] == 0, [(r.episode_id, r.status, r.error) for r in run.results if r.outcome is Outcome.FAILED]
    assert outcomes[Outcome.PASSED] + outcomes[Outcome.INFRASTRUCTURE] == 16
