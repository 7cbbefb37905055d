"""Training through two ``agentenv serve`` processes (``serving:``), for real: HTTP, weight updates, the store.

Each run: a tiny model, the local sandbox backend, two RL iterations. It checks the contract, not learning:
both servers end on the learner's final version, every planned episode is stored exactly once, the train
turns were sampled on the servers (both of them) with their versions, and a server SIGKILLed mid-run costs
reruns, never a duplicate: the run finishes on the server left.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray_heads import free_port
from serve_procs import start_serve, stop, wait_up

from learner.errors import LearnerConfigError
from learner.loop import TrainLoop
from learner.serving import initial_checkpoint
from learner.train_config import TrainConfig
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TASK = "general/answer_number"
ITERATIONS = 2
EVAL_SEEDS = 2


def _config(tmp: Path, urls: list[str], transport: str, max_lag: int = 0, **rl: Any) -> TrainConfig:
    return TrainConfig.model_validate({
        "run_id": "served", "store": f"sqlite:///{tmp / 'store.db'}", "out_dir": str(tmp / "runs"),
        "rollout": {"tasks": {"ids": [TASK]}, "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex"]},
                    "group_size": 2, "sampling": {"temperature": 1.0, "max_new_tokens": 8},
                    "staleness": {"max_lag": max_lag}, "concurrency": 4, "pool_size": 2, "backend": "local"},
        "serving": {"urls": urls, "model": "student", "transport": transport, "timeout_s": 60},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
        "sft": {"episodes": 0},
        "rl": {"iterations": ITERATIONS, "groups_per_iter": 2, "updates_per_iter": 1, **rl},
        "eval": {"seeds": {"start": 9000, "count": EVAL_SEEDS}, "every": 0, "temperature": 1.0, "greedy_too": False},
        "train_seeds": 9000, "torch_threads": 1,
    })


def _info(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/get_model_info", timeout=10).json())


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """Two ``agentenv serve`` processes started from the learner's initial checkpoint (its architecture)."""
    init = initial_checkpoint(_config(tmp_path, ["http://127.0.0.1:1"], "disk"), tmp_path / "init")
    started = [start_serve(str(init), tmp_path / f"serve{i}.log", "--served-name", "student") for i in range(2)]
    try:
        for server in started:
            wait_up(server)
        yield [(server.url, server.proc) for server in started]
    finally:
        for server in started:
            stop(server)


def _stored(tmp: Path, run_id: str) -> list[Any]:
    with TrajectoryStore(f"sqlite:///{tmp / 'store.db'}") as store:
        return list(store.query(run_id=run_id))


def _expected_episodes(group_size: int = 2, groups: int = 2) -> int:
    return ITERATIONS * groups * group_size + 2 * EVAL_SEEDS  # RL, then eval #0 and the final eval


@pytest.mark.parametrize("transport", ["disk", "gloo"])
@pytest.mark.parametrize(("max_lag", "partial"), [(0, False), (1, False), (1, True)], ids=["sync", "K1", "K1-partial"])
def test_training_through_two_servers_ends_on_one_version_with_every_episode_stored_once(
    servers: list[tuple[str, subprocess.Popen[bytes]]], tmp_path: Path, transport: str, max_lag: int, partial: bool,
) -> None:
    urls = [url for url, _ in servers]
    partial_rl = {"partial_rollouts": True, "partial_oversample": 1} if partial else {}
    loop = TrainLoop(_config(tmp_path, urls, transport, max_lag, **partial_rl), [TASK])
    summary = asyncio.run(loop.run())

    assert summary["final_version"] == ITERATIONS
    assert [_info(u)["version"] for u in urls] == [ITERATIONS, ITERATIONS]  # every server on the learner's last version
    rollout = summary["rollout"]
    assert rollout["runner"] == "served" and rollout["dead_servers"] == {}
    assert rollout["versions_published"] == ITERATIONS + 1  # version 0, then one per iteration
    assert all(rollout["turns_per_server"][u] > 0 for u in urls), rollout  # both servers sampled

    stored = _stored(tmp_path, summary["run_id"])
    ids = [t.episode_id for t in stored]
    assert len(ids) == len(set(ids)) == _expected_episodes()
    rl = [t for t in stored if "/rl" in t.episode_id]
    assert rl and all(t.samples and t.samples[0].logprobs for t in rl if t.trainable)
    assert summary["trained_unique"] == summary["trained_episodes"]  # nothing trained twice
    # each turn's version is the one the server reported: published before the last iteration's step
    assert {turn.policy_version for t in rl for turn in t.turns} <= set(range(ITERATIONS))
    assert all(row["max_lag"] <= max_lag for row in summary["rl"])
    assert all(t.policy_version == ITERATIONS for t in stored if "/eval1/" in t.episode_id)


def test_a_server_killed_mid_run_costs_reruns_never_a_duplicate(
    servers: list[tuple[str, subprocess.Popen[bytes]]], tmp_path: Path,
) -> None:
    (alive, _), (victim, victim_proc) = servers
    loop = TrainLoop(_config(tmp_path, [alive, victim], "disk"), [TASK])
    fleet = loop.runner.describe  # read from the killer thread: counts only
    killed = threading.Event()

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed.is_set():
            if fleet()["turns_per_server"][victim.rstrip("/")] >= 3:
                victim_proc.send_signal(signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    summary = asyncio.run(loop.run())
    killer.join(5)

    assert killed.is_set(), "the victim never served 3 turns: the test did not kill it mid-run"
    assert summary["final_version"] == ITERATIONS
    assert _info(alive)["version"] == ITERATIONS
    rollout = summary["rollout"]
    assert list(rollout["dead_servers"]) == [victim] and "connection failed" in rollout["dead_servers"][victim]
    stored = _stored(tmp_path, summary["run_id"])
    ids = [t.episode_id for t in stored]
    assert len(ids) == len(set(ids)) == _expected_episodes()  # every planned episode stored, once
    rerun = [t for t in stored if any(victim in r for r in t.verifier.get("retries", ()))]
    assert rerun, "no episode records a rerun after the kill"
    assert all(t.status.value != "sandbox_lost" for t in rerun)  # the rerun on the live server finished
    assert summary["trained_unique"] == summary["trained_episodes"]


def test_a_server_that_is_down_at_start_is_named(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    loop = TrainLoop(_config(tmp_path, [down], "disk"), [TASK])
    with pytest.raises(LearnerConfigError, match=down.replace(".", r"\.")):
        asyncio.run(loop.run())


def test_mopd_through_two_servers_trains_on_what_the_servers_sampled(
    servers: list[tuple[str, subprocess.Popen[bytes]]], tmp_path: Path,
) -> None:
    from distill.loop import run_distill
    from distill.tiny_grid import write_tiny_grid
    from distill.types import DistillConfig

    urls = [url for url, _ in servers]
    grid = write_tiny_grid(tmp_path / "teachers", per="domain", hidden_size=32, num_layers=1)
    data = _config(tmp_path, urls, "disk", 1, partial_rollouts=True, partial_oversample=1,
                   loss={"is_correction": "mis", "kl_coef": 0.0}).model_dump(mode="json")
    data["rollout"]["efforts"] = {"levels": ["low", "high", "max"]}
    data["distill"] = {"teachers": str(grid), "clip": 5.0, "alpha": 0.1}
    summary = run_distill(DistillConfig.model_validate(data), tmp_path)

    assert summary["final_version"] == ITERATIONS and [_info(u)["version"] for u in urls] == [ITERATIONS] * 2
    assert summary["rollout"]["runner"] == "served" and all(n > 0 for n in summary["rollout"]["turns_per_server"].values())
    assert all(row["mopd/tokens"] > 0 for row in summary["distill"]["steps"])  # the teachers scored served tokens
    stored = _stored(tmp_path, summary["run_id"])
    assert len(stored) == len({t.episode_id for t in stored}) == _expected_episodes()
