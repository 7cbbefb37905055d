"""Codex: argv lists, timeout_ms, apply_patch grammar at parse time, update_plan."""

from __future__ import annotations

import json

import pytest

from agentenv.intents import Intent, IntentResult, ParseError, ToolCall
from rollout.harnesses import get_harness

pytestmark = pytest.mark.unit
H = get_harness("codex")
PATCH = "*** Begin Patch\n*** Add File: x.py\n+x = 1\n*** End Patch"


def test_shell_is_an_argv_list_in_milliseconds() -> None:
    out = H.to_intent(ToolCall("shell", {"command": ["bash", "-lc", "ls"], "workdir": "/w", "timeout_ms": 2500}))
    assert isinstance(out, Intent) and out.args == {"command": ["bash", "-lc", "ls"], "timeout_s": 2.5, "cwd": "/w"}
    bad = H.to_intent(ToolCall("shell", {"command": "ls"}))
    assert isinstance(bad, ParseError) and "command must be array, got string" in bad.message


def test_apply_patch_as_tool_freeform_and_through_shell() -> None:
    for call in (ToolCall("apply_patch", {"input": PATCH}), ToolCall("shell", {"command": ["apply_patch", PATCH]})):
        out = H.to_intent(call)
        assert isinstance(out, Intent) and out.name == "apply_patch" and out.args["patch"] == PATCH
    turn = H.parse({"tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "apply_patch", "input": PATCH}}]})
    assert len(turn.calls) == 1 and not turn.errors


def test_unparseable_patch_is_a_format_error_naming_the_line() -> None:
    turn = H.parse('<tool_call>{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\\n*** Add File: /abs\\n+x\\n*** End Patch"}}</tool_call>')
    assert not turn.calls and "patch line 2" in turn.errors[0].message and "absolute" in turn.errors[0].message


def test_update_plan_allows_one_in_progress() -> None:
    plan = [{"step": "a", "status": "in_progress"}, {"step": "b", "status": "in_progress"}]
    assert isinstance(H.to_intent(ToolCall("update_plan", {"plan": plan})), ParseError)
    ok = H.to_intent(ToolCall("update_plan", {"explanation": "why", "plan": plan[:1]}))
    assert isinstance(ok, Intent) and ok.args == {"items": [{"text": "a", "status": "in_progress"}], "explanation": "why"}


def test_shell_result_reports_exit_code_and_wall_time() -> None:
    call = H.to_intent(ToolCall("shell", {"command": ["ls"]}, "call_1"))
    assert isinstance(call, Intent)
    msg = H.format_result(IntentResult(call, ok=True, output="a\n", exit_code=0, data={"stdout": "a\n", "stderr": "", "duration_s": 0.25}))
    assert msg["content"] == "Exit code: 0\nWall time: 0.2 seconds\nOutput:\na" or msg["content"].startswith("Exit code: 0\nWall time: 0.")
    assert json.dumps(H.render("t", "low").tools)  # schemas are JSON
