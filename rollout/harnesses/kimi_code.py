"""The Kimi Code tool surface (Moonshot's TypeScript agent).

Claude-Code-like names, but: file tools take ``path`` (absolute, or relative
to the working directory), not ``file_path``; ``Bash.timeout`` is in
*seconds* and ``Bash`` takes a ``cwd``; ``Read`` pages with
``line_offset``/``n_lines``; ``Write`` has ``mode: overwrite | append``;
``Grep``'s count mode is ``count_matches``; the todo tool is ``TodoList``
with ``title`` and the status ``done`` (not ``completed``), and leaving
``todos`` out reads the list. Results end with a ``<system>`` note, errors are
``<system>ERROR: ...</system>``. The result formatters here are shared with
the legacy ``kimi_cli`` surface.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from agentenv.intents import Intent, IntentResult
from rollout.harnesses.base import BaseHarness, FromIntent, Tool, UnsupportedIntent, obj, prop, shell_string
from rollout.harnesses.formatting import items, numbered, shell_output

SYSTEM_PROMPT = """\
You are Kimi Code, an AI coding agent created by Moonshot AI, working in a sandboxed Linux workspace.
Your working directory is {workdir}. There is no network access and no user to ask.

Work step by step: explore with Glob, Grep and Read, change files with Edit or Write, and verify with Bash
(run the tests). Keep a todo list for multi-step work. When the task is finished, answer with a short summary
and no tool call."""

KIMI_STATUS = {"pending": "pending", "in_progress": "in_progress", "done": "completed"}
EFFORT_TEXT = {
    "low": "Thinking effort: low. Keep your reasoning short.",
    "high": "Thinking effort: high. Reason carefully before acting.",
    "max": "Thinking effort: max. Take all the reasoning you need.",
}


def grep_args(a: Mapping[str, Any]) -> dict[str, Any]:
    """Kimi Grep arguments -> canonical grep arguments (shared by both Kimi surfaces)."""
    mode = a.get("output_mode") or "files_with_matches"
    args: dict[str, Any] = {
        "pattern": a["pattern"],
        "output_mode": "count" if mode == "count_matches" else mode,
        "ignore_case": bool(a.get("-i")),
        "line_numbers": bool(a.get("-n", True)),
        "context": a.get("-C") or 0,
        "multiline": bool(a.get("multiline")),
        "head_limit": a.get("head_limit") or 250,
        "offset": a.get("offset") or 0,
    }
    for key, canon in (("path", "path"), ("glob", "glob"), ("type", "type"), ("-A", "context_after"), ("-B", "context_before")):
        if a.get(key) is not None:
            args[canon] = a[key]
    return args


def todo_intent(a: Mapping[str, Any]) -> Intent:
    todos = a.get("todos")
    if todos is None:
        return Intent("plan_update", {"items": None})
    return Intent("plan_update", {"items": [{"text": t["title"], "status": KIMI_STATUS[t["status"]]} for t in todos]})


def fmt_shell(r: IntentResult) -> str:
    text = shell_output(r)
    if r.timed_out:
        note = f"Command killed by timeout ({r.data.get('timeout_s', 0):g}s)"
    elif r.exit_code:
        note = f"Command failed with exit code: {r.exit_code}"
    else:
        note = "Command executed successfully."
    return f"{text}\n<system>{note}</system>".lstrip("\n")


def fmt_read(r: IntentResult) -> str:
    lines = r.data.get("lines", [])
    start = int(r.data.get("start", 1))
    note = f"{len(lines)} lines read from file starting from line {start}."
    if r.truncated:
        total = r.data.get("total_lines")
        note += f" The file has {total} lines in total." if total is not None else f" The file ({r.data.get('size')} bytes) has more lines."
    return f"{numbered(lines, start)}\n<system>{note}</system>".lstrip("\n")


def fmt_write(r: IntentResult) -> str:
    verb = "appended to" if r.data.get("append") else "written to"
    return f"<system>File successfully {verb} {r.data.get('path')} ({r.data.get('bytes')} bytes).</system>"


def fmt_edit(r: IntentResult) -> str:
    n = r.data.get("replacements", 0)
    return f"<system>File successfully edited. Applied {n} replacement{'s' if n != 1 else ''}.</system>"


def fmt_list(r: IntentResult) -> str:
    found = items(r)
    if not found:
        return "<system>No matches found.</system>"
    more = " Results were truncated; narrow the pattern or use offset." if r.truncated else ""
    return "\n".join(found) + f"\n<system>{len(found)} results.{more}</system>"


def fmt_todo(r: IntentResult) -> str:
    if not r.data.get("updated"):
        plan = r.data.get("items", [])
        back = {v: k for k, v in KIMI_STATUS.items()}
        return "\n".join(f"- [{back.get(i['status'], i['status'])}] {i['text']}" for i in plan) or "<system>The todo list is empty.</system>"
    return "<system>Todo list updated.</system>"


# ---------------------------------------------------------------- the inverse (from_intent), shared with kimi_cli


def whole_seconds(value: Any, high: int) -> int | None:
    """Canonical seconds as Kimi's whole-second timeout in [1, high] (rounded up); ``None`` keeps the default."""
    if value is None:
        return None
    return int(min(max(-(-float(value) // 1), 1), high))


def read_args(a: Mapping[str, Any]) -> dict[str, Any]:
    limit = a.get("limit")
    return {"path": a["path"], "line_offset": a.get("offset"), "n_lines": None if limit is None else min(max(int(limit), 1), 1000)}


def write_args(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"path": a["path"], "content": a["content"], "mode": "append" if a.get("append") else "overwrite"}


def from_grep(a: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical grep arguments -> Kimi Grep arguments (inverse of ``grep_args``)."""
    mode = a.get("output_mode")
    args: dict[str, Any] = {
        "pattern": a["pattern"],
        "output_mode": "count_matches" if mode == "count" else mode,
        "-i": bool(a.get("ignore_case")),
        "-n": bool(a.get("line_numbers", True)),
        "-C": a.get("context") or None,
        "multiline": bool(a.get("multiline")),
        "head_limit": a.get("head_limit"),
        "offset": a.get("offset"),
    }
    for canon, key in (("path", "path"), ("glob", "glob"), ("type", "type"), ("context_after", "-A"), ("context_before", "-B")):
        args[key] = a.get(canon)
    return args


def from_todo(a: Mapping[str, Any]) -> dict[str, Any]:
    items = a.get("items")
    back = {v: k for k, v in KIMI_STATUS.items()}
    return {} if items is None else {"todos": [{"title": i["text"], "status": back[i["status"]]} for i in items]}


def _from_exec(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    return "Bash", {"command": shell_string(a.get("command", "")), "timeout": whole_seconds(a.get("timeout_s"), 300), "cwd": a.get("cwd")}


def _from_edit(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if "edits" in a:
        raise UnsupportedIntent("Kimi Code's Edit makes one replacement per call")
    return "Edit", {"path": a["path"], "old_string": a["old"], "new_string": a["new"], "replace_all": bool(a.get("replace_all"))}


def kimi_grep_schema(count_mode: str = "count_matches") -> dict[str, Any]:
    return obj(
        ["pattern"],
        pattern=prop("string", "The regular expression pattern to search for"),
        path=prop("string", "File or directory to search in (default: working directory)"),
        glob=prop("string", "Glob pattern to filter files, e.g. *.py"),
        type=prop("string", "File type to search, e.g. py, js"),
        output_mode=prop("string", f"content, files_with_matches (default) or {count_mode}", enum=["content", "files_with_matches", count_mode]),
        **{
            "-i": prop("boolean", "Case insensitive search"),
            "-n": prop("boolean", "Show line numbers"),
            "-A": prop("integer", "Lines after each match", minimum=0),
            "-B": prop("integer", "Lines before each match", minimum=0),
            "-C": prop("integer", "Lines around each match", minimum=0),
        },
        head_limit=prop("integer", "Limit output to the first N results (default 250)", minimum=1),
        offset=prop("integer", "Skip the first N results", minimum=0),
        multiline=prop("boolean", "Let patterns span lines"),
        include_ignored=prop("boolean", "Also search ignored files"),
    )


def kimi_todo_schema() -> dict[str, Any]:
    return obj(
        todos=prop(
            "array",
            "The full todo list; leave it out to read the current list",
            items=obj(["title", "status"], title=prop("string", "Todo title"), status=prop("string", "pending, in_progress or done", enum=["pending", "in_progress", "done"])),
        )
    )


class KimiCodeHarness(BaseHarness):
    """Bash, Read, Write, Edit, Glob, Grep, TodoList -- Kimi Code's names and shapes."""

    name = "kimi_code"
    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    call_id_prefix: ClassVar[str] = "tool_"
    tools: ClassVar[tuple[Tool, ...]] = (
        Tool(
            "Bash",
            "Execute a shell command. Timeout is in seconds.",
            obj(
                ["command"],
                command=prop("string", "The bash command to execute"),
                cwd=prop("string", "Working directory for the command"),
                timeout=prop("integer", "Timeout in seconds (default 60, max 300)", minimum=1, maximum=300),
                description=prop("string", "Short description of the command"),
                run_in_background=prop("boolean", "Run in the background"),
                disable_timeout=prop("boolean", "Disable the timeout"),
            ),
            lambda a: "run_in_background is not available in this environment"
            if a.get("run_in_background")
            else Intent("exec_shell", {"command": a["command"], "timeout_s": 300 if a.get("disable_timeout") else a.get("timeout") or 60, **({"cwd": a["cwd"]} if a.get("cwd") else {})}),
            fmt_shell,
        ),
        Tool(
            "Read",
            "Read a text file. Lines are numbered from 1; page with line_offset and n_lines.",
            obj(
                ["path"],
                path=prop("string", "Path of the file to read"),
                line_offset=prop("integer", "1-based line to start from; negative counts from the end"),
                n_lines=prop("integer", "Number of lines to read (max 1000)", minimum=1, maximum=1000),
            ),
            lambda a: Intent("read_file", {"path": a["path"], "offset": a.get("line_offset") or 1, "limit": a.get("n_lines") or 1000}),
            fmt_read,
        ),
        Tool(
            "Write",
            "Write content to a file, overwriting it or appending to it.",
            obj(["path", "content"], path=prop("string", "Path of the file"), content=prop("string", "Content to write"), mode=prop("string", "overwrite (default) or append", enum=["overwrite", "append"])),
            lambda a: Intent("write_file", {"path": a["path"], "content": a["content"], "append": a.get("mode") == "append"}),
            fmt_write,
        ),
        Tool(
            "Edit",
            "Replace an exact string in a file; old_string must be unique unless replace_all is set.",
            obj(
                ["path", "old_string", "new_string"],
                path=prop("string", "Path of the file"),
                old_string=prop("string", "Exact text to replace"),
                new_string=prop("string", "Replacement text"),
                replace_all=prop("boolean", "Replace every occurrence"),
            ),
            lambda a: Intent("edit_replace", {"path": a["path"], "old": a["old_string"], "new": a["new_string"], "replace_all": bool(a.get("replace_all"))}),
            fmt_edit,
        ),
        Tool(
            "Glob",
            "Find files by glob pattern, e.g. src/**/*.py.",
            obj(["pattern"], pattern=prop("string", "Glob pattern"), path=prop("string", "Directory to search from"), include_ignored=prop("boolean", "Include ignored files")),
            lambda a: Intent("glob", {"pattern": a["pattern"], **({"path": a["path"]} if a.get("path") else {})}),
            fmt_list,
        ),
        Tool("Grep", "Search file contents with a regular expression.", kimi_grep_schema(), lambda a: Intent("grep", grep_args(a)), fmt_list),
        Tool("TodoList", "Set the todo list, or read it when todos is omitted.", kimi_todo_schema(), todo_intent, fmt_todo),
    )

    reverse: ClassVar[Mapping[str, FromIntent]] = {
        "exec_shell": _from_exec,
        "read_file": lambda a: ("Read", read_args(a)),
        "write_file": lambda a: ("Write", write_args(a)),
        "edit_replace": _from_edit,
        "glob": lambda a: ("Glob", {"pattern": a["pattern"], "path": a.get("path") or None}),
        "grep": lambda a: ("Grep", from_grep(a)),
        "plan_update": lambda a: ("TodoList", from_todo(a)),
    }

    def effort_text(self, effort: str) -> str:
        return EFFORT_TEXT[effort]

    def error_text(self, message: str) -> str:
        return f"<system>ERROR: {message}</system>"
