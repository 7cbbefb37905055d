"""How each real CLI is started and read back (no Docker): command lines, effort mapping, final messages."""

from __future__ import annotations

import json
import shlex

import pytest

from rollout.harnesses.cli import CLI_HARNESSES, CliUnavailable, cli_profile
from rollout.harnesses.rotation import RotationPolicy

pytestmark = pytest.mark.unit


def test_the_rotation_accepts_the_cli_harnesses() -> None:
    policy = RotationPolicy(kind="round_robin", harnesses=("claude_code", "cli:claude_code", "cli:codex", "cli:kimi_cli"))
    assert set(policy.schedule(8)) == {"claude_code", "cli:claude_code", "cli:codex", "cli:kimi_cli"}
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


def test_kimi_runs_print_mode_against_the_gateway_with_thinking_as_its_effort() -> None:
    kimi = cli_profile("cli:kimi_cli")
    argv = shlex.split(kimi.command("fix it; echo 'x'", "high", 9))
    assert argv[argv.index("-p") + 1] == "fix it; echo 'x'" and "--print" in argv and "--yolo" in argv
    assert argv[argv.index("--output-format") + 1] == "stream-json" and argv[argv.index("--max-steps-per-turn") + 1] == "9"
    assert "--thinking" in argv and "--no-thinking" in shlex.split(kimi.command("x", "low", 9))
    ((path, text),) = kimi.setup_files("tok").items()
    config = json.loads(text)
    assert argv[argv.index("--config-file") + 1] == path and config["telemetry"] is False
    provider = config["providers"][config["models"][config["default_model"]]["provider"]]
    assert provider["type"] == "openai_legacy" and provider["base_url"].startswith("http://127.0.0.1:") and provider["api_key"] == "tok"
    assert kimi.env("tok")["KIMI_DISABLE_TELEMETRY"] == "1"
    out = [{"role": "assistant", "content": [{"type": "think", "think": "hm"}], "tool_calls": [{"id": "call_1"}]},
           {"role": "tool", "content": "42"}, {"role": "assistant", "content": [{"type": "think", "think": "so"}, {"type": "text", "text": "42"}]}]
    assert kimi.final_message("\n".join(json.dumps(o) for o in out)) == "42"
    assert kimi.final_message(json.dumps({"role": "assistant", "content": "plain"})) == "plain"


def test_every_cli_harness_is_known_and_an_unknown_one_says_which_are() -> None:
    assert sorted(CLI_HARNESSES) == ["cli:claude_code", "cli:codex", "cli:kimi_cli"]
    with pytest.raises(CliUnavailable, match="cli:kimi_cli"):
        cli_profile("cli:kimi")
