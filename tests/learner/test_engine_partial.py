"""Partial rollouts for real (the in-process runner on Docker): an episode in flight when the learner
starts a step waits at its next turn boundary (the turn gate), and continues under the weights
published meanwhile. Its turns carry the versions that sampled them, its version is its oldest
turn's, and the time it waited is not charged to its wall-clock budget."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rollout.episode import EpisodeRequest
from rollout.policy.types import FinishReason, Generation, Policy, Prompt, SamplingParams
from rollout.runner import InProcessRunner
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


class SlowTalker(Policy):
    """Says nothing useful, slowly (0.3 s a turn), at whatever weights version it holds."""

    name = "slow"
    version = 0  # a plain attribute here (set_weights sets it), not Policy's read-only property

    def __init__(self) -> None:
        self.version = 0
        self.turns = 0

    def set_weights(self, weights: Any, version: int) -> None:
        self.version = version

    async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
        self.turns += 1
        await asyncio.sleep(0.3)
        return Generation("thinking...", (), (), FinishReason.STOP, self.version)


def test_an_episode_held_during_a_learner_step_continues_under_the_new_weights(tmp_path: Path, base_image: str) -> None:
    policy = SlowTalker()
    store = TrajectoryStore(f"sqlite:///{tmp_path / 'p.db'}")
    runner = InProcessRunner(policy, tokenizer=None, backend="docker", run_id="partial-test", store=store, concurrency=2)

    async def main() -> Any:
        await runner.start(["general/answer_number"])
        # the bash harness does not submit on a text turn: the episode runs all its turns
        fut = runner.submit(EpisodeRequest("held", "partial-test", "general/answer_number", 1, "bash"))
        while policy.turns < 1:
            await asyncio.sleep(0.05)
        await runner.pause()  # the learner starts a step
        await asyncio.sleep(1.5)  # longer than any turn: the episode is waiting at the gate now
        assert runner.gate.waiting == 1 and policy.turns == 1
        await runner.publish(1, {})  # new weights, under version 1
        await runner.resume()
        return await fut

    try:
        traj = asyncio.run(main())
    finally:
        asyncio.run(runner.close())
        store.close()
    versions = [t.policy_version for t in traj.turns]
    assert versions[0] == 0 and set(versions[1:]) == {1} and len(versions) >= 2, versions
    assert traj.policy_version == 0  # the oldest turn: what the staleness bound counts
    assert traj.status.value == "truncated" and traj.timings.total_s >= 1.5  # held, yet not timed out


def test_the_engine_with_partial_rollouts_trains_every_planned_group_once_within_the_bound(tmp_path: Path, base_image: str) -> None:
    from learner.loop import TrainLoop
    from learner.train_config import TrainConfig

    cfg = TrainConfig.model_validate({
        "run_id": "partial", "store": f"sqlite:///{tmp_path / 'e.db'}", "out_dir": str(tmp_path / "runs"),
        "rollout": {"tasks": {"ids": ["general/answer_number"]}, "rotation": {"kind": "round_robin", "harnesses": ["bash"]},
                    "group_size": 2, "sampling": {"temperature": 1.0, "max_new_tokens": 8},
                    "staleness": {"max_lag": 1}, "concurrency": 4, "pool_size": 2},
        "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
        "sft": {"episodes": 0}, "rl": {"iterations": 3, "groups_per_iter": 1, "partial_rollouts": True, "partial_oversample": 1},
        "eval": {"seeds": {"start": 9000, "count": 1}}, "train_seeds": 9000, "torch_threads": 1, "checkpoint": {"every": 0},
    })
    summary = asyncio.run(TrainLoop(cfg, {"general/answer_number": "general"}).run())
    assert [r["iteration"] for r in summary["rl"]] == [1, 2, 3] and summary["final_version"] == 3
    assert all(r["max_lag"] <= 1 for r in summary["rl"]), summary["rl"]
    with TrajectoryStore(cfg.trajectory_store) as store:
        rl = [t.episode_id for t in store.query(run_id=summary["run_id"]) if "/rl" in t.episode_id]
    assert len(rl) == len(set(rl)) == 3 * 2
    assert summary["trained_episodes"] == summary["trained_unique"]
