"""Every nasty case in corpus/ parses to the expected calls and errors, and each error formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentenv.intents import Intent, ParseError
from rollout.harnesses import get_harness, list_harnesses

pytestmark = pytest.mark.unit
CORPUS = Path(__file__).parent / "corpus"
EXPECTED: dict[str, list] = json.loads((CORPUS / "expected.json").read_text())


def load(name: str) -> object:
    raw = (CORPUS / name).read_text()
    return json.loads(raw) if name.endswith(".json") else raw


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_case(name: str) -> None:
    harness_name, n_calls, n_errors = EXPECTED[name]
    h = get_harness(harness_name)
    turn = h.parse(load(name))  # type: ignore[arg-type]
    assert (len(turn.calls), len(turn.errors)) == (n_calls, n_errors), turn.errors
    for err in turn.errors:
        msg = h.format_error(err)
        assert msg["role"] == "tool" and err.message in msg["content"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("harness_name", list_harnesses())
def test_no_case_crashes_any_harness(name: str, harness_name: str) -> None:
    h = get_harness(harness_name)
    turn = h.parse(load(name))  # type: ignore[arg-type]
    for item in h.turn_intents(turn):
        assert isinstance(item, (Intent, ParseError))


@pytest.mark.parametrize("harness_name", list_harnesses())
def test_thousands_of_calls_are_capped(harness_name: str) -> None:
    h = get_harness(harness_name)
    call = '<tool_call>{"name": "x", "arguments": {}}</tool_call>'
    turn = h.parse(call * 5000)
    cap = h.max_calls_per_turn  # type: ignore[attr-defined]
    assert turn.dropped_calls == 5000 - cap
    assert len(turn.errors) == cap + 1 and "too many tool calls" in turn.errors[0].message
    many = {"tool_calls": [{"id": str(i), "function": {"name": "x", "arguments": "{}"}} for i in range(5000)]}
    assert h.parse(many).dropped_calls == 5000 - cap
