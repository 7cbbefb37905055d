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


# ---------------------------------------------------------------- no opting out: grade_episode's evidence rule


class UndecidableTask:
    """Grading is invalid "by the grader" wherever ``/workspace/broken`` exists (the agent can plant it);
    ``everywhere=True`` makes it invalid for every state, the oracle's too (a broken task)."""

    id = "t/undecidable"
    folder = None

    def __init__(self, *, everywhere: bool = False, raises: BaseException | None = None) -> None:
        self.everywhere, self.raises = everywhere, raises
        self.graded: list[str] = []

    def sandbox_spec(self, *, build: bool = True) -> object:
        from sandboxes.types import SandboxSpec

        return SandboxSpec(image="fake")

    def hidden_paths(self) -> list[str]:
        return []

    def hidden_files(self, variant: object) -> dict[str, bytes]:
        return {}

    def setup(self, sandbox: FakeSandbox, variant: object) -> None:
        sandbox.write_file("/workspace/input.txt", b"1")

    def oracle(self, sandbox: FakeSandbox, variant: object) -> str:
        sandbox.write_file("/workspace/answer.txt", b"42")
        return "42"

    def grade(self, sandbox: FakeSandbox, episode: object) -> VerifierResult:
        self.graded.append(sandbox.id)
        if self.raises is not None and "/workspace/broken" in sandbox.files:
            raise self.raises
        if self.everywhere or "/workspace/broken" in sandbox.files:
            return VerifierResult(0.0, False, True, "pytest exited 4 (usage error): our invocation is wrong")
        return VerifierResult(1.0 if sandbox.files.get("/workspace/answer.txt") == b"42" else 0.0, True)


def _grade(task: UndecidableTask) -> VerifierResult:
    from agentenv.grading import clear_oracle_cache, grade_episode
    from sandboxes.testing import FakeBackend

    backend = FakeBackend()
    agent = backend.create(task.sandbox_spec())  # type: ignore[arg-type]
    task.setup(agent, make_variant())
    agent.write_file("/workspace/broken", b"advmark")  # what the agent left: grading cannot decide on it
    if not getattr(task, "keep_cache", False):
        clear_oracle_cache()
    return grade_episode(backend, agent, task, make_episode())  # type: ignore[arg-type]


def test_an_invalid_the_oracles_state_does_not_share_is_the_agents_failure() -> None:
    """Before issue 26 this came back ``invalid_cause="grader"``: excluded from training, a free exit."""
    task = UndecidableTask()
    result = _grade(task)
    assert result.invalid and result.invalid_cause == "agent" and result.reward == 0.0, result
    assert "oracle's final state grades decided" in result.extra["invalid_evidence"]
    assert len(task.graded) == 2  # the agent's state, then the oracle control
    task.keep_cache = True  # type: ignore[attr-defined]
    again = _grade(task)
    assert again.invalid_cause == "agent" and len(task.graded) == 3, "a decided control is cached per variant"
    record = verifier_record(again)
    assert record["agent_invalid"] and record["invalid_evidence"] == again.extra["invalid_evidence"]


def test_an_invalid_the_oracles_state_shares_stays_the_graders_and_is_never_cached() -> None:
    task = UndecidableTask(everywhere=True)
    result = _grade(task)
    assert result.invalid and result.invalid_cause == "grader", result
    assert "the oracle's state grades invalid too" in result.extra["invalid_evidence"]
    task.keep_cache = True  # type: ignore[attr-defined]
    _grade(task)
    assert len(task.graded) == 4, "an invalid control is run again by the next episode (it may pass)"


def test_a_host_fault_raised_by_the_sandbox_stays_the_graders_without_a_control() -> None:
    from sandboxes.errors import SandboxLost

    task = UndecidableTask(raises=SandboxLost("container vanished (daemon: no such container)"))
    result = _grade(task)
    assert result.invalid and result.invalid_cause == "grader" and "host fault: SandboxLost" in result.extra["invalid_evidence"]
    assert len(task.graded) == 1, "a host fault needs no oracle control"
    crash = UndecidableTask(raises=RuntimeError("a bug the agent's state triggers"))
    assert _grade(crash).invalid_cause == "agent", "a crash the oracle's state does not trigger is the agent's"


def test_a_channel_the_episode_tampered_with_is_no_host_fault() -> None:
    from sandboxes.errors import SandboxTampered

    task = UndecidableTask(raises=SandboxTampered("an answer on the agent channel failed authentication"))
    result = _grade(task)
    assert result.invalid and result.invalid_cause == "agent", result
