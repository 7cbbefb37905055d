"""Whose fault an invalid is: agent-caused invalids are failures (reward 0, flagged), the grader's are excluded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "verifiers"))
from verifier_fakes import make_episode, make_variant  # noqa: E402

from agentenv.errors import TaskSpecError  # noqa: E402
from agentenv.types import (  # noqa: E402
    AnswerVerifierSpec,
    FileCheck,
    FilesVerifierSpec,
    UnitTestsVerifierSpec,
    VerifierResult,
)
from agentenv.verifiers import build_composite, build_verifier  # noqa: E402
from agentenv.verifiers.composite import CompositeVerifier, Weighted  # noqa: E402
from rollout.attempt import verifier_record  # noqa: E402
from sandboxes.testing import FakeSandbox  # noqa: E402

pytestmark = pytest.mark.unit


class Fixed:
    def __init__(self, name: str, result: VerifierResult) -> None:
        self.name, self.result = name, result

    def verify(self, sandbox: object, episode: object) -> VerifierResult:
        return self.result


AGENT = VerifierResult(0.0, False, True, "hang", invalid_cause="agent")
GRADER = VerifierResult(0.0, False, True, "oracle broke", invalid_cause="grader")
PASS = VerifierResult(1.0, True)


def test_an_invalid_result_without_a_cause_is_the_graders_and_a_decided_one_has_none() -> None:
    assert VerifierResult(0.0, False, True, "x").invalid_cause == "grader"
    assert VerifierResult(1.0, True).invalid_cause is None and not VerifierResult(1.0, True).agent_invalid
    assert AGENT.agent_invalid
    with pytest.raises(ValueError, match="invalid_cause"):
        VerifierResult(1.0, True, invalid_cause="agent")
    with pytest.raises(ValueError, match="invalid_cause"):
        VerifierResult(0.0, False, True, invalid_cause="nobody")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("parts", "cause"),
    [((AGENT, PASS), "agent"), ((AGENT, GRADER), "grader"), ((GRADER, PASS), "grader"), ((AGENT, AGENT), "agent")],
)
def test_a_composite_is_the_agents_invalid_only_when_every_invalid_part_is(parts: tuple[VerifierResult, ...], cause: str) -> None:
    composite = CompositeVerifier([Weighted(Fixed(f"v{i}", r), 1.0) for i, r in enumerate(parts)])
    result = composite.verify(FakeSandbox(), make_episode())  # type: ignore[arg-type]
    assert result.invalid and result.invalid_cause == cause and result.reward == 0.0


def test_all_zero_weights_are_a_spec_error_naming_the_field_and_invalid_if_built_by_hand() -> None:
    specs = [AnswerVerifierSpec(expected="1", weight=0), AnswerVerifierSpec(expected="2", weight=0)]
    with pytest.raises(TaskSpecError, match=r"verifiers\[\*\]\.weight"):
        build_composite(specs, None, make_variant(), hidden={})
    composite = CompositeVerifier([Weighted(Fixed("a", PASS), 0.0)])
    result = composite.verify(FakeSandbox(), make_episode())  # type: ignore[arg-type]
    assert result.invalid and not result.passed and result.invalid_cause == "grader"


def test_the_trajectory_records_whose_invalid_it_is_and_the_tampering_flag() -> None:
    flagged = VerifierResult(0.0, False, True, "x", extra={"tampering": {"count": 1}}, invalid_cause="agent")
    record = verifier_record(flagged)
    assert record["invalid_cause"] == "agent" and record["agent_invalid"] is True and record["tampering"] == {"count": 1}
    assert verifier_record(GRADER)["agent_invalid"] is False and verifier_record(PASS)["invalid_cause"] is None


# ---------------------------------------------------------------- files and answers: what is at a graded path


def files_result(special: dict[str, object], files: dict[str, bytes] | None = None, **check: object) -> VerifierResult:
    spec = FilesVerifierSpec(checks=[FileCheck(path="/workspace/out.txt", **check)])  # type: ignore[arg-type]
    sandbox = FakeSandbox({"/workspace/keep": b"1", **(files or {})}, special=special)
    return build_verifier(spec, None, make_variant(), hidden={}).verify(sandbox, make_episode())


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("dir", "directory"), ("symlink", "symlink"), (1 << 40, "over the")],
    ids=["directory", "symlink", "huge-sparse"],
)
def test_a_directory_symlink_or_huge_file_where_a_file_is_graded_is_the_agents_invalid(kind: object, reason: str) -> None:
    result = files_result({"/workspace/out.txt": kind}, contains=["ok"])
    assert result.invalid and result.invalid_cause == "agent" and result.reward == 0.0 and reason in result.reason


def test_a_fifo_where_a_file_is_graded_is_never_opened_and_fails() -> None:
    result = files_result({"/workspace/out.txt": "fifo"}, contains=["ok"])  # the fake raises if it is read
    assert result.reward == 0.0 and not result.passed


def test_reads_are_capped() -> None:
    spec = FilesVerifierSpec(checks=[FileCheck(path="/workspace/out.txt", contains=["ok"])])
    sandbox = FakeSandbox({"/workspace/out.txt": b"ok"})
    assert build_verifier(spec, None, make_variant(), hidden={}).verify(sandbox, make_episode()).reward == 1.0
    assert sandbox.reads == [("/workspace/out.txt", 8 << 20)]


def test_an_answer_file_that_is_a_fifo_or_a_directory_does_not_hang() -> None:
    spec = AnswerVerifierSpec(expected="42", file="/workspace/answer.txt")
    verifier = build_verifier(spec, None, make_variant(), hidden={})
    fifo = verifier.verify(FakeSandbox(special={"/workspace/answer.txt": "fifo"}), make_episode())
    assert fifo.reward == 0.0 and not fifo.invalid
    folder = verifier.verify(FakeSandbox(special={"/workspace/answer.txt": "dir"}), make_episode())
    assert folder.invalid and folder.invalid_cause == "agent"


def test_a_timeout_of_an_exit_code_check_is_the_agents() -> None:
    from agentenv.types import ExitCodeVerifierSpec
    from sandboxes.types import ExecResult

    sandbox = FakeSandbox(handler=lambda _sb, _cmd: ExecResult(124, "", "", timed_out=True))
    result = build_verifier(ExitCodeVerifierSpec(command="./check"), None, make_variant(), hidden={}).verify(sandbox, make_episode())
    assert result.invalid and result.invalid_cause == "agent"


def test_unit_tests_spec_takes_the_tampering_option() -> None:
    assert UnitTestsVerifierSpec().detect_tampering == "strict"
    with pytest.raises(ValueError, match="detect_tampering"):
        UnitTestsVerifierSpec(detect_tampering="maybe")  # type: ignore[arg-type]
