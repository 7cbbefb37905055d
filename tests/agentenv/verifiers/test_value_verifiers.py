"""Files, answer and exit-code verifiers, the comparison helpers, the registry and the composite."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from verifier_fakes import FakeReplay, make_episode, make_variant

from agentenv.errors import TaskSpecError
from agentenv.types import (
    AnswerVerifierSpec,
    CheckResult,
    ExitCodeVerifierSpec,
    FileCheck,
    FilesVerifierSpec,
    UnitTestsVerifierSpec,
    VerifierResult,
)
from agentenv.verifiers import BUILDERS, build_composite, build_verifier
from agentenv.verifiers.compare import csv_equal, json_equal, normalize_text, parse_csv, parse_number
from agentenv.verifiers.composite import CompositeVerifier, Weighted
from sandboxes.testing import FakeSandbox
from sandboxes.types import ExecResult

pytestmark = pytest.mark.unit


def files(*checks: FileCheck, partial: bool = False, sandbox: FakeSandbox, oracle: FakeReplay | None = None, **params):  # noqa: ANN003, ANN201
    spec = FilesVerifierSpec(checks=list(checks), partial_credit=partial)
    return build_verifier(spec, None, make_variant(**params), hidden={}).verify(sandbox, make_episode(oracle=oracle, **params))


def test_files_exists_contains_equals_with_templates() -> None:
    sb = FakeSandbox({"/workspace/out.txt": b"hello 42\n"})
    ok = files(FileCheck(path="/workspace/out.txt", contains=["hello"], equals="hello {{ n }}"), sandbox=sb, n=42)
    assert ok.reward == 1.0 and ok.passed
    bad = files(FileCheck(path="/workspace/out.txt", equals="hello {{ n }}"), sandbox=sb, n=7)
    assert bad.reward == 0.0 and not bad.invalid


def test_files_excludes_with_templates() -> None:
    sb = FakeSandbox({"/workspace/out.txt": b"def order_total(): pass\n"})
    assert files(FileCheck(path="/workspace/out.txt", excludes=["compute_{{ n }}"]), sandbox=sb, n="total").reward == 1.0
    assert files(FileCheck(path="/workspace/out.txt", excludes=["order_{{ n }}"]), sandbox=sb, n="total").reward == 0.0


def test_missing_file_is_a_decided_zero_and_absent_checks_work() -> None:
    sb = FakeSandbox()
    assert files(FileCheck(path="/nope"), sandbox=sb).reward == 0.0
    assert files(FileCheck(path="/nope", exists=False), sandbox=sb).reward == 1.0


def test_json_and_csv_with_tolerance_and_partial_credit() -> None:
    sb = FakeSandbox({"/r.json": json.dumps({"a": 1.0004, "b": [1, "x"]}).encode(), "/r.csv": b"k,v\na, 2.0001\n"})
    good_json = FileCheck(path="/r.json", json_equals={"b": [1, "x"], "a": "{{ a }}"}, tolerance=0.001)
    good_csv = FileCheck(path="/r.csv", csv_equals=[["k", "v"], ["a", "2"]], tolerance=0.001)
    bad_csv = FileCheck(path="/r.csv", csv_equals=[["k", "v"], ["a", "3"]])
    assert files(good_json, good_csv, sandbox=sb, a=1).reward == 1.0
    mixed = files(good_json, bad_csv, sandbox=sb, partial=True, a=1)
    assert 0 < mixed.reward < 1 and not mixed.passed


def test_match_oracle_compares_with_the_replayed_file_and_needs_a_replay() -> None:
    oracle = FakeReplay(FakeSandbox({"/r.json": b'{"x": 1.0}'}))
    check = FileCheck(path="/r.json", match_oracle="json", tolerance=0.01)
    assert files(check, sandbox=FakeSandbox({"/r.json": b'{"x": 1.001}'}), oracle=oracle).reward == 1.0
    assert files(check, sandbox=FakeSandbox({"/r.json": b'{"x": 2}'}), oracle=oracle).reward == 0.0
    assert files(check, sandbox=FakeSandbox({"/r.json": b"{}"})).invalid
    failed = files(check, sandbox=FakeSandbox({"/r.json": b"{}"}), oracle=FakeReplay(error="solve.sh exit 1"))
    assert failed.invalid and failed.reason.startswith("oracle failed")


def answer(spec: AnswerVerifierSpec, given: str | None, sandbox: FakeSandbox | None = None, oracle: FakeReplay | None = None, **params):  # noqa: ANN003, ANN201
    verifier = build_verifier(spec, None, make_variant(**params), hidden={})
    return verifier.verify(sandbox or FakeSandbox(), make_episode(final_answer=given, oracle=oracle, **params))


@pytest.mark.parametrize(
    ("mode", "expected", "given", "ok"),
    [
        ("exact", "Paris", "Paris", True),
        ("exact", "Paris", "paris", False),
        ("normalized", "São Paulo", "  sao paulo. ", True),
        ("numeric", "{{ n }}", "1,234.0", True),
        ("numeric", "{{ n }}", "$1234", True),
        ("numeric", "{{ n }}", "1235", False),
        ("numeric", "{{ n }}", "about twelve", False),
    ],
)
def test_answer_modes(mode: str, expected: str, given: str, ok: bool) -> None:
    result = answer(AnswerVerifierSpec(expected=expected, mode=mode), given, n=1234)
    assert result.passed is ok and not result.invalid


def test_answer_from_file_when_none_submitted_and_none_at_all_is_zero() -> None:
    spec = AnswerVerifierSpec(expected="7", mode="numeric", file="/workspace/answer.txt")
    assert answer(spec, None, FakeSandbox({"/workspace/answer.txt": b"7\n"})).reward == 1.0
    nothing = answer(spec, None)
    assert nothing.reward == 0.0 and not nothing.invalid


def test_answer_against_the_oracles_answer() -> None:
    spec = AnswerVerifierSpec(expected="{{ oracle_answer }}", mode="normalized")
    assert answer(spec, "Billing 17", oracle=FakeReplay(answer="billing 17")).reward == 1.0
    assert answer(spec, "x").invalid  # no replay available: cannot decide
    assert answer(spec, "x", oracle=FakeReplay(error="boom")).reason.startswith("oracle failed")


def test_exit_code_verifier() -> None:
    def handler(_sb: FakeSandbox, cmd: str) -> ExecResult:
        if "sleep" in cmd:
            return ExecResult(124, "", "", timed_out=True)
        return ExecResult(0 if "good" in cmd else 3, "", "")

    def run(cmd: str) -> VerifierResult:
        spec = ExitCodeVerifierSpec(command=cmd)
        return build_verifier(spec, None, make_variant(), hidden={"check.sh": b""}).verify(FakeSandbox(handler=handler), make_episode())

    assert run("good").reward == 1.0
    assert run("bad").reward == 0.0 and not run("bad").invalid
    assert run("sleep 100").invalid


def test_registry_covers_every_kind_and_builds_them() -> None:
    assert set(BUILDERS) == {"unit_tests", "db_state", "files", "answer", "exit_code", "calls"}
    with pytest.raises(TaskSpecError, match="did you mean"):
        build_verifier(UnitTestsVerifierSpec().model_copy(update={"type": "unit_test"}), None, make_variant())


class Fixed:
    def __init__(self, name: str, result: VerifierResult) -> None:
        self.name, self.result = name, result

    def verify(self, sandbox: object, episode: object) -> VerifierResult:
        return self.result


def test_composite_weights_and_invalid_parts() -> None:
    good = Fixed("a", VerifierResult(1.0, True, details=(CheckResult("c", True, 1.0),)))
    bad = Fixed("b", VerifierResult(0.0, False))
    broken = Fixed("c", VerifierResult(0.0, False, invalid=True, reason="no report"))
    result = CompositeVerifier([Weighted(good, 2.0), Weighted(bad, 1.0)]).verify(FakeSandbox(), make_episode())
    assert result.reward == pytest.approx(2 / 3) and not result.passed and not result.invalid
    assert "a/c" in [d.name for d in result.details]
    hole = CompositeVerifier([Weighted(good, 1.0), Weighted(broken, 1.0)]).verify(FakeSandbox(), make_episode())
    assert hole.invalid and "no report" in hole.reason


def test_composite_survives_a_third_party_verifier_that_raises() -> None:
    class Raises:
        name = "raises"

        def verify(self, sandbox: object, episode: object) -> VerifierResult:
            raise RuntimeError("bug")

    result = CompositeVerifier([Weighted(Raises(), 1.0)]).verify(FakeSandbox(), make_episode())
    assert result.invalid and "bug" in result.reason


def test_build_composite_names_duplicates_apart() -> None:
    spec = FilesVerifierSpec(checks=[FileCheck(path="/x")])
    composite = build_composite([spec, spec], None, make_variant())
    assert [p.verifier.name for p in composite.parts] == ["files", "files#2"]


def test_compare_helpers() -> None:
    assert parse_number("  -3.5e2 units") == -350.0 and parse_number("n/a") is None
    assert normalize_text("Hello,   WORLD!") == "hello world"
    assert csv_equal(parse_csv("a,1\n\nb,2\n"), [["a", "1.0"], ["b", "2"]], 1e-9)[0]
    ok, why = json_equal({"a": [1, 2]}, {"a": [1, 3]}, 0.0)
    assert not ok and "$.a[1]" in why


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@given(json_values)
def test_json_equal_is_reflexive(value: object) -> None:
    assert json_equal(value, json.loads(json.dumps(value)), 1e-9)[0]
