"""Pull tool calls out of model output, in either format a policy produces.

* OpenAI-style assistant messages: ``tool_calls[].function.arguments`` is a JSON
  *string* (servers hand back what the model wrote, so it may be broken).
* Raw text a local model sampled under the project's chat template
  (``rollout.tokenizer``)::

      <think>reasoning</think>prose
      <tool_call>
      {"name": "Bash", "arguments": {"command": "ls"}}
      </tool_call>

Nothing here raises on any input: broken pieces become ``ParseError``s with
a message for the model. Calls past ``max_calls`` are counted, not parsed, so a
turn of ten thousand calls costs one ``str.count``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentenv.intents import ParseError

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class RawCall:
    """A call whose envelope parsed; its arguments are not yet checked against a tool."""

    name: str
    arguments: Mapping[str, Any]
    call_id: str
    raw: str


@dataclass(frozen=True)
class Extracted:
    text: str
    reasoning: str
    calls: list[RawCall]
    errors: list[ParseError]
    dropped: int


def make_call_id(prefix: str, index: int, raw: str) -> str:
    """Deterministic id: the same output always gets the same ids (reproducible episodes)."""
    digest = hashlib.sha1(f"{index}\0{raw}".encode("utf-8", "replace")).hexdigest()[:10]
    return f"{prefix}{digest}{index}"


def split_thinking(text: str) -> tuple[str, str]:
    """``(reasoning, rest)``. An unclosed ``<think>`` makes everything after it reasoning."""
    start = text.find(THINK_OPEN)
    if start < 0 or text[:start].strip():
        # A template may put <think> in the generation prompt, so output can start mid-thought.
        end = text.find(THINK_CLOSE)
        if end >= 0 and start < 0:
            return text[:end].strip(), text[end + len(THINK_CLOSE) :].lstrip("\n")
        return "", text
    end = text.find(THINK_CLOSE, start)
    if end < 0:
        return text[start + len(THINK_OPEN) :].strip(), ""
    return text[start + len(THINK_OPEN) : end].strip(), text[end + len(THINK_CLOSE) :].lstrip("\n")


def _arguments(value: Any) -> tuple[Mapping[str, Any] | None, str]:
    """Arguments as a mapping, accepting a JSON string of an object; else an error message."""
    if isinstance(value, str):
        if not value.strip():
            return {}, ""
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            return None, f"arguments are not valid JSON ({exc})"
    if value is None:
        return {}, ""
    if not isinstance(value, Mapping):
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, ""


def _too_many(found: int, max_calls: int) -> ParseError:
    return ParseError(
        f"too many tool calls in one turn: {found}; only the first {max_calls} were considered",
        raw="",
    )


def extract_text(output: str, prefix: str, max_calls: int) -> Extracted:
    """Parse raw template text: thinking, prose, and ``<tool_call>`` blocks."""
    reasoning, rest = split_thinking(output)
    found = rest.count(CALL_OPEN)
    errors: list[ParseError] = []
    calls: list[RawCall] = []
    dropped = max(found - max_calls, 0)
    if dropped:
        errors.append(_too_many(found, max_calls))
    prose: list[str] = []
    pos, index = 0, 0
    while index < min(found, max_calls):
        start = rest.find(CALL_OPEN, pos)
        if start < 0:
            break
        prose.append(rest[pos:start])
        body_at = start + len(CALL_OPEN)
        end = rest.find(CALL_CLOSE, body_at)
        nxt = rest.find(CALL_OPEN, body_at)
        if end < 0 or (0 <= nxt < end):
            stop = nxt if nxt >= 0 else len(rest)
            raw = rest[start:stop]
            errors.append(ParseError(f"tool call has no closing {CALL_CLOSE}", raw=raw[:2000], call_id=make_call_id(prefix, index, raw)))
            pos, index = stop, index + 1
            continue
        raw = rest[body_at:end].strip()
        pos, index = end + len(CALL_CLOSE), index + 1
        call_id = make_call_id(prefix, index - 1, raw)
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            errors.append(ParseError(f"tool call is not valid JSON ({exc})", raw=raw[:2000], call_id=call_id))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            errors.append(ParseError('tool call must be a JSON object {"name": ..., "arguments": {...}}', raw=raw[:2000], call_id=call_id))
            continue
        args, problem = _arguments(obj.get("arguments", obj.get("parameters")))
        if args is None:
            errors.append(ParseError(f"{obj['name']}: {problem}", raw=raw[:2000], call_id=call_id))
            continue
        calls.append(RawCall(obj["name"], args, call_id, raw))
    if pos < len(rest) and index >= found:
        prose.append(rest[pos:])
    text = "".join(prose).strip()
    return Extracted(text, reasoning, calls, errors, dropped)


def extract_message(message: Mapping[str, Any], prefix: str, max_calls: int) -> Extracted:
    """Parse an OpenAI-style assistant message (``content``, ``tool_calls``, reasoning fields)."""
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    text = content if isinstance(content, str) else ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    if not isinstance(reasoning, str):
        reasoning = ""
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        return Extracted(text, reasoning, [], [ParseError("tool_calls must be a list", raw=repr(raw_calls)[:2000])], 0)
    if not raw_calls and CALL_OPEN in text:
        # A server without a tool parser returns the template text as content.
        inner = extract_text(text, prefix, max_calls)
        return Extracted(inner.text, reasoning or inner.reasoning, inner.calls, inner.errors, inner.dropped)
    if not reasoning and THINK_OPEN in text:
        reasoning, text = split_thinking(text)
    errors: list[ParseError] = []
    dropped = max(len(raw_calls) - max_calls, 0)
    if dropped:
        errors.append(_too_many(len(raw_calls), max_calls))
    calls: list[RawCall] = []
    for index, tc in enumerate(raw_calls[:max_calls]):
        raw = repr(tc)[:2000]
        if not isinstance(tc, Mapping):
            errors.append(ParseError("tool call must be an object", raw=raw, call_id=make_call_id(prefix, index, raw)))
            continue
        cid = tc.get("id")
        call_id = cid if isinstance(cid, str) and cid else make_call_id(prefix, index, raw)
        fn = tc.get("function")
        custom = tc.get("custom")
        if tc.get("type") == "custom" and isinstance(custom, Mapping):
            # Codex freeform tools (apply_patch): the input is raw text, not JSON.
            fn = {"name": custom.get("name"), "arguments": {"input": custom.get("input", "")}}
        elif not isinstance(fn, Mapping):
            fn = tc  # some servers flatten {name, arguments}
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            errors.append(ParseError("tool call has no function name", raw=raw, call_id=call_id))
            continue
        args, problem = _arguments(fn.get("arguments", fn.get("input")))
        if args is None:
            errors.append(ParseError(f"{name}: {problem}", raw=raw, call_id=call_id))
            continue
        calls.append(RawCall(name, args, call_id, raw))
    return Extracted(text.strip(), reasoning.strip(), calls, errors, dropped)


__all__ = ["CALL_CLOSE", "CALL_OPEN", "THINK_CLOSE", "THINK_OPEN", "Extracted", "RawCall", "extract_message", "extract_text", "make_call_id", "split_thinking"]
