"""The Claude Code tool surface (Anthropic's agent SDK tool inputs).

What sets it apart from the others: file tools take an absolute ``file_path``;
``Bash.timeout`` is in milliseconds (max 600000); ``Read`` answers with
``cat -n``-numbered lines; ``Grep`` flags are spelled like ripgrep's (``-i``,
``-n``, ``-A``, ``-B``, ``-C``) and its count mode is ``count``; ``TodoWrite``
statuses are ``pending | in_progress | completed``; errors come back inside
``<tool_use_error>`` tags; the effort level is stated in a
``<system-reminder>``. There is no submit tool: a turn without tool calls ends
the episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from agentenv.intents import Intent, IntentResult
from rollout.harnesses.base import BaseHarness, FromIntent, Tool, UnsupportedIntent, inverse_scale, obj, prop, shell_string
from rollout.harnesses.formatting import items, numbered, shell_output

SYSTEM_PROMPT = """\
You are Claude Code, an interactive command-line agent for software engineering tasks.
You work inside a sandboxed Linux workspace; there is no network and no user to ask.
Working directory: {workdir}

# Doing tasks
- Look before you change: use Glob, Grep and Read to understand the code first.
- Prefer Edit for changes to existing files and Write only for new files.
- File tools take absolute paths (the workspace is your working directory).
- Use TodoWrite to plan multi-step work and keep exactly one item in_progress.
- Verify your work by running the project's tests or the program with Bash.
- When you are done, reply with a short summary and no tool call."""

EFFORT_TEXT = {
    "low": "Reasoning effort is low: think briefly and act quickly.",
    "high": "Reasoning effort is high: think hard before each step.",
    "max": "Reasoning effort is max: think as long as you need; correctness matters most.",
}


def _abs(path: str) -> str | None:
    return None if path.startswith("/") else f"file_path must be an absolute path, got {path!r}"


def _bash(a: Mapping[str, Any]) -> Intent | str:
    if a.get("run_in_background"):
        return "run_in_background is not available in this environment; run the command in the foreground"
    return Intent("exec_shell", {"command": a["command"], "timeout_s": (a.get("timeout") or 120_000) / 1000})


def _read(a: Mapping[str, Any]) -> Intent | str:
    return _abs(a["file_path"]) or Intent("read_file", {"path": a["file_path"], "offset": a.get("offset") or 1, "limit": a.get("limit") or 2000})


def _write(a: Mapping[str, Any]) -> Intent | str:
    return _abs(a["file_path"]) or Intent("write_file", {"path": a["file_path"], "content": a["content"]})


def _edit(a: Mapping[str, Any]) -> Intent | str:
    return _abs(a["file_path"]) or Intent(
        "edit_replace",
        {"path": a["file_path"], "old": a["old_string"], "new": a["new_string"], "replace_all": bool(a.get("replace_all"))},
    )


def _multi_edit(a: Mapping[str, Any]) -> Intent | str:
    edits = [{"old": e["old_string"], "new": e["new_string"], "replace_all": bool(e.get("replace_all"))} for e in a["edits"]]
    return _abs(a["file_path"]) or Intent("edit_replace", {"path": a["file_path"], "edits": edits})


def _glob(a: Mapping[str, Any]) -> Intent:
    return Intent("glob", {"pattern": a["pattern"], **({"path": a["path"]} if a.get("path") else {})})


def _grep(a: Mapping[str, Any]) -> Intent:
    args: dict[str, Any] = {
        "pattern": a["pattern"],
        "output_mode": a.get("output_mode") or "files_with_matches",
        "ignore_case": bool(a.get("-i")),
        "line_numbers": bool(a.get("-n", True)),
        "context": a.get("-C") or 0,
        "multiline": bool(a.get("multiline")),
    }
    for key, canon in (("path", "path"), ("glob", "glob"), ("type", "type"), ("-A", "context_after"), ("-B", "context_before"), ("head_limit", "head_limit")):
        if a.get(key) is not None:
            args[canon] = a[key]
    return Intent("grep", args)


def _todo(a: Mapping[str, Any]) -> Intent | str:
    todos = a["todos"]
    if sum(t["status"] == "in_progress" for t in todos) > 1:
        return "only one todo may be in_progress at a time"
    return Intent("plan_update", {"items": [{"text": t["content"], "status": t["status"]} for t in todos]})


# ---------------------------------------------------------------- the inverse (from_intent)


def _from_exec(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    t = a.get("timeout_s")
    ms = None if t is None else min(max(inverse_scale(float(t), 1000), 1), 600_000)
    return "Bash", {"command": shell_string(a.get("command", ""), a.get("cwd")), "timeout": ms}


def _from_read(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    offset = a.get("offset")
    if offset is not None and offset < 1:
        raise UnsupportedIntent("Read cannot count lines from the end of a file")
    return "Read", {"file_path": a["path"], "offset": offset, "limit": a.get("limit")}


def _from_write(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if a.get("append"):
        raise UnsupportedIntent("Write cannot append")
    return "Write", {"file_path": a["path"], "content": a["content"]}


def _from_edit(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if "edits" in a:
        edits = [{"old_string": e["old"], "new_string": e["new"], "replace_all": bool(e.get("replace_all"))} for e in a["edits"]]
        return "MultiEdit", {"file_path": a["path"], "edits": edits}
    return "Edit", {"file_path": a["path"], "old_string": a["old"], "new_string": a["new"], "replace_all": bool(a.get("replace_all"))}


def _from_grep(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    args: dict[str, Any] = {
        "pattern": a["pattern"],
        "output_mode": a.get("output_mode"),
        "-i": bool(a.get("ignore_case")),
        "-n": bool(a.get("line_numbers", True)),
        "-C": a.get("context") or None,
        "multiline": bool(a.get("multiline")),
    }
    for canon, key in (("path", "path"), ("glob", "glob"), ("type", "type"), ("context_after", "-A"), ("context_before", "-B"), ("head_limit", "head_limit")):
        args[key] = a.get(canon)
    return "Grep", args


def _from_plan(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    items = a.get("items")
    if items is None:
        raise UnsupportedIntent("TodoWrite cannot only read the list")
    return "TodoWrite", {"todos": [{"content": i["text"], "status": i["status"], "activeForm": i["text"]} for i in items]}


def _fmt_bash(r: IntentResult) -> str:
    text = shell_output(r)
    if r.timed_out:
        text += f"\nCommand timed out after {r.data.get('timeout_s', 0) * 1000:.0f}ms"
    elif r.exit_code:
        text += f"\nExit code {r.exit_code}"
    return text.strip("\n") or "(no output)"


def _fmt_read(r: IntentResult) -> str:
    lines = r.data.get("lines", [])
    if not lines:
        return f"<system-reminder>The file {r.data.get('path')} exists but has no lines in that range.</system-reminder>"
    return numbered(lines, int(r.data.get("start", 1)))


def _fmt_write(r: IntentResult) -> str:
    path = r.data.get("path")
    return f"File created successfully at: {path}" if r.data.get("created") else f"The file {path} has been overwritten."


def _fmt_edit(r: IntentResult) -> str:
    snippet = numbered(r.data.get("snippet", []), int(r.data.get("snippet_start", 1)))
    return f"The file {r.data.get('path')} has been edited. A `cat -n` view of the edited region:\n{snippet}"


def _fmt_glob(r: IntentResult) -> str:
    found = items(r)
    if not found:
        return "No files found"
    return "\n".join(found) + ("\n(Results are truncated. Use a more specific path or pattern.)" if r.truncated else "")


def _fmt_grep(r: IntentResult) -> str:
    found = items(r)
    mode = r.intent.args.get("output_mode")
    if not found:
        return "No matches found" if mode == "content" else "No files found"
    if mode == "files_with_matches":
        return f"Found {len(found)} file{'s' if len(found) != 1 else ''}\n" + "\n".join(found)
    if mode == "count":
        total = sum(int(x.rsplit(":", 1)[1]) for x in found if x.rsplit(":", 1)[-1].isdigit())
        return "\n".join(found) + f"\n\nFound {total} total occurrences across {len(found)} files."
    return "\n".join(found)


class ClaudeCodeHarness(BaseHarness):
    """Bash, Read, Write, Edit, MultiEdit, Glob, Grep, TodoWrite -- Claude Code's names and shapes."""

    name = "claude_code"
    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    call_id_prefix: ClassVar[str] = "toolu_"
    tools: ClassVar[tuple[Tool, ...]] = (
        Tool(
            "Bash",
            "Executes a bash command with an optional timeout, in a persistent working directory.",
            obj(
                ["command"],
                command=prop("string", "The command to execute"),
                timeout=prop("number", "Optional timeout in milliseconds (max 600000)", minimum=1, maximum=600000),
                description=prop("string", "Clear, concise description of what this command does in 5-10 words"),
                run_in_background=prop("boolean", "Run the command in the background"),
            ),
            _bash,
            _fmt_bash,
        ),
        Tool(
            "Read",
            "Reads a file from the local filesystem. Lines are numbered starting at 1, as cat -n does.",
            obj(
                ["file_path"],
                file_path=prop("string", "The absolute path to the file to read"),
                offset=prop("integer", "The line number to start reading from", minimum=1),
                limit=prop("integer", "The number of lines to read", minimum=1),
            ),
            _read,
            _fmt_read,
        ),
        Tool(
            "Write",
            "Writes a file to the local filesystem, overwriting it if it exists.",
            obj(["file_path", "content"], file_path=prop("string", "The absolute path to the file to write"), content=prop("string", "The content to write to the file")),
            _write,
            _fmt_write,
        ),
        Tool(
            "Edit",
            "Performs an exact string replacement in a file. Fails if old_string is not unique unless replace_all is set.",
            obj(
                ["file_path", "old_string", "new_string"],
                file_path=prop("string", "The absolute path to the file to modify"),
                old_string=prop("string", "The text to replace"),
                new_string=prop("string", "The text to replace it with (must differ from old_string)"),
                replace_all=prop("boolean", "Replace all occurrences of old_string (default false)"),
            ),
            _edit,
            _fmt_edit,
        ),
        Tool(
            "MultiEdit",
            "Makes several Edit-style replacements to one file in order; all succeed or none are applied.",
            obj(
                ["file_path", "edits"],
                file_path=prop("string", "The absolute path to the file to modify"),
                edits=prop(
                    "array",
                    "Edits to apply in sequence",
                    minItems=1,
                    items=obj(["old_string", "new_string"], old_string=prop("string", "The text to replace"), new_string=prop("string", "The replacement"), replace_all=prop("boolean", "Replace every occurrence")),
                ),
            ),
            _multi_edit,
            _fmt_edit,
        ),
        Tool(
            "Glob",
            "Fast file pattern matching (e.g. **/*.py). Returns matching file paths.",
            obj(["pattern"], pattern=prop("string", "The glob pattern to match files against"), path=prop("string", "The directory to search in (default: working directory)")),
            _glob,
            _fmt_glob,
        ),
        Tool(
            "Grep",
            "Searches file contents with a regular expression.",
            obj(
                ["pattern"],
                pattern=prop("string", "The regular expression to search for"),
                path=prop("string", "File or directory to search in (default: working directory)"),
                glob=prop("string", "Glob pattern to filter files (e.g. *.js, *.{ts,tsx})"),
                type=prop("string", "File type to search (e.g. py, js, rust)"),
                output_mode=prop("string", "content, files_with_matches (default) or count", enum=["content", "files_with_matches", "count"]),
                **{
                    "-i": prop("boolean", "Case insensitive search"),
                    "-n": prop("boolean", "Show line numbers (content mode)"),
                    "-A": prop("integer", "Lines to show after each match (content mode)", minimum=0),
                    "-B": prop("integer", "Lines to show before each match (content mode)", minimum=0),
                    "-C": prop("integer", "Lines to show before and after each match (content mode)", minimum=0),
                },
                head_limit=prop("integer", "Limit output to the first N lines or entries", minimum=1),
                multiline=prop("boolean", "Let patterns span lines (. matches newlines)"),
            ),
            _grep,
            _fmt_grep,
        ),
        Tool(
            "TodoWrite",
            "Creates and updates the structured task list for this session.",
            obj(
                ["todos"],
                todos=prop(
                    "array",
                    "The updated todo list",
                    items=obj(
                        ["content", "status", "activeForm"],
                        content=prop("string", "Imperative description, e.g. 'Run tests'"),
                        status=prop("string", "Task status", enum=["pending", "in_progress", "completed"]),
                        activeForm=prop("string", "Present continuous form, e.g. 'Running tests'"),
                    ),
                ),
            ),
            _todo,
            lambda r: "Todos have been modified successfully. Keep using the todo list to track your progress.",
        ),
    )

    reverse: ClassVar[Mapping[str, FromIntent]] = {
        "exec_shell": _from_exec,
        "read_file": _from_read,
        "write_file": _from_write,
        "edit_replace": _from_edit,
        "glob": lambda a: ("Glob", {"pattern": a["pattern"], "path": a.get("path") or None}),
        "grep": _from_grep,
        "plan_update": _from_plan,
    }

    def effort_text(self, effort: str) -> str:
        return f"<system-reminder>{EFFORT_TEXT[effort]}</system-reminder>"

    def error_text(self, message: str) -> str:
        return f"<tool_use_error>{message}</tool_use_error>"
