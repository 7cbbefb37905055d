"""The unit-tests verifier against a scripted pytest: honest reports, and every way to lie or break."""

from __future__ import annotations

import re

import pytest
from verifier_fakes import FakeSandbox, make_episode, make_variant

from agentenv.types import UnitTestsVerifierSpec
from agentenv.verifiers import build_verifier
from agentenv.verifiers.unit_tests import parse_junit
from sandboxes.types import ExecResult

pytestmark = pytest.mark.unit

HIDDEN = {"test_math.py": b"def test_a(): pass\n", "variant.json": b"{}"}


def junit(*cases: tuple[str, str]) -> str:
    body, failures, errors, skipped = [], 0, 0, 0
    for name, status in cases:
        inner = {"failed": "<failure message='x'/>", "error": "<error message='x'/>", "skipped": "<skipped/>"}.get(status, "")
        failures += status == "failed"
        errors += status == "error"
        skipped += status == "skipped"
        body.append(f'<testcase classname="tests.test_math" name="{name}">{inner}</testcase>')
    return (
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{len(cases)}" failures="{failures}" '
        f'errors="{errors}" skipped="{skipped}">{"".join(body)}</testsuite></testsuites>'
    )


def pytest_that(xml: str | None, exit_code: int, *, stdout: str = "", timed_out: bool = False):  # noqa: ANN201
    """A handler playing pytest: writes ``xml`` where --junitxml says, exits ``exit_code``."""

    def handler(sb: FakeSandbox, cmd: str) -> ExecResult:
        match = re.search(r"--junitxml=(\S+)", cmd)
        if match and xml is not None:
            sb.files[match.group(1)] = xml.encode()
        return ExecResult(124 if timed_out else exit_code, stdout, "", timed_out=timed_out)

    return handler


def run(xml: str | None, exit_code: int, spec: UnitTestsVerifierSpec | None = None, **kw):  # noqa: ANN003, ANN201
    sandbox = FakeSandbox(handler=pytest_that(xml, exit_code, **kw))
    verifier = build_verifier(spec or UnitTestsVerifierSpec(), None, make_variant(), hidden=HIDDEN)
    return verifier.verify(sandbox, make_episode()), sandbox


def test_all_passing_is_full_reward() -> None:
    result, _ = run(junit(("test_a", "passed"), ("test_b", "passed")), 0)
    assert (result.reward, result.passed, result.invalid) == (1.0, True, False)
    assert [c.name for c in result.details] == ["tests.test_math.test_a", "tests.test_math.test_b"]


def test_a_failure_is_zero_without_partial_credit_and_a_fraction_with_it() -> None:
    xml = junit(("test_a", "passed"), ("test_b", "failed"))
    assert run(xml, 1)[0].reward == 0.0
    assert run(xml, 1, UnitTestsVerifierSpec(partial_credit=True))[0].reward == 0.5


def test_fail_to_pass_and_pass_to_pass_select_tests_by_id() -> None:
    spec = UnitTestsVerifierSpec(fail_to_pass=["tests/test_math.py::test_b"], pass_to_pass=["test_a"])
    result, _ = run(junit(("test_a", "passed"), ("test_b", "passed"), ("test_other", "failed")), 1, spec)
    assert result.reward == 1.0 and not result.invalid
    assert {c.detail.split(":")[0] for c in result.details} == {"FAIL_TO_PASS", "PASS_TO_PASS"}


def test_a_skipped_or_missing_fail_to_pass_test_fails() -> None:
    spec = UnitTestsVerifierSpec(fail_to_pass=["test_b", "test_missing"])
    result, _ = run(junit(("test_a", "passed"), ("test_b", "skipped")), 0, spec)
    assert result.reward == 0.0 and not result.invalid
    assert "not in the report" in result.details[1].detail


def test_printing_passed_without_a_report_earns_nothing() -> None:
    result, _ = run(None, 0, stdout="test_a PASSED\ntest_b PASSED\n== 2 passed ==")
    assert result.invalid and result.reward == 0.0 and "no JUnit report" in result.reason


def test_a_planted_report_at_a_guessable_path_is_ignored() -> None:
    planted = junit(("test_a", "passed"))
    sandbox = FakeSandbox(
        {"/workspace/report.xml": planted.encode(), "/tmp/report.xml": planted.encode()},
        handler=pytest_that(junit(("test_a", "failed")), 1),
    )
    verifier = build_verifier(UnitTestsVerifierSpec(), None, make_variant(), hidden=HIDDEN)
    assert verifier.verify(sandbox, make_episode()).reward == 0.0


def test_report_and_tests_go_to_fresh_unpredictable_dirs() -> None:
    paths = []
    for _ in range(2):
        _, sandbox = run(junit(("test_a", "passed")), 0)
        command = next(c for c in sandbox.commands if "--junitxml" in c)
        paths.append(re.search(r"--junitxml=(\S+)", command).group(1))  # type: ignore[union-attr]
        assert "python3 -I -m pytest" in command and "--confcutdir" in command and "-p no:cacheprovider" in command
        assert any(p.endswith("/tests/test_math.py") and p.startswith("/tmp/agentenv-tests-") for p in sandbox.files)
    assert paths[0] != paths[1]
    assert all(p.startswith("/tmp/agentenv-report-") for p in paths)


@pytest.mark.parametrize(
    ("xml", "exit_code", "reason"),
    [
        (junit(("test_a", "failed")), 0, "exited 0 but the report has 1 failing"),
        (junit(("test_a", "passed")), 1, "exited 1 but the report has no failing"),
        (junit(), 5, "no tests were collected"),
        (junit(("test_a", "passed")), 3, "internal error"),
        (junit(("test_a", "passed")), 137, "killed"),
        ("<testsuites><testsuite tests='3' failures='0' errors='0'>", 0, "garbled"),
        ("<testsuites><testsuite tests='3' failures='0' errors='0'></testsuite></testsuites>", 0, "garbled"),
        ("<html>not junit</html>", 0, "garbled"),
        (junit(("test_a", "skipped")), 0, "skipped"),
    ],
)
def test_contradictions_and_breakage_are_invalid_never_pass(xml: str, exit_code: int, reason: str) -> None:
    result, _ = run(xml, exit_code)
    assert result.invalid and result.reward == 0.0 and not result.passed
    assert reason in result.reason


def test_timeout_is_invalid() -> None:
    result, _ = run(junit(("test_a", "passed")), 0, timed_out=True)
    assert result.invalid and "timed out" in result.reason


def test_collection_error_is_a_decided_failure() -> None:
    result, _ = run(junit(("test_math", "error")), 2)
    assert not result.invalid and result.reward == 0.0


def test_no_hidden_tests_is_invalid() -> None:
    verifier = build_verifier(UnitTestsVerifierSpec(), None, make_variant(), hidden={"variant.json": b"{}"})
    assert verifier.verify(FakeSandbox(), make_episode()).invalid


def test_parse_junit_reads_both_root_forms() -> None:
    single = junit(("test_a", "passed")).replace("<testsuites>", "").replace("</testsuites>", "")
    assert parse_junit(single).cases[0].status == "passed"


def test_a_crashing_sandbox_becomes_invalid() -> None:
    def boom(_sb: FakeSandbox, _cmd: str) -> ExecResult:
        raise ConnectionError("container vanished")

    verifier = build_verifier(UnitTestsVerifierSpec(), None, make_variant(), hidden=HIDDEN)
    result = verifier.verify(FakeSandbox(handler=boom), make_episode())
    assert result.invalid and "container vanished" in result.reason and result.duration_s >= 0
