"""A one-tool harness for unit tests (the sandbox side is ``sandboxes.testing.FakeBackend``).

The harness understands ``<tool_call>{"name", "arguments"}</tool_call>`` with tools ``sh`` and
``submit``, and turns anything else into a ``ParseError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agentenv.intents import Harness, Intent, IntentResult, ParsedTurn, ParseError, RenderedPrompt, ToolCall

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


class FakeHarness(Harness):  # the Protocol's default turn_intents
    name = "fake"

    def render(self, instruction: str, effort: str | None = None) -> RenderedPrompt:
        return RenderedPrompt(messages=[{"role": "system", "content": "Use sh and submit."}, {"role": "user", "content": instruction}],
                              tools=[{"type": "function", "function": {"name": "sh"}}])

    def parse(self, output: str | Mapping[str, Any]) -> ParsedTurn:
        text = output if isinstance(output, str) else str(output.get("content", ""))
        calls, errors = [], []
        for i, raw in enumerate(_CALL.findall(text)):
            try:
                obj = json.loads(raw)
                calls.append(ToolCall(obj["name"], obj.get("arguments", {}), f"c{i}"))
            except (ValueError, KeyError, TypeError) as exc:
                errors.append(ParseError(f"bad tool call: {exc}", raw=raw))
        if not calls and not errors and text.strip():
            errors.append(ParseError("no <tool_call> found", raw=text[:100]))
        return ParsedTurn(text=_CALL.sub("", text), calls=calls, errors=errors)

    def to_intent(self, call: ToolCall) -> Intent | ParseError:
        if call.name == "sh":
            return Intent("exec_shell", {"command": call.arguments.get("command", "")}, call.call_id, tool="sh")
        if call.name == "submit":
            return Intent("submit", {"answer": call.arguments.get("answer")}, call.call_id, tool="submit")
        return ParseError(f"unknown tool {call.name!r}", call_id=call.call_id)

    def format_result(self, result: IntentResult) -> Mapping[str, Any]:
        return {"role": "tool", "content": result.output if result.ok else f"ERROR: {result.error or result.output}"}

    def format_error(self, error: ParseError) -> Mapping[str, Any]:
        return {"role": "tool", "content": f"ERROR: {error.message}"}


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
