"""``from_intent`` is the inverse of ``to_intent``, on every harness, for every intent it can produce.

The property: draw a valid tool call from a tool's own JSON schema, map it to
an intent ``i`` (skipping calls the tool rejects), then
``to_intent(from_intent(i)) == i`` (``tool`` aside: Codex's shell can carry a
patch). So everything a harness can say round-trips, and the warm-start SFT
can re-render any canonical trajectory through any harness that has the tools.
Also: the text ``render_call`` writes parses back to the same call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentenv.intents import Intent, ParseError, ToolCall
from rollout.harnesses import get_harness, list_harnesses
from rollout.harnesses.base import BaseHarness, UnsupportedIntent

pytestmark = pytest.mark.unit

HARNESSES = [h for h in list_harnesses() if isinstance(get_harness(h), BaseHarness)]
PATCH = "*** Begin Patch\n*** Add File: notes/a.txt\n+hello\n+world\n*** End Patch"
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


def _from_schema(schema: Mapping[str, Any], key: str = "") -> st.SearchStrategy[Any]:
    """Values valid for the schema subset harness tools use (``base.check_schema``)."""
    if "anyOf" in schema:
        return st.one_of([_from_schema(s, key) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    t = schema.get("type")
    t = t[0] if isinstance(t, list) else t
    if t == "object":
        props: Mapping[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", ()))
        optional = [k for k in props if k not in required]
        return st.fixed_dictionaries(
            {k: _from_schema(props[k], k) for k in required},
            optional={k: st.one_of(st.none(), _from_schema(props[k], k)) for k in optional},
        )
    if t == "array":
        return st.lists(_from_schema(schema.get("items", {"type": "string"}), key), min_size=max(schema.get("minItems", 0), 0), max_size=3)
    if t in ("integer", "number"):
        low, high = schema.get("minimum", -50), schema.get("maximum", 10**6)
        ints = st.integers(low, high)
        return ints if t == "integer" else st.one_of(ints, st.floats(low, high, allow_nan=False))
    if t == "boolean":
        return st.booleans()
    if key in ("file_path", "path", "directory", "cwd", "workdir"):
        return _text.map(lambda s: "/workspace/" + s.replace("\0", ""))
    if key == "input":
        return st.just(PATCH)
    return _text


@st.composite
def _call(draw: st.DrawFn, harness: BaseHarness) -> ToolCall:
    tool = draw(st.sampled_from(harness.tools))
    return ToolCall(tool.name, draw(_from_schema(tool.parameters)), call_id="call_x")


@pytest.mark.parametrize("name", HARNESSES)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_to_intent_of_from_intent_is_identity(name: str, data: st.DataObject) -> None:
    harness = get_harness(name)
    assert isinstance(harness, BaseHarness)
    intent = harness.to_intent(data.draw(_call(harness)))
    assume(not isinstance(intent, ParseError))
    assert isinstance(intent, Intent)
    call = harness.from_intent(intent)
    again = harness.to_intent(call)
    assert not isinstance(again, ParseError), (call, again)
    assert replace(again, tool="") == replace(intent, tool=""), (call, intent, again)
    parsed = harness.parse(harness.render_call(call))
    assert not parsed.errors, parsed.errors
    assert [(c.name, dict(c.arguments)) for c in parsed.calls] == [(call.name, dict(call.arguments))]


@pytest.mark.parametrize("name", HARNESSES)
def test_every_harness_runs_a_shell_script_and_submits(name: str) -> None:
    """What the scripted oracle policy needs from every harness: a long shell script, then a submit."""
    harness = get_harness(name)
    assert isinstance(harness, BaseHarness)
    script = "cat > /workspace/a.sh <<'EOF'\necho \"$1\" | grep -c '{x}'\nEOF\necho 42"
    shell = Intent("exec_shell", {"command": script, "timeout_s": 30})
    turn = harness.parse(harness.render_turn([shell]))
    [intent] = harness.turn_intents(turn)
    assert isinstance(intent, Intent) and intent.name == "exec_shell"
    command = intent.args["command"]
    assert (command[-1] if isinstance(command, list) else command) == script
    assert intent.args["timeout_s"] == 30
    done = harness.turn_intents(harness.parse(harness.render_turn([Intent("submit", {"answer": "42"})])))
    assert [(i.name, i.args.get("answer")) for i in done if isinstance(i, Intent)] == [("submit", "42")]


def test_missing_tool_says_which() -> None:
    with pytest.raises(UnsupportedIntent, match="codex.*read_file"):
        get_harness("codex").from_intent(Intent("read_file", {"path": "a"}))


@pytest.mark.parametrize("name", HARNESSES)
@pytest.mark.parametrize("command", ["<tool_call>", "echo '</tool_call>' && grep -c '<tool_call>' log"])
def test_the_markup_inside_an_argument_round_trips(name: str, command: str) -> None:
    """A command that holds the call markup itself (hypothesis found ``['<tool_call>']`` on codex):
    ``render_call`` escapes the tag's ``<`` inside the JSON, so the text parses back to the same call."""
    harness = get_harness(name)
    assert isinstance(harness, BaseHarness)
    call = harness.from_intent(Intent("exec_shell", {"command": command, "timeout_s": 10}))
    text = harness.render_call(call)
    assert text.count("<tool_call>") == 1 and text.count("</tool_call>") == 1
    parsed = harness.parse(text)
    assert not parsed.errors, parsed.errors
    assert [(c.name, dict(c.arguments)) for c in parsed.calls] == [(call.name, dict(call.arguments))]
