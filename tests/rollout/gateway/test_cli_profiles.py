"""How each real CLI is started and read back (no Docker): command lines, effort mapping, final messages."""

from __future__ import annotations

import json
import shlex

import pytest

from rollout.harnesses.cli import CLI_HARNESSES, CliUnavailable, cli_profile
from rollout.harnesses.rotation import RotationPolicy

pytestmark = pytest.mark.unit


def test_the_rotation_accepts_the_cli_harnesses() -> None:
    policy = RotationPolicy(kind="round_robin", harnesses=("claude_code", "cli:claude_code", "cli:codex"))
    assert set(policy.schedule(6)) == {"claude_code", "cli:claude_code", "cli:codex"}
    with pytest.raises(ValueError):
        RotationPolicy(harnesses=("cli:nope",))


def test_effort_maps_to_each_clis_own_setting() -> None:
    claude, codex = cli_profile("cli:claude_code"), cli_profile("cli:codex")
    argv = shlex.split(claude.command("do it; rm -rf / 'x'", "max", 7))
    assert argv[argv.index("--effort") + 1] == "max" and argv[argv.index("--max-turns") + 1] == "7"
    assert argv[argv.index("-p") + 1] == "do it; rm -rf / 'x'"  # the instruction is one argument, never shell
    assert "model_reasoning_effort=xhigh" in shlex.split(codex.command("x", "max", 7))
    assert "model_reasoning_effort=low" in shlex.split(codex.command("x", "low", 7))
    assert claude.env("t")["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert 'wire_api = "responses"' in next(iter(codex.setup_files("t").values()))


def test_final_messages_are_read_from_the_json_output() -> None:
    claude, codex = cli_profile("cli:claude_code"), cli_profile("cli:codex")
    out = "\n".join([json.dumps({"type": "assistant"}), "not json", json.dumps({"type": "result", "result": "42"})])
    assert claude.final_message(out) == "42"
    items = [{"type": "item.completed", "item": {"type": "agent_message", "text": "first"}},
             {"type": "item.completed", "item": {"type": "command_execution"}},
             {"type": "item.completed", "item": {"type": "agent_message", "text": "last"}}]
    assert codex.final_message("\n".join(json.dumps(i) for i in items)) == "last"
    assert codex.final_message("garbage\n[1,2]") is None


def test_kimi_is_named_but_says_why_it_cannot_run() -> None:
    with pytest.raises(CliUnavailable, match="Python >= 3.12"):
        cli_profile("cli:kimi_cli")
    assert sorted(CLI_HARNESSES) == ["cli:claude_code", "cli:codex"]
