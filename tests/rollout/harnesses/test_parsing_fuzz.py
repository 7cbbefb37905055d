"""Hypothesis: no model output crashes any harness parser; errors always format."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentenv.intents import Intent, ParsedTurn, ParseError
from rollout.harnesses import get_harness, list_harnesses

pytestmark = pytest.mark.unit
HARNESSES = {n: get_harness(n) for n in list_harnesses()}
TOOL_NAMES = sorted({t["function"]["name"] for h in HARNESSES.values() for t in h.render("x").tools})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
markup = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"name"', ":", ",", "\n", "*** Begin Patch"])
texty = st.lists(st.one_of(markup, st.text(max_size=20)), max_size=30).map("".join)
calls = st.builds(
    lambda name, args, raw: f"<tool_call>{json.dumps({'name': name, 'arguments': args}) if not raw else raw}</tool_call>",
    st.sampled_from(TOOL_NAMES) | st.text(max_size=8),
    st.dictionaries(st.sampled_from(["command", "file_path", "path", "pattern", "input", "todos", "plan", "edit", "timeout"]) | st.text(max_size=5), json_values, max_size=4),
    st.none() | texty,
)
outputs = st.one_of(texty, st.lists(st.one_of(calls, texty), max_size=6).map("".join))
messages = st.fixed_dictionaries(
    {},
    optional={
        "content": st.none() | st.text(max_size=50) | json_values,
        "reasoning_content": json_values,
        "tool_calls": st.lists(
            st.fixed_dictionaries({}, optional={"id": json_values, "type": st.sampled_from(["function", "custom"]),
                                                "function": st.fixed_dictionaries({}, optional={"name": st.sampled_from(TOOL_NAMES) | json_values, "arguments": json_values | st.text(max_size=40)}),
                                                "custom": json_values}) | json_values,
            max_size=5,
        ) | json_values,
    },
)


def check(name: str, out: object) -> None:
    h = HARNESSES[name]
    turn = h.parse(out)  # type: ignore[arg-type]
    assert isinstance(turn, ParsedTurn)
    for call in turn.calls:
        assert isinstance(h.to_intent(call), Intent)
    for item in h.turn_intents(turn):
        if isinstance(item, ParseError):
            assert isinstance(h.format_error(item)["content"], str)


@pytest.mark.parametrize("name", sorted(HARNESSES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(out=outputs)
def test_text_never_crashes(name: str, out: str) -> None:
    check(name, out)


@pytest.mark.parametrize("name", sorted(HARNESSES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(out=messages)
def test_messages_never_crash(name: str, out: dict) -> None:
    check(name, out)


@settings(max_examples=100, deadline=None)
@given(out=st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")) | st.integers() | st.none())
def test_garbage_of_any_type(out: object) -> None:
    for name in HARNESSES:
        check(name, out)
