"""The post-training engine on real Ray: a training job through ``ray job submit`` on a local head, and a
two-node cluster on this machine that loses a node mid-run (asynchronous, K = 1).

Real parts only: heads and nodes started with the ``ray`` CLI (``ray_heads``), the local Docker
daemon, SQLite, the tiny model. What they prove:

* ``ray job submit --working-dir . -- python -m learner.job CONFIG`` trains with ``runner: ray``, and
  iteration 2's trajectories were sampled on Ray workers (stamped by ``RolloutWorker``) by weights
  version >= 1, which reached them through the object store;
* with two nodes the workers spread over both; SIGKILLing the second node's raylet mid-run loses its
  worker, whose episodes are rerun elsewhere; every planned episode is stored exactly once, nothing is
  trained twice, and no trained sample is more than K versions behind (checked on every batch).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray_heads import BIN, Head, start_head, submit_job

from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.ray, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def tiny_ray_config(tmp_path: Path, **rl: Any) -> dict[str, Any]:
    return {
        "run_id": "engine-ray",
        "out_dir": str(tmp_path / "runs"),
        "runner": "ray",
        "rollout": {
            "tasks": {"ids": ["general/answer_number"]},
            "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
            "efforts": {"levels": ["low", "high", "max"]},
            "group_size": 2,
            "sampling": {"temperature": 1.0, "max_new_tokens": 16},
            "staleness": {"max_lag": 0},
            "workers": 2,
            "concurrency": 2,
            "pool_size": 1,
            "ray": {"worker_cpus": 0.25},
        },
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
        "sft": {"episodes": 2, "steps": 2, "batch_size": 2},
        "rl": {"iterations": 2, "groups_per_iter": 1, **rl},
        "eval": {"seeds": {"start": 9000, "count": 2}},
        "train_seeds": 9000,
        "torch_threads": 1,
    }


@pytest.fixture
def head(base_image: str) -> Iterator[Head]:
    h = start_head(num_cpus=2, resources={"docker_daemon": 2})
    try:
        yield h
    finally:
        h.stop()


def test_ray_job_submit_trains_on_ray_workers_with_published_weights(head: Head, tmp_path: Path) -> None:
    cfg_path = tmp_path / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(tiny_ray_config(tmp_path)))
    store_url = f"sqlite:///{tmp_path / 'job.db'}"
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    summary_path = tmp_path / "summary.json"
    cmd = [
        str(BIN / "ray"), "job", "submit", "--address", head.dashboard, "--working-dir", ".", "--",
        "python", "-m", "learner.job", str(cfg_path), "--store", store_url, "--run-id", run_id,
        "--json", str(summary_path),
    ]
    job = submit_job(cmd, cwd=ROOT, env=head.env, timeout=800)
    logs = f"{job.stdout[-6000:]}\n{job.stderr[-3000:]}"
    assert job.returncode == 0 and "succeeded" in job.stdout.lower(), logs
    summary = json.loads(summary_path.read_text())
    assert summary["rollout"]["runner"] == "ray" and summary["final_version"] == 2, summary

    with TrajectoryStore(store_url) as store:
        stored = store.query(run_id=summary["run_id"])
    second = [t for t in stored if "/rl2/" in t.episode_id]  # the group trained at iteration 2 (K = 0)
    assert len(second) == 2, [t.episode_id for t in stored]
    for t in second:
        worker = t.verifier.get("worker")
        assert worker and worker["node_id"] and worker["pid"] != os.getpid(), t.verifier
        assert t.policy_version >= 1 and all(turn.policy_version >= 1 for turn in t.turns), t
    assert len({t.episode_id for t in stored}) == len(stored)


def _parent(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def test_two_nodes_lose_one_mid_run_and_nothing_is_stored_or_trained_twice(base_image: str, tmp_path: Path) -> None:
    head = start_head(num_cpus=1, resources={"docker_daemon": 2})
    try:
        node = head.add_node(num_cpus=1, resources={"docker_daemon": 1})
        raylets = set(_pids(node))
        cfg = tiny_ray_config(tmp_path, iterations=4, groups_per_iter=2)
        cfg["rollout"]["staleness"] = {"max_lag": 1}  # asynchronous: the next iteration samples while the learner trains
        cfg["rollout"]["group_size"] = 3
        cfg["rollout"]["ray"]["address"] = head.gcs
        cfg_path = tmp_path / "train.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        store_url = f"sqlite:///{tmp_path / 'nodes.db'}"
        summary_path = tmp_path / "summary.json"
        env = head.env | {"PYTHONPATH": str(ROOT)}
        driver = subprocess.Popen(
            [str(BIN / "python"), "-m", "learner.job", str(cfg_path), "--store", store_url, "--json", str(summary_path)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        killed_worker: int | None = None
        deadline = time.time() + 600
        while driver.poll() is None and time.time() < deadline and killed_worker is None:
            time.sleep(0.5)
            with TrajectoryStore(store_url) as store:
                rl = [t for t in store.query() if "/rl" in t.episode_id]
            on_node = {t.verifier["worker"]["pid"] for t in rl if _parent_in(t.verifier["worker"]["pid"], raylets)}
            if rl and on_node:  # the second node is doing RL episodes: take it away, as a lost machine
                killed_worker = next(iter(on_node))
                assert head.kill_node(node)
        out, _ = driver.communicate(timeout=600)
        assert killed_worker is not None, f"the second node never ran an RL episode:\n{out[-4000:]}"
        assert driver.returncode == 0, out[-6000:]
    finally:
        head.stop()

    summary = json.loads(summary_path.read_text())
    with TrajectoryStore(store_url) as store:
        stored = store.query(run_id=summary["run_id"])
    ids = [t.episode_id for t in stored]
    planned = 2 + 4 * 2 * 3 + 2 * 2  # oracle, RL, two evaluations of two held-out variants
    assert len(ids) == len(set(ids)) == planned, sorted(ids)
    pids = {t.verifier["worker"]["pid"] for t in stored}
    assert killed_worker in pids and len(pids) >= 3, pids  # both nodes worked, then a replacement
    assert summary["rollout"]["worker_restarts"] >= 1 or summary["rollout"]["scheduler_rerun"] >= 1, summary
    assert summary["trained_episodes"] == summary["trained_unique"] > 0, summary  # nothing trained twice
    assert all(row["max_lag"] <= 1 for row in summary["rl"]), summary["rl"]  # the hard bound K = 1


def _pids(needle: str) -> list[int]:
    from ray_heads import session_pids

    return session_pids(needle) + session_pids(needle.replace("_", "-"))


def _parent_in(pid: int, parents: set[int]) -> bool:
    try:
        return _parent(pid) in parents
    except OSError:
        return False
