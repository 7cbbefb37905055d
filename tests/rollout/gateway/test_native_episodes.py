"""Every built-in task through each native program (the real Claude Code, Codex, Kimi CLI), end to end, on the local Docker daemon.

The scripted policy replays each task's oracle as the CLI's own shell tool call
through the recording gateway: reward 1, and the gateway's record is one
append-only token sequence. A do-nothing policy earns 0. The drift guard
compares the tool list each pinned CLI really sent with its snapshot, and the
emulated surface with it. The CLI images are built once per content hash (the
first episode of each image builds it; later ones find it; Kimi's Python runtime is
built once for all its images).
"""

from __future__ import annotations

import asyncio

import pytest

from agentenv.registry import list_tasks
from rollout.attempt import EpisodeRequest
from rollout.episode import EpisodeRunner
from rollout.gateway.drift import diff_tools, emulated_drift, load_snapshot, surface
from rollout.gateway.session import Session
from rollout.harnesses.native import NATIVE_HARNESSES
from rollout.policy.scripted import NativeDoNothingPolicy, NativeOraclePolicy
from rollout.types import Status
from sandboxes.docker_backend import DockerBackend

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]
CONCURRENCY = 3


def _run_all(docker_client, policy, harness: str, task_ids: list[str], seed: int = 1):
    backend = DockerBackend(docker_client)
    runner = EpisodeRunner(policy, backend=backend)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(task_id: str):
        async with gate:
            return await runner.run(EpisodeRequest(f"{harness}-{task_id}-{seed}", "test-native", task_id, seed, harness, effort="high"))

    async def main():
        return await asyncio.gather(*(one(t) for t in task_ids))

    try:
        return asyncio.run(main())
    finally:
        runner.close()


@pytest.fixture(scope="module")
def task_ids() -> list[str]:
    return [t.id for t in list_tasks()]


@pytest.mark.parametrize("harness", sorted(NATIVE_HARNESSES))
def test_every_builtin_task_through_the_native_program(docker_client, base_image, harness: str, task_ids: list[str]) -> None:
    trajectories = _run_all(docker_client, NativeOraclePolicy(), harness, task_ids)
    failures = [(t.task_id, t.status.value, t.reward, t.error[:300], t.verifier.get("reason")) for t in trajectories
                if t.status is not Status.OK or t.reward != 1.0]
    assert not failures, failures
    for t in trajectories:
        assert t.verifier["append_only"], (t.task_id, t.verifier["gateway_breaks"])
        assert t.samples and sum(sum(s.loss_mask) for s in t.samples) == sum(turn.completion_tokens for turn in t.turns)
        assert len(t.turns) >= 2  # the oracle's shell call, then the answer


@pytest.mark.parametrize("harness", sorted(NATIVE_HARNESSES))
def test_do_nothing_earns_zero_and_the_tool_list_has_not_drifted(docker_client, base_image, harness: str, monkeypatch) -> None:
    sent: dict[str, list] = {}
    call = Session.call

    async def recording(self, conv):  # passes through; keeps the full tool list the CLI really sent
        sent.setdefault(self.id, []).append(conv.tools)
        return await call(self, conv)

    monkeypatch.setattr(Session, "call", recording)
    trajectories = _run_all(docker_client, NativeDoNothingPolicy(), harness, ["general/write_word", "coding/fix_bug"])
    for t in trajectories:
        assert t.reward == 0.0 and t.status in (Status.OK, Status.TRUNCATED), (t.task_id, t.status, t.error)
    program = NATIVE_HARNESSES[harness].program
    snap = load_snapshot(program)
    live = surface(max(sent[trajectories[0].episode_id], key=len))
    assert diff_tools(live, snap["tools"]) == [], f"{program} {snap['version']}: the live tool list differs from its snapshot"
    assert emulated_drift(program) == snap["emulated_known_drift"], "the emulated surface drifted from the pinned CLI in a new way"
