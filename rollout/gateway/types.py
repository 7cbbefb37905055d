"""The gateway's contract: what one model call records, and how a history break is named.

A *call* is one HTTP request to a model route (Anthropic Messages, OpenAI
Responses, chat completions). Its record holds the exact prompt token ids the
policy saw, the ids it sampled with their logprobs and loss mask, and the
policy version, so the trajectory a real CLI produces trains like an emulated
one. Calls of one conversation thread share one token sequence (an
``EpisodeRenderer``); a call whose history does not extend a thread the
gateway handed out is a *break*, recorded with its cause.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Api(str, enum.Enum):
    ANTHROPIC = "anthropic_messages"
    RESPONSES = "openai_responses"
    CHAT = "chat_completions"


class BreakCause(str, enum.Enum):
    """Why a request's history could not be spliced onto a recorded thread."""

    UNKNOWN_ASSISTANT_TURN = "unknown_assistant_turn"  # an assistant turn whose ids the gateway never handed out
    ASSISTANT_TURN_EDITED = "assistant_turn_edited"  # ids known, content changed (text or tool calls)
    THINKING_DROPPED = "thinking_dropped"  # the CLI stripped a thinking/reasoning block it was given
    HISTORY_REWRITTEN = "history_rewritten"  # a user/tool/system message before the last turn changed (compaction)
    SYSTEM_CHANGED = "system_changed"
    TOOLS_CHANGED = "tools_changed"
    RETRY = "retry"  # the same prompt again (the CLI retried a call): a new branch
    TEMPLATE = "template_not_append_only"  # the chat template re-rendered the past differently


class GatewayError(ValueError):
    """A request the gateway refuses (400): the message names the field and what was expected."""

    def __init__(self, message: str, param: str = "") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class HistoryBreak:
    call_index: int
    cause: BreakCause
    detail: str


@dataclass(frozen=True)
class CallRecord:
    """One model call, token-exact. ``mask`` is 1 on sampled tokens only (same length as ``completion_ids``)."""

    index: int
    api: Api
    thread: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    mask: tuple[int, ...]
    policy_version: int
    finish_reason: str
    ids_handed_out: tuple[str, ...]
    effort: str | None = None
    malformed: tuple[str, ...] = ()  # parse errors of the model's output (sent back as text, as the real API would)
    latency_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


__all__ = ["Api", "BreakCause", "CallRecord", "GatewayError", "HistoryBreak"]
