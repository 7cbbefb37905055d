"""The legacy Python ``kimi-cli`` surface -- and the worked example of adding a harness.

It reuses Kimi Code's result formatters and error style; only the tool table
differs: ``Shell`` (timeout in seconds), ``ReadFile{path, line_offset,
n_lines}``, ``WriteFile{path, content, mode}``, ``StrReplaceFile{path, edit}``
where ``edit`` is one ``{old, new, replace_all}`` or a list of them (applied in
order), ``Glob{pattern, directory}``, ``Grep`` (count mode ``count_matches``)
and ``SetTodoList{todos[{title, status: pending|in_progress|done}]}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from agentenv.intents import Intent
from rollout.harnesses.base import BaseHarness, FromIntent, Tool, obj, prop, shell_string
from rollout.harnesses.kimi_code import (
    EFFORT_TEXT,
    fmt_edit,
    fmt_list,
    fmt_read,
    fmt_shell,
    fmt_todo,
    fmt_write,
    from_grep,
    from_todo,
    grep_args,
    kimi_grep_schema,
    kimi_todo_schema,
    read_args,
    todo_intent,
    whole_seconds,
    write_args,
)

SYSTEM_PROMPT = """\
You are Kimi CLI, an interactive agent created by Moonshot AI that helps with software engineering tasks.
You are working in a sandboxed Linux environment; the working directory is {workdir}. There is no network.

Use the tools to inspect and change the workspace: Shell to run commands, ReadFile/WriteFile/StrReplaceFile
for files, Glob and Grep to search, SetTodoList to track multi-step work. Verify changes by running them.
When you have finished, reply with a short summary and do not call any tool."""

_EDIT = obj(["old", "new"], old=prop("string", "The old string to replace"), new=prop("string", "The new string"), replace_all=prop("boolean", "Replace all occurrences"))


def _str_replace(a: Mapping[str, Any]) -> Intent:
    edits = a["edit"] if isinstance(a["edit"], list) else [a["edit"]]
    return Intent("edit_replace", {"path": a["path"], "edits": [{"old": e["old"], "new": e["new"], "replace_all": bool(e.get("replace_all"))} for e in edits]})


def _from_edit(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    edits = a["edits"] if "edits" in a else [a]
    return "StrReplaceFile", {"path": a["path"], "edit": [{"old": e["old"], "new": e["new"], "replace_all": bool(e.get("replace_all"))} for e in edits]}


class KimiCliHarness(BaseHarness):
    """Shell, ReadFile, WriteFile, StrReplaceFile, Glob, Grep, SetTodoList."""

    name = "kimi_cli"
    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    call_id_prefix: ClassVar[str] = "tool_"
    tools: ClassVar[tuple[Tool, ...]] = (
        Tool(
            "Shell",
            "Execute a shell command. The timeout is in seconds.",
            obj(["command"], command=prop("string", "The shell command to execute"), timeout=prop("integer", "Timeout in seconds (default 60, max 300)", minimum=1, maximum=300)),
            lambda a: Intent("exec_shell", {"command": a["command"], "timeout_s": a.get("timeout") or 60}),
            fmt_shell,
        ),
        Tool(
            "ReadFile",
            "Read a text file; lines are numbered from 1.",
            obj(
                ["path"],
                path=prop("string", "The path of the file to read"),
                line_offset=prop("integer", "The line number to start reading from (1-based; negative reads from the end)"),
                n_lines=prop("integer", "The number of lines to read (max 1000)", minimum=1, maximum=1000),
            ),
            lambda a: Intent("read_file", {"path": a["path"], "offset": a.get("line_offset") or 1, "limit": a.get("n_lines") or 1000}),
            fmt_read,
        ),
        Tool(
            "WriteFile",
            "Write content to a file (overwrite or append).",
            obj(["path", "content"], path=prop("string", "The path of the file"), content=prop("string", "The content"), mode=prop("string", "overwrite or append", enum=["overwrite", "append"])),
            lambda a: Intent("write_file", {"path": a["path"], "content": a["content"], "append": a.get("mode") == "append"}),
            fmt_write,
        ),
        Tool(
            "StrReplaceFile",
            "Replace strings in a file. edit is one {old, new, replace_all} or a list of them, applied in order.",
            obj(["path", "edit"], path=prop("string", "The path of the file"), edit={"anyOf": [_EDIT, {"type": "array", "items": _EDIT, "minItems": 1}], "description": "The edit(s) to apply"}),
            _str_replace,
            fmt_edit,
        ),
        Tool(
            "Glob",
            "Find files and directories by glob pattern.",
            obj(["pattern"], pattern=prop("string", "Glob pattern"), directory=prop("string", "Directory to search in"), include_dirs=prop("boolean", "Include directories")),
            lambda a: Intent("glob", {"pattern": a["pattern"], **({"path": a["directory"]} if a.get("directory") else {})}),
            fmt_list,
        ),
        Tool("Grep", "Search file contents with a regular expression.", kimi_grep_schema(), lambda a: Intent("grep", grep_args(a)), fmt_list),
        Tool("SetTodoList", "Set the todo list, or read it when todos is omitted.", kimi_todo_schema(), todo_intent, fmt_todo),
    )

    reverse: ClassVar[Mapping[str, FromIntent]] = {
        "exec_shell": lambda a: ("Shell", {"command": shell_string(a.get("command", ""), a.get("cwd")), "timeout": whole_seconds(a.get("timeout_s"), 300)}),
        "read_file": lambda a: ("ReadFile", read_args(a)),
        "write_file": lambda a: ("WriteFile", write_args(a)),
        "edit_replace": _from_edit,
        "glob": lambda a: ("Glob", {"pattern": a["pattern"], "directory": a.get("path") or None}),
        "grep": lambda a: ("Grep", from_grep(a)),
        "plan_update": lambda a: ("SetTodoList", from_todo(a)),
    }

    def effort_text(self, effort: str) -> str:
        return EFFORT_TEXT[effort]

    def error_text(self, message: str) -> str:
        return f"<system>ERROR: {message}</system>"
