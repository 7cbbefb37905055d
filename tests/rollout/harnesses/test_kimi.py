"""Kimi Code and kimi-cli: seconds, path (not file_path), done (not completed), count_matches."""

from __future__ import annotations

import pytest
from episodes import fake_result

from agentenv.intents import Intent, ParseError, ToolCall
from rollout.harnesses import get_harness

pytestmark = pytest.mark.unit
CODE, CLI = get_harness("kimi_code"), get_harness("kimi_cli")


def intent(h: object, name: str, **args: object) -> Intent:
    out = h.to_intent(ToolCall(name, args, "tool_1"))  # type: ignore[attr-defined]
    assert isinstance(out, Intent), out
    return out


def test_kimi_code_surface() -> None:
    assert intent(CODE, "Bash", command="ls", timeout=30, cwd="/w").args == {"command": "ls", "timeout_s": 30, "cwd": "/w"}
    assert intent(CODE, "Read", path="a", line_offset=-5, n_lines=5).args == {"path": "a", "offset": -5, "limit": 5}
    assert intent(CODE, "Write", path="a", content="x", mode="append").args["append"] is True
    assert intent(CODE, "Grep", pattern="p", output_mode="count_matches").args["output_mode"] == "count"
    assert intent(CODE, "TodoList", todos=[{"title": "t", "status": "done"}]).args["items"] == [{"text": "t", "status": "completed"}]
    assert intent(CODE, "TodoList").args == {"items": None}
    bad = CODE.to_intent(ToolCall("Read", {"file_path": "/a"}))
    assert isinstance(bad, ParseError) and "missing required argument 'path' (got unexpected 'file_path')" in bad.message


def test_kimi_cli_surface() -> None:
    assert intent(CLI, "Shell", command="ls").args == {"command": "ls", "timeout_s": 60}
    one = intent(CLI, "StrReplaceFile", path="a", edit={"old": "x", "new": "y"})
    many = intent(CLI, "StrReplaceFile", path="a", edit=[{"old": "x", "new": "y"}, {"old": "y", "new": "z", "replace_all": True}])
    assert one.args["edits"] == [{"old": "x", "new": "y", "replace_all": False}] and len(many.args["edits"]) == 2
    assert intent(CLI, "Glob", pattern="*.py", directory="/w").args == {"pattern": "*.py", "path": "/w"}
    bad = CLI.to_intent(ToolCall("StrReplaceFile", {"path": "a", "edit": "x"}))
    assert isinstance(bad, ParseError)


def test_kimi_style_results_and_errors() -> None:
    shell = CODE.format_result(fake_result(intent(CODE, "Bash", command="ls")))
    assert shell["content"] == "a.py\n<system>Command executed successfully.</system>"
    read = CLI.format_result(fake_result(intent(CLI, "ReadFile", path="a.py")))
    assert read["content"].startswith("     1\tx = 1") and "lines read from file starting from line 1" in read["content"]
    err = CLI.format_error(CLI.parse('<tool_call>{"name": "ReadFile", "arguments": {}}</tool_call>').errors[0])
    assert err["content"] == "<system>ERROR: ReadFile: missing required argument 'path'</system>"
