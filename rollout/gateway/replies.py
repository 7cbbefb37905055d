"""A ``Reply`` written in each API's own shape: a JSON body, or the server-sent events of a stream.

The turn is sampled whole before the first event is sent (the record must be
complete before the CLI can act on it); the events are the ones each official
API sends, in its order, so the official clients and the real CLIs parse them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from rollout.gateway.session import Reply


def sse(event: str | None, data: Any) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


# ---------------------------------------------------------------- Anthropic Messages


def _anthropic_stop(reply: Reply) -> str:
    return {"tool_calls": "tool_use", "length": "max_tokens"}.get(reply.finish, "end_turn")


def _anthropic_blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": reply.reasoning_id})
    if reply.text or not reply.calls:
        blocks.append({"type": "text", "text": reply.text})
    for c in reply.calls:
        blocks.append({"type": "tool_use", "id": c.call_id, "name": c.name, "input": _input(c.arguments)})
    return blocks


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def anthropic_body(reply: Reply, model: str) -> dict[str, Any]:
    return {
        "id": reply.message_id, "type": "message", "role": "assistant", "model": model,
        "content": _anthropic_blocks(reply), "stop_reason": _anthropic_stop(reply), "stop_sequence": None,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }


def anthropic_stream(reply: Reply, model: str) -> Iterator[str]:
    start = anthropic_body(reply, model)
    start.update(content=[], stop_reason=None, usage={**start["usage"], "output_tokens": 1})
    yield sse("message_start", {"type": "message_start", "message": start})
    for i, block in enumerate(_anthropic_blocks(reply)):
        kind = block["type"]
        empty = {"thinking": {"type": "thinking", "thinking": "", "signature": ""}, "text": {"type": "text", "text": ""},
                 "tool_use": {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": {}}}[kind]
        yield sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": empty})
        if kind == "thinking":
            yield sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": block["thinking"]}})
            yield sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": block["signature"]}})
        elif kind == "text":
            if block["text"]:
                yield sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": block["text"]}})
        else:
            yield sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": i})
    yield sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": _anthropic_stop(reply), "stop_sequence": None},
                                "usage": {"output_tokens": reply.completion_tokens}})
    yield sse("message_stop", {"type": "message_stop"})


def anthropic_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


# ---------------------------------------------------------------- OpenAI Responses


def _responses_items(reply: Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning:
        items.append({"type": "reasoning", "id": reply.reasoning_id, "summary": [],
                      "content": [{"type": "reasoning_text", "text": reply.reasoning}],
                      "encrypted_content": reply.encrypted, "status": "completed"})
    if reply.text or not reply.calls:
        items.append({"type": "message", "id": reply.message_id, "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}]})
    for c in reply.calls:
        if c.custom:
            items.append({"type": "custom_tool_call", "id": c.item_id, "call_id": c.call_id, "name": c.name,
                          "input": str(_input(c.arguments).get("input", "")), "status": "completed"})
        else:
            items.append({"type": "function_call", "id": c.item_id, "call_id": c.call_id, "name": c.name,
                          "arguments": c.arguments, "status": "completed"})
    return items


def responses_body(reply: Reply, model: str, response_id: str, status: str = "completed") -> dict[str, Any]:
    incomplete = reply.finish == "length"
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "model": model,
        "status": ("incomplete" if incomplete else "completed") if status == "completed" else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete and status == "completed" else None,
        "output": _responses_items(reply) if status == "completed" else [],
        "error": None, "instructions": None, "metadata": {}, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [], "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
                  "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }


def responses_stream(reply: Reply, model: str, response_id: str) -> Iterator[str]:
    seq = iter(range(1 << 30))

    def ev(kind: str, **data: Any) -> str:
        return sse(kind, {"type": kind, "sequence_number": next(seq), **data})

    yield ev("response.created", response=responses_body(reply, model, response_id, "in_progress"))
    yield ev("response.in_progress", response=responses_body(reply, model, response_id, "in_progress"))
    for n, item in enumerate(_responses_items(reply)):
        kind = item["type"]
        pending = {**item, "status": "in_progress"}
        if kind == "message":
            pending["content"] = []
        yield ev("response.output_item.added", output_index=n, item=pending)
        if kind == "message":
            part = item["content"][0]
            yield ev("response.content_part.added", item_id=item["id"], output_index=n, content_index=0, part={**part, "text": ""})
            yield ev("response.output_text.delta", item_id=item["id"], output_index=n, content_index=0, delta=part["text"], logprobs=[])
            yield ev("response.output_text.done", item_id=item["id"], output_index=n, content_index=0, text=part["text"], logprobs=[])
            yield ev("response.content_part.done", item_id=item["id"], output_index=n, content_index=0, part=part)
        elif kind == "function_call":
            yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=n, delta=item["arguments"])
            yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=n, arguments=item["arguments"], name=item["name"])
        elif kind == "custom_tool_call":
            yield ev("response.custom_tool_call_input.delta", item_id=item["id"], output_index=n, delta=item["input"])
            yield ev("response.custom_tool_call_input.done", item_id=item["id"], output_index=n, input=item["input"])
        yield ev("response.output_item.done", output_index=n, item=item)
    final = responses_body(reply, model, response_id)
    yield ev("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)


def openai_error(kind: str, message: str, param: str = "") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param or None, "code": None}}


# ---------------------------------------------------------------- chat completions


def _chat_message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or (None if reply.calls else "")}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.calls:
        message["tool_calls"] = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in reply.calls]
    return message


def _chat_usage(reply: Reply) -> dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def chat_body(reply: Reply, model: str, completion_id: str) -> dict[str, Any]:
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": _chat_message(reply), "finish_reason": reply.finish, "logprobs": None}],
            "usage": _chat_usage(reply)}


def chat_stream(reply: Reply, model: str, completion_id: str, include_usage: bool) -> Iterator[str]:
    head = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return sse(None, {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    yield chunk({"role": "assistant", "content": ""})
    if reply.reasoning:
        yield chunk({"reasoning_content": reply.reasoning})
    if reply.text:
        yield chunk({"content": reply.text})
    for i, c in enumerate(reply.calls):
        yield chunk({"tool_calls": [{"index": i, "id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}]})
    yield chunk({}, reply.finish)
    if include_usage:
        yield sse(None, {**head, "choices": [], "usage": _chat_usage(reply)})
    yield "data: [DONE]\n\n"


__all__ = ["anthropic_body", "anthropic_error", "anthropic_stream", "chat_body", "chat_stream", "openai_error",
           "responses_body", "responses_stream", "sse"]
