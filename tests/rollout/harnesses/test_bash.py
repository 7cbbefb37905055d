"""The minimal bash harness: render, parse, map, format."""

from __future__ import annotations

import pytest

from agentenv.intents import Harness, Intent, IntentResult
from rollout.harnesses import UnknownHarness, get_harness, list_harnesses

pytestmark = pytest.mark.unit


def test_registry_names_every_builtin() -> None:
    assert {"bash", "claude_code", "codex", "kimi_code", "kimi_cli"} <= set(list_harnesses())
    assert isinstance(get_harness("bash"), Harness)
    with pytest.raises(UnknownHarness, match="did you mean 'bash'"):
        get_harness("bsah")


def test_render_states_effort_before_the_instruction() -> None:
    p = get_harness("bash").render("do it", effort="max")
    assert [m["role"] for m in p.messages] == ["system", "system", "user"]
    assert "max" in p.messages[1]["content"] and p.messages[2]["content"] == "do it"
    with pytest.raises(ValueError, match="effort"):
        get_harness("bash").render("x", effort="medium")


def test_parse_text_and_openai_forms_agree() -> None:
    h = get_harness("bash")
    text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls", "timeout": 5}}\n</tool_call>'
    msg = {"content": None, "tool_calls": [{"id": "c1", "type": "function",
                                            "function": {"name": "bash", "arguments": '{"command": "ls", "timeout": 5}'}}]}
    for out in (text, msg):
        turn = h.parse(out)
        assert not turn.errors and len(turn.calls) == 1
        intent = h.to_intent(turn.calls[0])
        assert isinstance(intent, Intent) and intent.args == {"command": "ls", "timeout_s": 5} and intent.tool == "bash"


def test_text_turn_does_not_submit_but_submit_tool_does() -> None:
    h = get_harness("bash")
    assert h.turn_intents(h.parse("I am thinking")) == []
    (intent,) = h.turn_intents(h.parse('<tool_call>{"name": "submit", "arguments": {"answer": "7"}}</tool_call>'))
    assert isinstance(intent, Intent) and intent.name == "submit" and intent.args["answer"] == "7"


def test_format_result_and_error() -> None:
    h = get_harness("bash")
    intent = Intent("exec_shell", {"command": "false"}, call_id="c1", tool="bash")
    msg = h.format_result(IntentResult(intent, ok=False, output="oops\n", exit_code=1))
    assert msg["role"] == "tool" and msg["tool_call_id"] == "c1" and msg["content"] == "oops\n[exit code 1]"
    turn = h.parse('<tool_call>{"name": "bash", "arguments": {"command": 3}}</tool_call>')
    assert h.format_error(turn.errors[0])["content"] == "error: bash: command must be string, got integer"
