"""Claude Code: ms timeouts, absolute file_path, cat -n Read, tool_use_error style."""

from __future__ import annotations

import pytest
from episodes import fake_result

from agentenv.intents import Intent, IntentResult, ParseError, ToolCall
from rollout.harnesses import get_harness

pytestmark = pytest.mark.unit
H = get_harness("claude_code")


def intent(name: str, **args: object) -> Intent:
    out = H.to_intent(ToolCall(name, args, "toolu_1"))
    assert isinstance(out, Intent), out
    return out


def test_units_and_names_map_onto_canonical_args() -> None:
    assert intent("Bash", command="ls", timeout=1500).args == {"command": "ls", "timeout_s": 1.5}
    assert intent("Read", file_path="/w/a.py", offset=3, limit=2).args == {"path": "/w/a.py", "offset": 3, "limit": 2}
    e = intent("MultiEdit", file_path="/w/a", edits=[{"old_string": "a", "new_string": "b", "replace_all": True}])
    assert e.args["edits"] == [{"old": "a", "new": "b", "replace_all": True}]
    g = intent("Grep", pattern="x", **{"-i": True, "-C": 2}, output_mode="count")
    assert g.args["ignore_case"] and g.args["context"] == 2 and g.args["output_mode"] == "count"
    t = intent("TodoWrite", todos=[{"content": "a", "status": "completed", "activeForm": "doing a"}])
    assert t.args["items"] == [{"text": "a", "status": "completed"}]


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("Read", {"file_path": "a.py"}, "absolute"),
        ("Bash", {"command": "ls", "timeout": 700000}, "<= 600000"),
        ("Edit", {"file_path": "/a", "old_string": "x"}, "missing required argument 'new_string'"),
        ("TodoWrite", {"todos": [{"content": "a", "status": "done", "activeForm": "x"}]}, "must be one of"),
        ("Grep", {"pattern": "x", "output_mode": "count_matches"}, "must be one of"),
        ("Bash", {"command": "sleep 9", "run_in_background": True}, "foreground"),
        ("Bash", {"cmd": "ls"}, "missing required argument 'command'"),
    ],
)
def test_bad_calls_are_parse_errors(name: str, args: dict[str, object], message: str) -> None:
    out = H.to_intent(ToolCall(name, args, "toolu_1"))
    assert isinstance(out, ParseError) and message in out.message and out.call_id == "toolu_1"
    assert H.format_error(out)["content"].startswith("<tool_use_error>")


def test_read_is_numbered_like_cat_n() -> None:
    msg = H.format_result(fake_result(intent("Read", file_path="/workspace/a.py")))
    assert msg["content"] == "     1\tx = 1\n     2\tprint(x)"


def test_bash_and_failure_styles() -> None:
    bash = intent("Bash", command="false")
    msg = H.format_result(IntentResult(bash, ok=False, output="boom", exit_code=2, data={"stdout": "boom", "stderr": ""}))
    assert msg["content"] == "boom\nExit code 2"
    edit = intent("Edit", file_path="/a", old_string="x", new_string="y")
    err = H.format_result(IntentResult(edit, ok=False, error="old string occurs 2 times"))
    assert err["content"] == "<tool_use_error>old string occurs 2 times</tool_use_error>"


def test_text_only_turn_submits_and_effort_is_a_system_reminder() -> None:
    (sub,) = H.turn_intents(H.parse("All done."))
    assert isinstance(sub, Intent) and sub.name == "submit" and sub.args["answer"] == "All done."
    assert H.render("x", "max").messages[1]["content"].startswith("<system-reminder>")
