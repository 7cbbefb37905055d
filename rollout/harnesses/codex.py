"""The OpenAI Codex CLI tool surface.

What sets it apart: only three tools. ``shell.command`` is an execvp argv
*list* (usually ``["bash", "-lc", "..."]``), with ``workdir`` and
``timeout_ms`` in milliseconds; every file change goes through ``apply_patch``
and its own patch grammar with *relative* paths (``agentenv.patch``); a patch
sent through the shell as ``["apply_patch", "<patch>"]`` is intercepted, as
Codex does; reading and searching are done with shell commands; the plan is
``update_plan{explanation, plan[{step, status}]}`` with at most one step
``in_progress``. Shell results are reported with exit code and wall time; the
effort level is a ``Reasoning: <level>`` option line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from agentenv.intents import Intent, IntentResult
from agentenv.patch import PatchError, parse_patch
from rollout.harnesses.base import BaseHarness, FromIntent, Tool, UnsupportedIntent, inverse_scale, obj, prop
from rollout.harnesses.formatting import shell_output

SYSTEM_PROMPT = """\
You are Codex, a coding agent running in a sandboxed Linux workspace ({workdir}). Network access is disabled.

- Run commands with the `shell` tool; pass an argv list such as ["bash", "-lc", "grep -rn foo ."] and set `workdir`.
- Search with `grep -rn` or `find`; read files with `sed -n '1,200p' file` or `cat`.
- Edit files only with `apply_patch`. A patch looks like:
  *** Begin Patch
  *** Update File: path/relative/to/workdir.py
  @@ def some_function
   context line
  -old line
  +new line
  *** End Patch
  Use *** Add File: (every line prefixed with +) and *** Delete File: for new and removed files. Paths must be relative.
- Keep a short plan with `update_plan` for multi-step work.
- When the task is complete, stop calling tools and give a brief final message."""


def _shell(a: Mapping[str, Any]) -> Intent | str:
    argv = list(a["command"])
    if argv and argv[0] in ("apply_patch", "applypatch"):
        if len(argv) != 2:
            return 'apply_patch through shell takes exactly one argument: ["apply_patch", "<patch text>"]'
        return _apply_patch({"input": argv[1], "workdir": a.get("workdir")})
    args: dict[str, Any] = {"command": argv, "timeout_s": (a.get("timeout_ms") or 10_000) / 1000}
    if a.get("workdir"):
        args["cwd"] = a["workdir"]
    return Intent("exec_shell", args)


def _apply_patch(a: Mapping[str, Any]) -> Intent | str:
    try:
        parse_patch(a["input"])  # reject an unparseable patch at parse time: it is a format error
    except PatchError as exc:
        return f"invalid patch: {exc}"
    args: dict[str, Any] = {"patch": a["input"]}
    if a.get("workdir"):
        args["cwd"] = a["workdir"]
    return Intent("apply_patch", args)


def _update_plan(a: Mapping[str, Any]) -> Intent | str:
    plan = a["plan"]
    if sum(p["status"] == "in_progress" for p in plan) > 1:
        return "at most one step can be in_progress at a time"
    return Intent("plan_update", {"items": [{"text": p["step"], "status": p["status"]} for p in plan], "explanation": a.get("explanation") or ""})


def _from_exec(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    command = a.get("command", "")
    argv = list(command) if isinstance(command, (list, tuple)) else ["bash", "-lc", str(command)]
    t = a.get("timeout_s")
    ms = None if t is None else min(max(inverse_scale(float(t), 1000, integer=True), 1), 600_000)
    return "shell", {"command": argv, "workdir": a.get("cwd"), "timeout_ms": ms}


def _from_plan(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    items = a.get("items")
    if items is None:
        raise UnsupportedIntent("codex update_plan cannot only read the plan")
    plan = [{"step": i["text"], "status": i["status"]} for i in items]
    return "update_plan", {"plan": plan, "explanation": a.get("explanation")}


def _fmt_shell(r: IntentResult) -> str:
    if r.intent.name == "apply_patch":
        return r.output if r.ok else f"apply_patch failed: {r.error}"
    head = f"Exit code: {r.exit_code}\nWall time: {float(r.data.get('duration_s', 0.0)):.1f} seconds\n"
    if r.timed_out:
        head += f"command timed out after {r.data.get('timeout_s', 0) * 1000:.0f} ms\n"
    return head + "Output:\n" + shell_output(r)


class CodexHarness(BaseHarness):
    """shell (argv list, timeout_ms), apply_patch (patch grammar), update_plan."""

    name = "codex"
    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    call_id_prefix: ClassVar[str] = "call_"
    tools: ClassVar[tuple[Tool, ...]] = (
        Tool(
            "shell",
            "Runs a command and returns its output. The command is an argv list for execvp; most calls use ['bash', '-lc', '<script>'].",
            obj(
                ["command"],
                command=prop("array", "The command to execute, as an argv list", items={"type": "string"}, minItems=1),
                workdir=prop("string", "The working directory to run the command in"),
                timeout_ms=prop("integer", "The timeout for the command in milliseconds", minimum=1, maximum=600000),
                sandbox_permissions=prop("string", "Permission level for this command", enum=["use_default", "require_escalated"]),
                justification=prop("string", "Why escalated permissions are needed"),
            ),
            _shell,
            _fmt_shell,
        ),
        Tool(
            "apply_patch",
            "Edits files with a patch in the apply_patch format (*** Begin Patch ... *** End Patch); paths are relative.",
            obj(["input"], input=prop("string", "The entire contents of the apply_patch command")),
            _apply_patch,
            lambda r: r.output if r.ok else f"apply_patch failed: {r.error}",
        ),
        Tool(
            "update_plan",
            "Updates the task plan. At most one step can be in_progress at a time.",
            obj(
                ["plan"],
                explanation=prop("string", "Optional note about what changed"),
                plan=prop(
                    "array",
                    "The list of steps",
                    items=obj(["step", "status"], step=prop("string", "A short step"), status=prop("string", "One of: pending, in_progress, completed", enum=["pending", "in_progress", "completed"])),
                ),
            ),
            _update_plan,
            lambda r: "Plan updated",
        ),
    )

    reverse: ClassVar[Mapping[str, FromIntent]] = {
        "exec_shell": _from_exec,
        "apply_patch": lambda a: ("apply_patch", {"input": a["patch"], "workdir": a.get("cwd")}),
        "plan_update": _from_plan,
    }

    def effort_text(self, effort: str) -> str:
        return f"Reasoning: {effort}"

    def error_text(self, message: str) -> str:
        return f"failed to run tool: {message}"
