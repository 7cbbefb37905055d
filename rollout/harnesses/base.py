"""The shared machinery of every harness; a concrete harness is mostly data.

A harness subclass sets ``name``, a system prompt, how it states effort, how
it wraps errors, and a tuple of ``Tool``s. Each ``Tool`` carries its real JSON
schema (what the model sees), a function mapping its arguments onto a
canonical ``Intent``, and a function formatting an ``IntentResult`` in that
tool's style. Parsing, schema checking, the call cap and error messages are
done here once, so adding a harness is a page of tool tables (docs/harnesses.md).
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from agentenv.intents import (
    EFFORT_LEVELS,
    Harness,
    Intent,
    IntentResult,
    ParsedTurn,
    ParseError,
    RenderedPrompt,
    ToolCall,
)
from rollout.harnesses.parsing import CALL_CLOSE, CALL_OPEN, Extracted, extract_message, extract_text

ToIntent = Callable[[Mapping[str, Any]], "Intent | str"]
Formatter = Callable[[IntentResult], str]
#: canonical intent args -> (tool name, tool arguments); the inverse of one ``ToIntent``.
FromIntent = Callable[[Mapping[str, Any]], "tuple[str, dict[str, Any]]"]


class UnsupportedIntent(ValueError):
    """The harness has no tool that expresses this intent (Codex has no ``read_file`` tool, say)."""

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (Mapping,),
    "null": (type(None),),
}


def check_schema(value: Any, schema: Mapping[str, Any], where: str = "arguments") -> str | None:
    """First violation of a small JSON-schema subset, as a message; ``None`` when valid.

    Subset: type (or list of types), anyOf, properties, required,
    additionalProperties (false only), enum, items, minimum, maximum, minItems.
    Enough for tool schemas, and no third-party validator on the rollout hot path.
    """
    if "anyOf" in schema:
        problems = [check_schema(value, sub, where) for sub in schema["anyOf"]]
        if all(problems):
            return problems[0] if isinstance(value, Mapping) else f"{where} has the wrong shape ({problems[0]})"
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        ok = False
        for t in names:
            py = _JSON_TYPES.get(t, (object,))
            if isinstance(value, bool) and t in ("integer", "number"):
                continue
            if t == "integer" and isinstance(value, float) and value.is_integer():
                ok = True
            if isinstance(value, py):
                ok = True
        if not ok:
            return f"{where} must be {' or '.join(names)}, got {_json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {', '.join(map(repr, schema['enum']))}, got {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be >= {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be <= {schema['maximum']}, got {value}"
    if isinstance(value, Mapping):
        props: Mapping[str, Any] = schema.get("properties", {})
        extra = sorted(str(k) for k in value if k not in props) if schema.get("additionalProperties") is False else []
        for key in schema.get("required", ()):
            if key not in value:
                msg = f"missing required argument {key!r}" if where == "arguments" else f"{where}: missing {key!r}"
                return msg + (f" (got unexpected {extra[0]!r})" if extra else "")
        if extra:
            return f"unexpected argument {extra[0]!r} (expected: {', '.join(props)})"
        for key, sub in props.items():
            if key in value and not (value[key] is None and key not in schema.get("required", ())):
                problem = check_schema(value[key], sub, key if where == "arguments" else f"{where}.{key}")
                if problem:
                    return problem
    if isinstance(value, (list, tuple)):
        if len(value) < schema.get("minItems", 0):
            return f"{where} needs at least {schema['minItems']} item(s)"
        if "items" in schema:
            for n, item in enumerate(value):
                problem = check_schema(item, schema["items"], f"{where}[{n}]")
                if problem:
                    return problem
    return None


def _json_type(value: Any) -> str:
    for name, py in _JSON_TYPES.items():
        if isinstance(value, py) and not (isinstance(value, bool) and name != "boolean"):
            return name
    return type(value).__name__


def obj(required: Sequence[str] = (), **props: Mapping[str, Any]) -> dict[str, Any]:
    """A closed object schema; keeps tool tables short."""
    return {"type": "object", "properties": dict(props), "required": list(required), "additionalProperties": False}


def prop(type_: str | list[str], description: str, **extra: Any) -> dict[str, Any]:
    return {"type": type_, "description": description, **extra}


@dataclass(frozen=True)
class Tool:
    """One tool of a harness, in that harness's own name and argument shape."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    to_intent: ToIntent
    format: Formatter | None = None

    def schema(self) -> dict[str, Any]:
        """OpenAI function-tool form, which the chat template and servers both take."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}}


def plain_result(result: IntentResult) -> str:
    """Default text of a result: output, and exit code when a command failed."""
    if result.error:
        return result.error if not result.output else f"{result.output}\n{result.error}"
    if result.exit_code not in (None, 0):
        return f"{result.output}\n[exit code {result.exit_code}]".lstrip("\n")
    return result.output


class BaseHarness(Harness):
    """Everything but the tool tables. Subclasses fill in the class attributes."""

    name: str = ""
    system_prompt: ClassVar[str] = ""
    tools: ClassVar[tuple[Tool, ...]] = ()
    call_id_prefix: ClassVar[str] = "call_"
    max_calls_per_turn: ClassVar[int] = 32
    # When a turn has no tool calls the model is done (how every real harness ends a task).
    text_turn_submits: ClassVar[bool] = True
    #: intent name -> its inverse tool mapping; what ``from_intent`` uses (see there).
    reverse: ClassVar[Mapping[str, FromIntent]] = {}

    def __init__(self, workdir: str = "/workspace") -> None:
        self.workdir = workdir
        self._by_name = {t.name: t for t in self.tools}

    # ------------------------------------------------------------ prompt

    def effort_text(self, effort: str) -> str:
        """How this harness states the effort level; subclasses word it their way."""
        return f"Reasoning effort: {effort}."

    def render(self, instruction: str, effort: str | None = None) -> RenderedPrompt:
        if effort is not None and effort not in EFFORT_LEVELS:
            raise ValueError(f"effort must be one of {', '.join(EFFORT_LEVELS)} or None, got {effort!r}")
        system = self.system_prompt.replace("{workdir}", self.workdir)  # not str.format: prompts hold braces
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        if effort is not None:
            # A message of its own, so MOPD can show it to the student only.
            messages.append({"role": "system", "content": self.effort_text(effort), "name": "effort"})
        messages.append({"role": "user", "content": instruction})
        return RenderedPrompt(messages=messages, tools=[t.schema() for t in self.tools])

    # ------------------------------------------------------------ parsing

    def parse(self, output: str | Mapping[str, Any]) -> ParsedTurn:
        try:
            if isinstance(output, str):
                ex = extract_text(output, self.call_id_prefix, self.max_calls_per_turn)
            elif isinstance(output, Mapping):
                ex = extract_message(output, self.call_id_prefix, self.max_calls_per_turn)
            else:
                ex = Extracted("", "", [], [ParseError(f"model output must be text or a message, got {type(output).__name__}")], 0)
        except Exception as exc:  # noqa: BLE001 - the contract is "never raises"; keep the turn as data
            ex = Extracted("", "", [], [ParseError(f"unparseable model output ({type(exc).__name__})")], 0)
        calls: list[ToolCall] = []
        errors = list(ex.errors)
        for raw in ex.calls:
            call = ToolCall(raw.name, raw.arguments, raw.call_id)
            mapped = self.to_intent(call)
            if isinstance(mapped, ParseError):
                errors.append(mapped)
            else:
                calls.append(call)
        return ParsedTurn(text=ex.text, calls=tuple(calls), errors=tuple(errors), reasoning=ex.reasoning, dropped_calls=ex.dropped)

    def to_intent(self, call: ToolCall) -> Intent | ParseError:
        tool = self._by_name.get(call.name)
        if tool is None:
            hint = _closest(call.name, list(self._by_name))
            return ParseError(
                f"unknown tool {call.name!r}{f'; did you mean {hint!r}?' if hint else ''} "
                f"(available: {', '.join(self._by_name)})",
                raw=call.name[:200],
                call_id=call.call_id,
            )
        problem = check_schema(call.arguments, tool.parameters)
        if problem:
            return ParseError(f"{tool.name}: {problem}", call_id=call.call_id)
        try:
            mapped = tool.to_intent(call.arguments)
        except Exception as exc:  # noqa: BLE001 - a tool table bug must not crash a worker either
            return ParseError(f"{tool.name}: invalid arguments ({type(exc).__name__}: {exc})", call_id=call.call_id)
        if isinstance(mapped, str):
            return ParseError(f"{tool.name}: {mapped}", call_id=call.call_id)
        return Intent(mapped.name, mapped.args, call_id=call.call_id, tool=tool.name)

    def turn_intents(self, turn: ParsedTurn) -> list[Intent | ParseError]:
        """The turn's intents in order, then its errors; a plain text turn is a ``submit``."""
        out: list[Intent | ParseError] = []
        for call in turn.calls:
            out.append(self.to_intent(call))
        out.extend(turn.errors)
        if not out and self.text_turn_submits:
            out.append(Intent("submit", {"answer": turn.text}, tool=""))
        return out

    # ------------------------------------------------------------ writing calls (the inverse)

    def from_intent(self, intent: Intent) -> ToolCall:
        """The tool call, in this harness's names and shapes, that ``to_intent`` maps back onto ``intent``.

        Why: scripted policies and the warm-start SFT write canonical intents
        (an oracle's shell script, a submit) and need them said the way each
        harness says them. Exact on the image of ``to_intent``:
        ``to_intent(from_intent(i))`` equals ``i`` (but for ``tool``) for every
        ``i`` this harness's ``to_intent`` can produce. Intents from another
        harness are translated to the nearest equivalent (a string command
        becomes Codex's ``["bash", "-lc", ...]``, seconds become milliseconds).
        Raises ``UnsupportedIntent`` when no tool expresses the intent; a
        ``submit`` on a harness that ends episodes with a text turn is written
        by ``render_turn`` as that text.
        """
        fn = self.reverse.get(intent.name)
        if fn is None:
            raise UnsupportedIntent(
                f"harness {self.name!r} has no tool for intent {intent.name!r} (it has: {', '.join(self.reverse) or 'none'})"
            )
        tool, args = fn(intent.args if isinstance(intent.args, Mapping) else {})
        return ToolCall(tool, {k: v for k, v in args.items() if v is not None}, intent.call_id)

    def render_call(self, call: ToolCall) -> str:
        """The raw text form of ``call`` that ``parse`` accepts (the project chat template's form).

        The markup itself inside an argument (a command that greps for ``<tool_call>``) is written
        with its ``<`` escaped as ``\\u003c``: the JSON means the same string, and the text has no
        opening or closing tag but the call's own. Nothing else is escaped, so ordinary calls
        (``wc -l < FILE``) keep their tokens.
        """
        body = json.dumps({"name": call.name, "arguments": dict(call.arguments)}, ensure_ascii=False)
        for tag in (CALL_OPEN, CALL_CLOSE):
            body = body.replace(tag, "\\u003c" + tag[1:])
        return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"

    def render_turn(self, intents: Sequence[Intent], text: str = "") -> str:
        """A whole assistant turn as raw text: optional prose, then each intent as a call.

        A ``submit`` on a harness without a submit tool (``text_turn_submits``)
        becomes a turn of plain text, the answer (or ``text``), which ``parse``
        + ``turn_intents`` read back as that submit; it must then be the only intent.
        """
        if any(i.name == "submit" for i in intents) and "submit" not in self.reverse and self.text_turn_submits:
            if len(intents) != 1:
                raise UnsupportedIntent(f"harness {self.name!r} submits with a text-only turn; submit must be alone")
            answer = intents[0].args.get("answer")
            return str(answer) if answer not in (None, "") else (text or "Done.")
        calls = [self.render_call(self.from_intent(i)) for i in intents]
        return "\n".join(([text] if text else []) + calls)

    # ------------------------------------------------------------ results

    def error_text(self, message: str) -> str:
        """How this harness wraps an error message; subclasses override."""
        return f"Error: {message}"

    def format_result(self, result: IntentResult) -> Mapping[str, Any]:
        tool = self._by_name.get(result.intent.tool)
        if result.error and not result.ok and result.exit_code is None:
            text = self.error_text(result.error)
        elif tool is not None and tool.format is not None:
            text = tool.format(result)
        else:
            text = plain_result(result)
        return {"role": "tool", "tool_call_id": result.intent.call_id, "name": result.intent.tool or result.intent.name, "content": text}

    def format_error(self, error: ParseError) -> Mapping[str, Any]:
        """A ``tool`` message; ``tool_call_id`` is empty when no call could be identified."""
        return {"role": "tool", "tool_call_id": error.call_id, "name": "error", "content": self.error_text(error.message)}


def inverse_scale(value: float, factor: float, *, integer: bool = False) -> float | int:
    """``x`` with ``x / factor == value`` exactly (a timeout in s back to ms), so round trips are exact."""
    guess = value * factor
    candidates = [round(guess)] if integer else [guess, round(guess), math.nextafter(guess, math.inf), math.nextafter(guess, -math.inf)]
    for c in candidates:
        if c / factor == value:
            return c
    return round(guess) if integer else guess


def shell_string(command: Any, cwd: str | None = None) -> str:
    """A canonical ``exec_shell`` command as one shell string (argv lists quoted), run in ``cwd`` if given."""
    text = command if isinstance(command, str) else shlex.join(str(c) for c in command)
    return f"cd {shlex.quote(cwd)} && {text}" if cwd else text


def _closest(name: str, options: Sequence[str]) -> str | None:
    import difflib

    low = {o.lower(): o for o in options}
    if name.lower() in low:
        return low[name.lower()]
    hits = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return hits[0] if hits else None


__all__ = [
    "BaseHarness",
    "FromIntent",
    "Tool",
    "UnsupportedIntent",
    "check_schema",
    "inverse_scale",
    "obj",
    "plain_result",
    "prop",
    "shell_string",
]
