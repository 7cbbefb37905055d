"""``examples/native.yaml`` (the real CLIs in a rollout, ``policy: scripted``) and the scripted policy's first call in
each native program's own shell tool (no Docker: the call it writes, read back)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentenv.registry import get_task
from rollout.attempt import EpisodeContext, EpisodeRequest
from rollout.config import load_config
from rollout.harnesses import get_harness
from rollout.harnesses.native import NATIVE_HARNESSES, native_profile
from rollout.policy.scripted import ScriptedPolicy
from rollout.policy.types import Prompt, SamplingParams

pytestmark = pytest.mark.unit
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "native.yaml"


def test_the_example_rotates_the_three_real_programs_with_the_scripted_policy() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.policy.kind == "scripted"
    assert set(cfg.rotation.schedule(cfg.group_size)) == set(NATIVE_HARNESSES)
    assert cfg.planned_per_task * len(cfg.tasks.ids) == 9 and all(get_task(t).oracle_script(get_task(t).variant(0)) for t in cfg.tasks.ids)


@pytest.mark.parametrize("harness", sorted(NATIVE_HARNESSES))
def test_the_scripted_policy_calls_each_programs_own_shell_tool(harness: str) -> None:
    profile = native_profile(harness)
    task = get_task("general/write_word")
    variant = task.variant(0)
    ctx = EpisodeContext(EpisodeRequest("e", "r", task.id, 0, harness), task, variant, get_harness(profile.emulated), None)  # type: ignore[arg-type]
    bound = ScriptedPolicy().for_episode(ctx)
    tools = [{"type": "function", "function": {"name": profile.shell_tool[0], "parameters": {}}}]
    gen = asyncio.run(bound.generate(Prompt((), ({"role": "user", "content": variant.instruction},), tuple(tools)), SamplingParams()))
    call = json.loads(gen.text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0])
    assert call["name"] == profile.shell_tool[0]  # Codex: exec_command, never the emulated surface's "shell"
    assert call["arguments"][profile.shell_tool[1]] and "echo" in call["arguments"][profile.shell_tool[1]]
