"""A cancelled episode (the staleness abort, a stopped run) waits for its tool-call thread before its
sandbox is released, so nothing it started writes after the reset has checked the sandbox; and the
lease is returned: the next episode in the same one-sandbox pool starts clean. Real Docker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agentenv.intents import Intent
from rollout.attempt import EpisodeContext, EpisodeRequest
from rollout.episode import EpisodeRunner
from rollout.policy.types import FinishReason, Generation, Policy, Prompt, SamplingParams

pytestmark = [pytest.mark.docker]


class Commands:
    """Runs one shell command per episode (``commands[episode_id]``), then submits."""

    name, version = "commands", 0

    def __init__(self, commands: dict[str, str]) -> None:
        self.commands = commands
        self.outputs: dict[str, str] = {}
        self.acting: asyncio.Event | None = None  # set when a first turn's call is handed to the runner

    def for_episode(self, ctx: EpisodeContext) -> Policy:
        outer, command = self, self.commands[ctx.request.episode_id]

        class Episode:
            name, version, turn = "commands", 0, 0

            async def generate(self, prompt: Prompt, sampling: SamplingParams, budget: Any = None) -> Generation:
                self.turn += 1
                if self.turn > 1:
                    outer.outputs[ctx.request.episode_id] = str(prompt.messages[-1].get("content"))
                intent = Intent("exec_shell", {"command": command, "timeout_s": 10}) if self.turn == 1 else Intent("submit", {})
                if self.turn == 1 and outer.acting is not None:
                    outer.acting.set()
                return Generation(ctx.harness.render_turn([intent]), (), (), FinishReason.STOP, 0)  # type: ignore[attr-defined]

        return Episode()


def test_cancelled_episode_releases_its_sandbox_only_after_its_tool_call_ends(docker_client: Any, base_image: str) -> None:
    from sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(docker_client)
    policy = Commands({
        "slow": "sleep 1.5; echo late > /workspace/late.txt",
        "probe": "ls /workspace; cat /workspace/late.txt || echo ABSENT",
    })
    runner = EpisodeRunner(policy, backend=backend, pool_size=1)
    released: list[float] = []
    real_release = runner.sandboxes.release

    def release(lease: Any) -> None:
        released.append(time.monotonic())
        real_release(lease)

    runner.sandboxes.release = release  # type: ignore[method-assign]

    async def main() -> Any:
        policy.acting = asyncio.Event()
        task = asyncio.ensure_future(runner.run(EpisodeRequest("slow", "cancel-test", "general/answer_number", 1, "codex")))
        await policy.acting.wait()
        t0 = time.monotonic()
        await asyncio.sleep(0.6)  # inside the sleep of the tool call
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        waited = released[0] - t0
        probe = await runner.run(EpisodeRequest("probe", "cancel-test", "general/answer_number", 1, "codex"))
        return waited, probe

    try:
        waited, probe = asyncio.run(main())
    finally:
        runner.close()
        backend.close()
    assert waited >= 1.4, f"released {waited:.2f}s after start, before the tool call (1.5 s) ended"
    assert "ABSENT" in policy.outputs["probe"] and "late" not in policy.outputs["probe"].replace("late.txt", ""), policy.outputs
    assert probe.status.value in {"ok", "truncated"}
