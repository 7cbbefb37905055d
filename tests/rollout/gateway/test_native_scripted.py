"""``policy: scripted`` (what a user configures) through every real native program earns full reward.

``ScriptedPolicy`` plays a native episode in the program's own tools (``Bash``, Codex's ``exec_command``,
kimi's ``Shell``), not in the emulated harness's: Codex 0.163.0 answers the emulated ``shell`` call with
"unsupported call: shell", so before, every ``native:codex`` episode of the scripted policy earned 0.
"""

from __future__ import annotations

import asyncio

import pytest

from rollout.attempt import EpisodeRequest
from rollout.episode import EpisodeRunner
from rollout.harnesses.native import NATIVE_HARNESSES
from rollout.policy.scripted import ScriptedPolicy
from rollout.types import Status

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]
TASKS = ("general/write_word", "general/answer_number")  # a file written, an answer graded


@pytest.mark.parametrize("harness", sorted(NATIVE_HARNESSES))
def test_the_scripted_policy_earns_reward_1_through_the_real_program(docker_client, base_image, harness: str) -> None:
    from sandboxes.docker_backend import DockerBackend

    runner = EpisodeRunner(ScriptedPolicy(), backend=DockerBackend(docker_client))

    async def main():
        return await asyncio.gather(*(runner.run(EpisodeRequest(f"scripted-{harness}-{t}", "test-native-scripted", t, 2, harness,
                                                                effort="high")) for t in TASKS))

    try:
        trajectories = asyncio.run(main())
    finally:
        runner.close()
    for t in trajectories:
        assert t.status is Status.OK and t.reward == 1.0, (t.task_id, t.status, t.reward, t.error[-300:], t.verifier.get("reason"))
        assert t.verifier["append_only"] and len(t.turns) >= 2, (t.task_id, t.verifier.get("gateway_breaks"))
