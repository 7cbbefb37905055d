"""Scripted multi-turn episodes per harness, shared by the rendering and harness tests."""

from __future__ import annotations

import json
from typing import Any

from agentenv.intents import Intent, IntentResult

# (tool name, arguments, canonical intent name) per turn; every harness gets three tool turns.
SCRIPTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "bash": [("bash", {"command": "ls"}), ("bash", {"command": "cat a.py", "timeout": 5}), ("submit", {"answer": "done"})],
    "claude_code": [
        ("Glob", {"pattern": "**/*.py"}),
        ("Read", {"file_path": "/workspace/a.py", "limit": 10}),
        ("Edit", {"file_path": "/workspace/a.py", "old_string": "x = 1", "new_string": "x = 2"}),
    ],
    "codex": [
        ("shell", {"command": ["bash", "-lc", "ls"], "workdir": "/workspace", "timeout_ms": 5000}),
        ("update_plan", {"plan": [{"step": "fix", "status": "in_progress"}]}),
        ("apply_patch", {"input": "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n*** End Patch"}),
    ],
    "kimi_code": [
        ("Bash", {"command": "ls", "timeout": 5}),
        ("Read", {"path": "a.py", "line_offset": 1, "n_lines": 5}),
        ("TodoList", {"todos": [{"title": "fix", "status": "done"}]}),
    ],
    "kimi_cli": [
        ("Shell", {"command": "ls", "timeout": 5}),
        ("StrReplaceFile", {"path": "a.py", "edit": {"old": "x = 1", "new": "x = 2"}}),
        ("SetTodoList", {"todos": [{"title": "fix", "status": "in_progress"}]}),
    ],
}


def completion_text(turn: int, name: str, args: dict[str, Any]) -> str:
    """What a model would sample under the project template (before the EOT token)."""
    call = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"<think>turn {turn}: use {name}</think>\nStep {turn}.<tool_call>\n{call}\n</tool_call>"


def fake_result(intent: Intent) -> IntentResult:
    """A plausible successful result for any intent, enough for every formatter."""
    data: dict[str, Any] = {
        "exec_shell": {"stdout": "a.py\n", "stderr": "", "duration_s": 0.01, "timeout_s": 5},
        "read_file": {"path": "/workspace/a.py", "start": 1, "lines": ["x = 1", "print(x)"], "total_lines": 2},
        "write_file": {"path": "/workspace/a.py", "bytes": 3, "created": True, "append": False},
        "edit_replace": {"path": "/workspace/a.py", "replacements": 1, "snippet_start": 1, "snippet": ["x = 2"]},
        "apply_patch": {"added": [], "modified": ["a.py"], "deleted": []},
        "glob": {"items": ["/workspace/a.py"], "truncated": False, "total": 1},
        "grep": {"items": ["/workspace/a.py"], "truncated": False, "total": 1},
        "plan_update": {"items": [{"text": "fix", "status": "completed"}], "explanation": "", "updated": True},
        "submit": {"submitted": True, "answer": "done"},
    }[intent.name]
    output = {"exec_shell": "a.py\n", "apply_patch": "Success. Updated the following files:\nM a.py"}.get(intent.name, "ok")
    return IntentResult(intent, ok=True, output=output, exit_code=0 if intent.name == "exec_shell" else None, data=data)
