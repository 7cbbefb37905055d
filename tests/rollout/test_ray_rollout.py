"""Rollout on a real local Ray with real Docker sandboxes: every planned episode stored exactly once,
also when a worker actor is killed mid-run (``ray.kill``)."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rollout.config import RolloutConfig, parse_config
from rollout.scheduler import Scheduler, plan_episodes
from rollout.store import TrajectoryStore
from rollout.types import Status

pytestmark = [pytest.mark.ray, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def local_ray(base_image: str) -> Any:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, resources={"docker_daemon": 2})
    try:
        yield ray
    finally:
        ray.shutdown()


def small_config(tmp_path: Path, *, seeds: int, concurrency: int = 2) -> RolloutConfig:
    return parse_config(
        {
            "run_id": f"test-ray-{uuid.uuid4().hex[:8]}",
            "store": f"sqlite:///{tmp_path / 'store.db'}",
            "tasks": {"tags": ["quickstart"]},
            "seeds": seeds,
            "group_size": 2,
            "rotation": {"kind": "round_robin"},
            "efforts": {"levels": ["low", "high"]},
            "policy": {"kind": "scripted"},
            "workers": 2,
            "concurrency": concurrency,
            "pool_size": 1,
            "retries": {"worker_restarts": 1},
        }
    )


def stored_exactly_once(cfg: RolloutConfig) -> list[Any]:
    from rollout.job import resolve_tasks

    planned = [r.episode_id for r in plan_episodes(cfg, sorted(resolve_tasks(cfg.tasks)))]
    with TrajectoryStore(cfg.store) as store:
        trajs = store.query(run_id=cfg.run_id)
    ids = Counter(t.episode_id for t in trajs)
    assert sorted(ids) == sorted(planned), "every planned episode, nothing else"
    assert set(ids.values()) == {1}, "each exactly once"
    return trajs


def test_small_run_stores_every_planned_episode_once(local_ray: Any, tmp_path: Path) -> None:
    from rollout.job import run_rollout

    cfg = small_config(tmp_path, seeds=1)
    report = run_rollout(cfg)
    trajs = stored_exactly_once(cfg)
    assert report.accounted and report.stored == len(trajs) == 4 and report.rerun == 0
    assert all(t.status is Status.OK and t.reward == 1.0 for t in trajs), [(t.status, t.error) for t in trajs]
    assert {t.harness for t in trajs} <= {"claude_code", "codex", "kimi_code"}
    # a second submission of the same run resumes: everything is already stored, nothing runs twice
    again = run_rollout(cfg)
    assert again.skipped == again.planned == 4 and again.stored == 0 and again.accounted
    stored_exactly_once(cfg)


@pytest.mark.parametrize("no_restart", [False, True], ids=["ray-restarts-it", "re-created"])
def test_killed_worker_mid_run_still_stores_every_episode_once(
    local_ray: Any, tmp_path: Path, no_restart: bool
) -> None:
    from rollout.job import run_rollout

    cfg = small_config(tmp_path, seeds=2)
    killed: list[int] = []
    holder: dict[str, Scheduler] = {}

    def on_event(event: str, _req: Any, _traj: Any) -> None:
        s = holder["s"]
        # kill worker 0 while it holds episodes in flight
        if event == "start" and not killed and s._load[0] >= 2:
            killed.append(1)
            local_ray.kill(s.workers[0].actor, no_restart=no_restart)

    report = run_rollout(cfg, on_event=on_event, on_start=lambda s: holder.setdefault("s", s))
    assert killed, "the test never killed a worker"
    trajs = stored_exactly_once(cfg)
    assert report.accounted and report.stored == len(trajs) == 8
    assert report.rerun >= 1 and report.worker_restarts >= 1
    assert Counter(t.status for t in trajs)[Status.OK] == 8, [(t.status, t.error) for t in trajs]
