"""A minimal bash-only harness: one shell tool and an explicit ``submit``.

The smallest useful surface, for the single-env API, quick smoke runs and tiny
models: everything is done through ``bash`` (files read with ``cat``, edited
with ``sed`` or heredocs). Unlike the product harnesses it ends the episode
with an explicit ``submit`` call, so a stray text turn does not end the task
(``text_turn_submits = False``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from agentenv.intents import Intent, IntentResult
from rollout.harnesses.base import BaseHarness, FromIntent, Tool, obj, prop, shell_string

SYSTEM_PROMPT = """\
You are an agent working in a Linux sandbox. Your working directory is the task's workspace.
Use the `bash` tool to run shell commands: inspect files, edit them, run programs and tests.
Each call runs in a fresh shell; use absolute paths or `cd dir && ...` within one command.
When the task is done, call `submit` (with your final answer if the task asks for one)."""


def _bash(args: Mapping[str, Any]) -> Intent:
    return Intent("exec_shell", {"command": args["command"], "timeout_s": args.get("timeout") or 60})


def _timeout_s(value: Any, low: int, high: int) -> int | None:
    """Canonical seconds as a whole-second tool argument in [low, high]; ``None`` leaves the default."""
    if value is None:
        return None
    return int(min(max(-(-float(value) // 1), low), high))  # ceil: never shorter than asked


def _from_exec(a: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    return "bash", {"command": shell_string(a.get("command", ""), a.get("cwd")), "timeout": _timeout_s(a.get("timeout_s"), 1, 600)}


def _format_bash(result: IntentResult) -> str:
    parts = [result.output.rstrip("\n")] if result.output else []
    if result.timed_out:
        parts.append(f"[timed out after {result.data.get('timeout_s', '?')} s]")
    parts.append(f"[exit code {result.exit_code}]")
    return "\n".join(parts)


class BashHarness(BaseHarness):
    """``bash{command, timeout (s)}`` and ``submit{answer}``."""

    name = "bash"
    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    call_id_prefix: ClassVar[str] = "call_"
    text_turn_submits: ClassVar[bool] = False
    tools: ClassVar[tuple[Tool, ...]] = (
        Tool(
            "bash",
            "Run a bash command in the sandbox and return its output and exit code.",
            obj(
                ["command"],
                command=prop("string", "The command line, run with bash -c."),
                timeout=prop("integer", "Seconds before the command is killed (default 60, max 600).", minimum=1, maximum=600),
            ),
            _bash,
            _format_bash,
        ),
        Tool(
            "submit",
            "Finish the task. Give the final answer if the task asks for one.",
            obj(answer=prop("string", "The final answer, if any.")),
            lambda a: Intent("submit", {"answer": a.get("answer")}),
            lambda r: "Submitted.",
        ),
    )

    reverse: ClassVar[Mapping[str, FromIntent]] = {
        "exec_shell": _from_exec,
        "submit": lambda a: ("submit", {"answer": a.get("answer")}),
    }

    def effort_text(self, effort: str) -> str:
        return f"Effort: {effort}."

    def error_text(self, message: str) -> str:
        return f"error: {message}"
