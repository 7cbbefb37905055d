"""How each native program (real CLI) is started and read back (no Docker): command lines, effort mapping, final messages."""

from __future__ import annotations

import json
import shlex

import pytest

from rollout.attempt import EpisodeRequest
from rollout.harnesses import canonical_harness, is_native_harness
from rollout.harnesses.native import NATIVE_HARNESSES, NativeUnavailable, native_profile
from rollout.harnesses.rotation import RotationPolicy

pytestmark = pytest.mark.unit


def test_the_rotation_accepts_the_native_harnesses() -> None:
    policy = RotationPolicy(kind="round_robin", harnesses=("claude_code", "native:claude_code", "native:codex", "native:kimi_cli"))
    assert set(policy.schedule(8)) == {"claude_code", "native:claude_code", "native:codex", "native:kimi_cli"}
    with pytest.raises(ValueError):
        RotationPolicy(harnesses=("native:nope",))


def test_the_older_cli_prefix_is_an_alias_normalised_on_load() -> None:
    policy = RotationPolicy.model_validate({"kind": "round_robin", "harnesses": ["codex", "cli:codex", "cli:kimi_cli"]})
    assert policy.harnesses == ("codex", "native:codex", "native:kimi_cli")
    assert set(policy.schedule(6)) == {"codex", "native:codex", "native:kimi_cli"}
    with pytest.raises(ValueError, match="native:nope"):
        RotationPolicy(harnesses=("cli:nope",))
    assert native_profile("cli:codex") is native_profile("native:codex")
    assert canonical_harness("cli:claude_code") == "native:claude_code" and canonical_harness("codex") == "codex"
    assert is_native_harness("cli:codex") and is_native_harness("native:codex") and not is_native_harness("codex")
    assert EpisodeRequest("e", "r", "t", 0, "cli:codex").harness == "native:codex"  # recorded under its one name


def test_effort_maps_to_each_programs_own_setting() -> None:
    claude, codex = native_profile("native:claude_code"), native_profile("native:codex")
    argv = shlex.split(claude.command("do it; rm -rf / 'x'", "max", 7))
    assert argv[argv.index("--effort") + 1] == "max" and argv[argv.index("--max-turns") + 1] == "7"
    assert argv[argv.index("-p") + 1] == "do it; rm -rf / 'x'"  # the instruction is one argument, never shell
    assert "model_reasoning_effort=xhigh" in shlex.split(codex.command("x", "max", 7))
    assert "model_reasoning_effort=low" in shlex.split(codex.command("x", "low", 7))
    assert claude.env("t")["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert 'wire_api = "responses"' in next(iter(codex.setup_files("t").values()))


def test_final_messages_are_read_from_the_json_output() -> None:
    claude, codex = native_profile("native:claude_code"), native_profile("native:codex")
    out = "\n".join([json.dumps({"type": "assistant"}), "not json", json.dumps({"type": "result", "result": "42"})])
    assert claude.final_message(out) == "42"
    items = [{"type": "item.completed", "item": {"type": "agent_message", "text": "first"}},
             {"type": "item.completed", "item": {"type": "command_execution"}},
             {"type": "item.completed", "item": {"type": "agent_message", "text": "last"}}]
    assert codex.final_message("\n".join(json.dumps(i) for i in items)) == "last"
    assert codex.final_message("garbage\n[1,2]") is None


def test_kimi_runs_print_mode_against_the_gateway_with_thinking_as_its_effort() -> None:
    kimi = native_profile("native:kimi_cli")
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


def test_every_native_harness_is_known_and_an_unknown_one_says_which_are() -> None:
    assert sorted(NATIVE_HARNESSES) == ["native:claude_code", "native:codex", "native:kimi_cli"]
    with pytest.raises(NativeUnavailable, match="native:kimi_cli"):
        native_profile("native:kimi")
