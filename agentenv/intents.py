"""Canonical intents and the harness contract.

Every harness (Kimi Code, Claude Code, Codex, ...) names its tools its own way;
each tool call maps onto one of these intents, which is what the sandbox
executes. A harness formats the ``IntentResult`` back in its own style. This
module lives in ``agentenv`` (not ``rollout``) so the single-env API can drive
any harness without importing ``rollout``; harness implementations live in
``rollout.harnesses`` and are found through the ``agentenv.harnesses``
entry-point group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

IntentName = Literal[
    "exec_shell",
    "read_file",
    "write_file",
    "edit_replace",
    "apply_patch",
    "glob",
    "grep",
    "plan_update",
    "submit",
]
INTENT_NAMES: tuple[str, ...] = (
    "exec_shell",
    "read_file",
    "write_file",
    "edit_replace",
    "apply_patch",
    "glob",
    "grep",
    "plan_update",
    "submit",
)

EffortLevel = Literal["low", "high", "max"]
EFFORT_LEVELS: tuple[str, ...] = ("low", "high", "max")

# Canonical plan statuses; harnesses translate theirs (Kimi says "done").
PLAN_STATUSES: tuple[str, ...] = ("pending", "in_progress", "completed")


@dataclass(frozen=True)
class Intent:
    """One canonical action. ``args`` keys are the canonical ones documented per intent:

    * exec_shell: command (str, run by a shell; or argv list, run without one),
      cwd, timeout_s (seconds, whatever unit the harness spoke)
    * read_file: path, offset (1-based line; negative counts from the end), limit (lines)
    * write_file: path, content, append (bool)
    * edit_replace: path, old, new, replace_all (bool) -- or path, edits (list of
      {old, new, replace_all}) applied in order, all or nothing
    * apply_patch: patch (Codex patch grammar text), cwd
    * glob: pattern, path
    * grep: pattern, path, glob, ignore_case, line_numbers, context_before,
      context_after, output_mode (content | files_with_matches | count), head_limit
    * plan_update: items (list of {text, status}; status in ``PLAN_STATUSES``),
      explanation; ``items=None`` only reads the plan
    * submit: answer (optional final answer)

    Relative paths are resolved against ``cwd`` when given, else the sandbox's
    workdir. ``tool`` is the harness's own tool name, kept so the result can be
    formatted the way that tool would (``Read`` numbers lines, ``ReadFile`` ...).
    """

    name: IntentName
    args: Mapping[str, Any] = field(default_factory=dict)
    call_id: str = ""
    tool: str = ""


@dataclass(frozen=True)
class IntentResult:
    """What executing an intent produced. ``error`` is a message for the model, not an exception."""

    intent: Intent
    ok: bool
    output: str = ""
    error: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model wrote it, in the harness's own names."""

    name: str
    arguments: Mapping[str, Any]
    call_id: str = ""


@dataclass(frozen=True)
class ParseError:
    """A malformed piece of model output; becomes a tool-error message in the harness's style."""

    message: str
    raw: str = ""
    call_id: str = ""


@dataclass(frozen=True)
class ParsedTurn:
    """The model's turn split into its text and its calls (and any malformed ones).

    ``reasoning`` is the thinking the model wrote (``<think>`` text or a
    ``reasoning_content`` field). ``dropped_calls`` counts calls past the
    per-turn cap that were not even parsed (one ``ParseError`` says so).
    """

    text: str
    calls: Sequence[ToolCall] = ()
    errors: Sequence[ParseError] = ()
    reasoning: str = ""
    dropped_calls: int = 0


@dataclass(frozen=True)
class RenderedPrompt:
    """Prompt messages (chat format) and tool schemas (OpenAI function format)."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]]


@runtime_checkable
class Harness(Protocol):
    """An agent harness: its system prompt, its tools, its parsing and result style.

    ``render`` gives the episode's opening messages: the harness's system prompt,
    then (when ``effort`` is given) an option message stating the effort level,
    then the instruction. ``parse`` accepts either an OpenAI-style assistant
    message (``{"content", "tool_calls": [{"id", "function": {"name",
    "arguments": <JSON string>}}]}``) or the raw text a local model emitted under
    the project's chat template (``<tool_call>{"name", "arguments"}</tool_call>``);
    it never raises. ``to_intent`` never raises either: a call it cannot map is a
    ``ParseError``. ``turn_intents`` has a default (see there).
    """

    name: str

    def render(self, instruction: str, effort: str | None = None) -> RenderedPrompt: ...

    def parse(self, output: str | Mapping[str, Any]) -> ParsedTurn: ...

    def to_intent(self, call: ToolCall) -> Intent | ParseError: ...

    def format_result(self, result: IntentResult) -> Mapping[str, Any]:
        """A chat message (role ``tool`` or the harness's equivalent) carrying the result."""
        ...

    def format_error(self, error: ParseError) -> Mapping[str, Any]:
        """A chat message telling the model its call was malformed, in the harness's style."""
        ...

    def turn_intents(self, turn: ParsedTurn) -> list[Intent | ParseError]:
        """The turn's intents in order, then its errors: what the episode executes.

        The default maps each call with ``to_intent``; a harness where a plain text turn
        ends the episode (every real one) returns a ``submit`` for it instead
        (``rollout.harnesses.base.BaseHarness``). Subclass ``Harness`` to inherit the default.
        """
        return [self.to_intent(c) for c in turn.calls] + list(turn.errors)


__all__ = [
    "EFFORT_LEVELS",
    "INTENT_NAMES",
    "PLAN_STATUSES",
    "EffortLevel",
    "Harness",
    "Intent",
    "IntentName",
    "IntentResult",
    "ParseError",
    "ParsedTurn",
    "RenderedPrompt",
    "ToolCall",
]
