"""Requests of the three wire APIs, read into one canonical conversation.

Canonical messages are what the project's chat template renders
(``rollout.tokenizer``): ``system`` / ``user`` / ``tool`` messages with string
content, and ``assistant`` messages with ``content``, ``reasoning_content`` and
OpenAI-style ``tool_calls`` (arguments as a JSON string). Every assistant turn
also carries the ids the gateway handed out for it, as they came back (tool-use
ids, thinking signatures, Responses item ids and ``encrypted_content``, call ids):
they are how the session finds the exact sampled tokens of that turn.

What is dropped on purpose: ``cache_control`` markers, Claude Code's billing
header system block (metadata that names the CLI build, not prompt text),
images (a ``[image]`` placeholder). Everything the model would see is kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout.gateway.types import Api, GatewayError

BILLING_HEADER = "x-anthropic-billing-header"


@dataclass
class Conversation:
    api: Api
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    turn_ids: dict[int, frozenset[str]] = field(default_factory=dict)  # message index -> ids it carried
    call_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)  # message index -> its tool call ids
    custom_tools: frozenset[str] = frozenset()  # Responses freeform tools (Codex apply_patch)
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    effort: str | None = None
    include_usage: bool = False


def _obj(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise GatewayError(f"{name}: expected an object, got {type(value).__name__}", name)
    return value


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise GatewayError(f"{name}: expected an array, got {type(value).__name__}", name)
    return value


def _text_of(content: Any, name: str) -> str:
    """Text of a string or a list of text-like parts (images become a placeholder)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for i, part in enumerate(_list(content, name)):
        part = _obj(part, f"{name}[{i}]")
        kind = part.get("type")
        if isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind in ("image", "input_image", "image_url"):
            parts.append("[image]")
        elif kind in ("input_file", "document"):
            parts.append("[file]")
    return "".join(parts)


def _number(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatewayError(f"{key}: expected a number, got {value!r}", key)
    return float(value)


def _stops(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(s) for s in _list(value, name) if isinstance(s, str) and s)


def _function_tool(name: str, description: str, parameters: Any) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name, "description": description or ""}
    fn["parameters"] = parameters if isinstance(parameters, Mapping) else {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


# ---------------------------------------------------------------- Anthropic Messages


def read_anthropic(body: Mapping[str, Any]) -> Conversation:
    body = _obj(body, "body")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        blocks = [_obj(b, "system[]") for b in system]
        system = "\n".join(str(b.get("text", "")) for b in blocks if not str(b.get("text", "")).startswith(BILLING_HEADER))
    elif system is not None and not isinstance(system, str):
        raise GatewayError("system: expected a string or text blocks", "system")
    if system:
        messages.append({"role": "system", "content": system})
    conv = Conversation(Api.ANTHROPIC, str(body.get("model", "")), messages, [])
    raw = _list(body.get("messages"), "messages")
    if not raw:
        raise GatewayError("messages: at least one message is required", "messages")
    for i, msg in enumerate(raw):
        msg = _obj(msg, f"messages[{i}]")
        role, content = msg.get("role"), msg.get("content")
        where = f"messages[{i}].content"
        if role == "system":  # Claude Code sends mid-conversation system messages
            messages.append({"role": "system", "content": _text_of(content, where)})
        elif role == "user":
            if isinstance(content, str):
                messages.append({"role": "user", "content": content})
                continue
            pending: list[str] = []
            for j, block in enumerate(_list(content, where)):
                block = _obj(block, f"{where}[{j}]")
                if block.get("type") == "tool_result":
                    if pending:
                        messages.append({"role": "user", "content": "".join(pending)})
                        pending = []
                    result = _text_of(block.get("content"), f"{where}[{j}].content")
                    if block.get("is_error"):
                        result = f"[error] {result}"
                    messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": result})
                else:
                    pending.append(_text_of([block], f"{where}[{j}]"))
            if pending:
                messages.append({"role": "user", "content": "".join(pending)})
        elif role == "assistant":
            text: list[str] = []
            reasoning: list[str] = []
            calls: list[dict[str, Any]] = []
            ids: set[str] = set()
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else _list(content, where)
            for j, block in enumerate(blocks):
                block = _obj(block, f"{where}[{j}]")
                kind = block.get("type")
                if kind == "text":
                    text.append(str(block.get("text", "")))
                elif kind == "thinking":
                    reasoning.append(str(block.get("thinking", "")))
                    if block.get("signature"):
                        ids.add(str(block["signature"]))
                elif kind == "redacted_thinking":
                    ids.add(str(block.get("data", "")))
                elif kind in ("tool_use", "server_tool_use"):
                    cid = str(block.get("id", ""))
                    ids.add(cid)
                    args = block.get("input", {})
                    calls.append({"id": cid, "type": "function", "function": {"name": str(block.get("name", "")), "arguments": json.dumps(args, ensure_ascii=False)}})
            conv.turn_ids[len(messages)] = frozenset(i for i in ids if i)
            conv.call_ids[len(messages)] = tuple(c["id"] for c in calls)
            messages.append(_assistant("".join(text), "".join(reasoning), calls))
        else:
            raise GatewayError(f"messages[{i}].role: expected user, assistant or system, got {role!r}", f"messages[{i}].role")
    for i, tool in enumerate(_list(body.get("tools") or [], "tools")):
        tool = _obj(tool, f"tools[{i}]")
        conv.tools.append(_function_tool(str(tool.get("name", "")), str(tool.get("description", "")), tool.get("input_schema")))
    conv.stream = bool(body.get("stream", False))
    conv.max_tokens = int(_number(body, "max_tokens") or 0) or None
    conv.temperature, conv.top_p = _number(body, "temperature"), _number(body, "top_p")
    conv.stop = _stops(body.get("stop_sequences"), "stop_sequences")
    output_config = body.get("output_config")
    if isinstance(output_config, Mapping) and isinstance(output_config.get("effort"), str):
        conv.effort = output_config["effort"]
    return conv


# ---------------------------------------------------------------- OpenAI Responses


def read_responses(body: Mapping[str, Any]) -> Conversation:
    body = _obj(body, "body")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    conv = Conversation(Api.RESPONSES, str(body.get("model", "")), messages, [])
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    items = _list(items, "input")
    if not items:
        raise GatewayError("input: at least one item is required", "input")
    turn: dict[str, Any] | None = None

    def close_turn() -> None:
        nonlocal turn
        if turn is not None:
            conv.turn_ids[len(messages)] = frozenset(i for i in turn["ids"] if i)
            conv.call_ids[len(messages)] = tuple(c["id"] for c in turn["calls"])
            messages.append(_assistant("".join(turn["text"]), "".join(turn["reasoning"]), turn["calls"]))
            turn = None

    for i, item in enumerate(items):
        item = _obj(item, f"input[{i}]")
        kind = item.get("type", "message")
        role = item.get("role")
        if kind in ("reasoning", "function_call", "custom_tool_call") or (kind == "message" and role == "assistant"):
            if turn is None:
                turn = {"text": [], "reasoning": [], "calls": [], "ids": set()}
            turn["ids"].add(str(item.get("id", "")))
            if kind == "message":
                turn["text"].append(_text_of(item.get("content"), f"input[{i}].content"))
            elif kind == "reasoning":
                parts = item.get("content") or item.get("summary") or []
                turn["reasoning"].append(_text_of(parts, f"input[{i}].content"))
                if item.get("encrypted_content"):
                    turn["ids"].add(str(item["encrypted_content"]))
            else:
                cid = str(item.get("call_id", ""))
                args = item.get("arguments", "{}") if kind == "function_call" else json.dumps({"input": item.get("input", "")}, ensure_ascii=False)
                turn["calls"].append({"id": cid, "type": "function", "function": {"name": str(item.get("name", "")), "arguments": str(args)}})
            continue
        close_turn()
        if kind == "message":
            text = _text_of(item.get("content"), f"input[{i}].content")
            messages.append({"role": "system" if role in ("system", "developer") else "user", "content": text})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": _text_of(item.get("output"), f"input[{i}].output")})
        else:
            raise GatewayError(f"input[{i}].type: unsupported item type {kind!r}", f"input[{i}].type")
    close_turn()
    custom: set[str] = set()
    for i, tool in enumerate(_list(body.get("tools") or [], "tools")):
        tool = _obj(tool, f"tools[{i}]")
        name = str(tool.get("name", tool.get("type", "")))
        if tool.get("type") == "custom":
            custom.add(name)
            schema = {"type": "object", "properties": {"input": {"type": "string", "description": "freeform input"}}, "required": ["input"]}
            conv.tools.append(_function_tool(name, str(tool.get("description", "")), schema))
        else:
            conv.tools.append(_function_tool(name, str(tool.get("description", "")), tool.get("parameters")))
    conv.custom_tools = frozenset(custom)
    conv.stream = bool(body.get("stream", False))
    conv.max_tokens = int(_number(body, "max_output_tokens") or 0) or None
    conv.temperature, conv.top_p = _number(body, "temperature"), _number(body, "top_p")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and isinstance(reasoning.get("effort"), str):
        conv.effort = reasoning["effort"]
    return conv


# ---------------------------------------------------------------- chat completions


def read_chat(body: Mapping[str, Any]) -> Conversation:
    body = _obj(body, "body")
    messages: list[dict[str, Any]] = []
    conv = Conversation(Api.CHAT, str(body.get("model", "")), messages, [])
    raw = _list(body.get("messages"), "messages")
    if not raw:
        raise GatewayError("messages: at least one message is required", "messages")
    for i, msg in enumerate(raw):
        msg = _obj(msg, f"messages[{i}]")
        role = msg.get("role")
        where = f"messages[{i}].content"
        if role in ("system", "developer"):
            messages.append({"role": "system", "content": _text_of(msg.get("content"), where)})
        elif role == "user":
            messages.append({"role": "user", "content": _text_of(msg.get("content"), where)})
        elif role == "tool":
            messages.append({"role": "tool", "tool_call_id": str(msg.get("tool_call_id", "")), "content": _text_of(msg.get("content"), where)})
        elif role == "assistant":
            calls: list[dict[str, Any]] = []
            for j, tc in enumerate(_list(msg.get("tool_calls") or [], f"messages[{i}].tool_calls")):
                tc = _obj(tc, f"messages[{i}].tool_calls[{j}]")
                fn = _obj(tc.get("function", {}), f"messages[{i}].tool_calls[{j}].function")
                args = fn.get("arguments", "{}")
                calls.append({"id": str(tc.get("id", "")), "type": "function", "function": {"name": str(fn.get("name", "")), "arguments": args if isinstance(args, str) else json.dumps(args)}})
            reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
            conv.turn_ids[len(messages)] = frozenset(c["id"] for c in calls if c["id"])
            conv.call_ids[len(messages)] = tuple(c["id"] for c in calls)
            messages.append(_assistant(_text_of(msg.get("content"), where), str(reasoning), calls))
        else:
            raise GatewayError(f"messages[{i}].role: unsupported role {role!r}", f"messages[{i}].role")
    for i, tool in enumerate(_list(body.get("tools") or [], "tools")):
        tool = _obj(tool, f"tools[{i}]")
        fn = _obj(tool.get("function", {}), f"tools[{i}].function")
        conv.tools.append(_function_tool(str(fn.get("name", "")), str(fn.get("description", "")), fn.get("parameters")))
    conv.stream = bool(body.get("stream", False))
    limit = _number(body, "max_completion_tokens") or _number(body, "max_tokens")
    conv.max_tokens = int(limit) if limit else None
    conv.temperature, conv.top_p = _number(body, "temperature"), _number(body, "top_p")
    conv.stop = _stops(body.get("stop"), "stop")
    if isinstance(body.get("reasoning_effort"), str):
        conv.effort = body["reasoning_effort"]
    options = body.get("stream_options")
    conv.include_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
    return conv


def _assistant(text: str, reasoning: str, calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [dict(c) for c in calls]
    return message


READERS = {Api.ANTHROPIC: read_anthropic, Api.RESPONSES: read_responses, Api.CHAT: read_chat}

__all__ = ["BILLING_HEADER", "Conversation", "READERS", "read_anthropic", "read_chat", "read_responses"]
