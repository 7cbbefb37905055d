"""The unit-tests verifier against a scripted grading exec: honest runs, and every way to lie or break.

``FakePytest`` plays the preflight, the streaming plugin, pytest's exit and its JUnit report; each
test below bends one of them the way a cheat (or a breakage) would and checks the verdict and
whose fault the verifier says it is.
"""

from __future__ import annotations

import json
import re

import pytest
from verifier_fakes import FakePytest, FakeReplay, junit_xml, make_episode, make_variant

from agentenv.types import UnitTestsVerifierSpec
from agentenv.verifiers import build_verifier
from agentenv.verifiers.pytest_outcomes import Stream, junit_address, outcomes, parse_junit, parse_stream
from agentenv.verifiers.unit_tests import PLUGIN
from sandboxes.testing import FakeSandbox
from sandboxes.types import ExecResult

pytestmark = pytest.mark.unit

HIDDEN = {"test_math.py": b"def test_a(): pass\n", "variant.json": b"{}"}


def run(handler, spec: UnitTestsVerifierSpec | None = None, oracle=None, **files):  # noqa: ANN001, ANN003, ANN201
    sandbox = FakeSandbox(files, handler=handler)
    verifier = build_verifier(spec or UnitTestsVerifierSpec(), None, make_variant(), hidden=HIDDEN)
    return verifier.verify(sandbox, make_episode(oracle=oracle)), sandbox


def agent_invalid(result) -> bool:  # noqa: ANN001
    return result.invalid and result.invalid_cause == "agent" and result.reward == 0.0 and not result.passed


# ---------------------------------------------------------------- honest runs


def test_all_passing_is_full_reward() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), ("test_b", "passed")))
    assert (result.reward, result.passed, result.invalid, result.invalid_cause) == (1.0, True, False, None)
    assert [c.name for c in result.details] == ["tests.test_math.test_a", "tests.test_math.test_b"]
    assert result.extra["stream"] == "checked"


def test_a_failure_is_zero_without_partial_credit_and_a_fraction_with_it() -> None:
    cases = (("test_a", "passed"), ("test_b", "failed"))
    assert run(FakePytest(*cases))[0].reward == 0.0
    half = run(FakePytest(*cases), UnitTestsVerifierSpec(partial_credit=True))[0]
    assert half.reward == 0.5 and not half.invalid


def test_fail_to_pass_and_pass_to_pass_select_tests_by_id() -> None:
    spec = UnitTestsVerifierSpec(fail_to_pass=["tests/test_math.py::test_b"], pass_to_pass=["test_a"])
    result, _ = run(FakePytest(("test_a", "passed"), ("test_b", "passed"), ("test_other", "failed")), spec)
    assert result.reward == 1.0 and not result.invalid
    assert {c.detail.split(":")[0] for c in result.details} == {"FAIL_TO_PASS", "PASS_TO_PASS"}


def test_a_skipped_or_missing_fail_to_pass_test_fails() -> None:
    spec = UnitTestsVerifierSpec(fail_to_pass=["test_b", "test_missing"])
    result, _ = run(FakePytest(("test_a", "passed"), ("test_b", "skipped")), spec)
    assert result.reward == 0.0 and not result.invalid
    assert "not in the report" in result.details[1].detail


def test_the_grading_exec_is_isolated_and_the_nonce_travels_on_stdin_only() -> None:
    seen = []
    for _ in range(2):
        _, sandbox = run(FakePytest(("test_a", "passed")))
        argv, env, stdin = sandbox.grading_exec()
        command = " ".join(argv)
        nonce = (stdin or b"").decode().strip()
        assert len(nonce) == 32 and nonce not in command and nonce not in json.dumps(env)
        assert "python3 -I -B" in command and "--confcutdir" in command and "-p no:cacheprovider" in command
        assert argv[argv.index("-p") + 1] == PLUGIN and "unset PYTEST_ADDOPTS PYTEST_PLUGINS" in command
        assert env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1" and env["BASH_ENV"] == ""
        assert argv[6].startswith("/tmp/agentenv-report-") and argv[4].startswith("/tmp/agentenv-tools-")
        seen.append((nonce, argv[6]))
    assert seen[0][0] != seen[1][0] and seen[0][1] != seen[1][1]


def test_staged_tests_tools_and_reports_are_removed_afterwards() -> None:
    result, sandbox = run(FakePytest(("test_a", "passed")))
    assert result.reward == 1.0
    assert not [p for p in sandbox.files if p.startswith("/tmp/agentenv-")], sorted(sandbox.files)


# ---------------------------------------------------------------- cheats: each an agent-caused invalid


def test_printing_passed_onto_the_stream_is_caught() -> None:
    result, _ = run(FakePytest(("test_a", "failed"), lines=["test_a PASSED", "== 1 passed =="]))
    assert agent_invalid(result) and "nonce" in result.reason


def test_an_atexit_hook_rewriting_the_junit_report_to_all_pass_is_caught() -> None:
    cheat = FakePytest(("test_a", "failed"), ("test_b", "passed"), junit=(("test_a", "passed"), ("test_b", "passed")),
                       exit_code=None)
    result, _ = run(cheat)
    assert agent_invalid(result) and "disagrees with the streamed outcomes" in result.reason


def test_a_report_naming_other_tests_is_caught() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), junit=junit_xml(("test_a", "passed"), ("test_z", "passed"))))
    assert agent_invalid(result) and "other tests" in result.reason


def test_a_forged_line_with_a_guessed_nonce_is_caught() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), nonce="0" * 32))
    assert agent_invalid(result) and "nonce" in result.reason


def test_a_duplicate_outcome_is_caught() -> None:
    class Dup(FakePytest):
        def __call__(self, sb, cmd):  # noqa: ANN001, ANN204
            result = super().__call__(sb, cmd)
            lines = result.stdout.splitlines()
            call = next(line for line in lines if '"when":"call"' in line)
            lines.insert(lines.index(call) + 1, call.replace('"failed"', '"passed"'))
            return ExecResult(result.exit_code, "\n".join(lines) + "\n", "")

    result, _ = run(Dup(("test_a", "failed")))
    assert agent_invalid(result) and "second call outcome" in result.reason


def test_os_exit_before_the_session_finishes_is_caught() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), finish=False, junit=None, exit_code=0))
    assert agent_invalid(result) and "no session-finish line" in result.reason


def test_an_exit_code_changed_after_the_session_is_caught() -> None:
    result, _ = run(FakePytest(("test_a", "failed"), exit_code=0))
    assert agent_invalid(result) and "process exited 0" in result.reason


def test_a_removed_report_is_caught() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), junit=None))
    assert agent_invalid(result) and "no JUnit report" in result.reason


def test_lines_after_the_session_finish_are_caught() -> None:
    class Late(FakePytest):
        def __call__(self, sb, cmd):  # noqa: ANN001, ANN204
            result = super().__call__(sb, cmd)
            start = next(line for line in result.stdout.splitlines() if '"k":"start"' in line)
            return ExecResult(result.exit_code, result.stdout + start + "\n", "")

    result, _ = run(Late(("test_a", "passed")))
    assert agent_invalid(result) and "after the session-finish line" in result.reason


def test_a_timeout_is_the_agents_failure() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), timed_out=True))
    assert agent_invalid(result) and "timed out" in result.reason


def test_a_collection_error_is_an_agent_caused_invalid_not_a_decided_zero() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), collect={"tests/test_math.py": "failed"}))
    assert agent_invalid(result) and "exit 2" in result.reason and "oracle" in result.reason


def test_skipping_at_import_so_nothing_is_collected_is_the_agents_failure() -> None:
    result, _ = run(FakePytest(collect={"tests/test_math.py": "skipped"}, junit=junit_xml()))
    assert agent_invalid(result) and "no tests were collected" in result.reason


def test_skipping_every_test_is_the_agents_failure() -> None:
    result, _ = run(FakePytest(("test_a", "skipped"), ("test_b", "skipped")))
    assert agent_invalid(result) and "skipped" in result.reason


def test_a_stream_cut_mid_line_is_caught() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), stdout_tail="half a li"))
    assert agent_invalid(result) and "mid-line" in result.reason


# ---------------------------------------------------------------- the grader's own failures stay excluded


def test_a_plugin_that_never_started_is_the_graders_failure() -> None:
    def no_plugin(sb: FakeSandbox, _cmd: str) -> ExecResult:
        return ExecResult(4, json.dumps({"preflight": 1}) + "\n", "")

    result, _ = run(no_plugin)
    assert result.invalid and result.invalid_cause == "grader" and "never started" in result.reason


def test_a_failed_preflight_is_the_graders_failure() -> None:
    def broken(sb: FakeSandbox, _cmd: str) -> ExecResult:
        return ExecResult(0, '{"preflight":0}\n', "")

    result, _ = run(broken)
    assert result.invalid and result.invalid_cause == "grader" and "preflight" in result.reason


def test_no_hidden_tests_is_the_graders_failure() -> None:
    verifier = build_verifier(UnitTestsVerifierSpec(), None, make_variant(), hidden={"variant.json": b"{}"})
    result = verifier.verify(FakeSandbox(), make_episode())
    assert result.invalid and result.invalid_cause == "grader"


def test_a_crashing_sandbox_is_the_graders_failure() -> None:
    def boom(_sb: FakeSandbox, _cmd: str) -> ExecResult:
        raise ConnectionError("container vanished")

    result, _ = run(boom)
    assert result.invalid and result.invalid_cause == "grader" and "container vanished" in result.reason


# ---------------------------------------------------------------- start-up hooks and the tampering detector


HOOK = {"path": "/usr/lib/python3/dist-packages/evil.pth", "sha256": "abc", "reachable": True}


def test_a_reachable_start_up_hook_the_oracle_lacks_is_the_agents() -> None:
    def oracle_preflight(_sb: FakeSandbox, cmd: str) -> ExecResult:
        assert "agentenv_preflight.py" in cmd
        return ExecResult(0, json.dumps({"preflight": 1, "hooks": [], "writable": []}) + "\n", "")

    replay = FakeReplay(FakeSandbox(handler=oracle_preflight))
    result, _ = run(FakePytest(("test_a", "passed"), preflight={"hooks": [HOOK]}), oracle=replay)
    assert agent_invalid(result) and "evil.pth" in result.reason


def test_a_reachable_start_up_hook_the_oracle_has_too_is_fine() -> None:
    class Same(FakeReplay):
        def compute(self, key, fn):  # noqa: ANN001, ANN201
            assert key == "startup_hooks"
            return {HOOK["path"]: HOOK["sha256"]}

    result, _ = run(FakePytest(("test_a", "passed"), preflight={"hooks": [HOOK], "writable": ["/venv/lib"]}), oracle=Same())
    assert result.reward == 1.0 and "unprotected" in result.extra


def test_a_root_owned_hook_needs_no_oracle() -> None:
    hook = {**HOOK, "reachable": False}
    replay = FakeReplay(error="must not be asked")
    result, _ = run(FakePytest(("test_a", "passed"), preflight={"hooks": [hook]}), oracle=replay)
    assert result.reward == 1.0 and replay.calls == 0


def test_neutralised_workspace_config_is_recorded() -> None:
    result, _ = run(FakePytest(("test_a", "passed"), preflight={"neutralised": ["/workspace/conftest.py"]}))
    assert result.reward == 1.0 and result.extra["neutralised"] == ["/workspace/conftest.py"]


WEAK = {"tampering": {"findings": [{"path": "lib.py", "line": 3, "what": "atexit.register", "strength": "weak",
                                    "why": "x"}], "count": 1, "strong": 0}}
STRONG = {"tampering": {"findings": [{"path": "lib.py", "line": 3, "what": "sys._getframe", "strength": "strong",
                                      "why": "x"}], "count": 1, "strong": 1}}


def test_strict_by_default_a_strong_finding_is_the_agents_invalid_and_a_weak_one_a_flag() -> None:
    flagged, sandbox = run(FakePytest(("test_a", "passed"), preflight=WEAK))
    assert flagged.reward == 1.0 and flagged.extra["tampering"]["count"] == 1
    assert "--scan" in sandbox.grading_exec()[0]
    strong, _ = run(FakePytest(("test_a", "passed"), preflight=STRONG))
    assert agent_invalid(strong) and "sys._getframe" in strong.reason and "'strict'" in strong.reason


def test_fail_counts_weak_findings_flag_counts_none_and_off_skips_the_scan() -> None:
    failed, _ = run(FakePytest(("test_a", "passed"), preflight=WEAK), UnitTestsVerifierSpec(detect_tampering="fail"))
    assert agent_invalid(failed) and "atexit.register" in failed.reason
    flag, _ = run(FakePytest(("test_a", "passed"), preflight=STRONG), UnitTestsVerifierSpec(detect_tampering="flag"))
    assert flag.reward == 1.0 and flag.extra["tampering"]["strong"] == 1
    _, off = run(FakePytest(("test_a", "passed")), UnitTestsVerifierSpec(detect_tampering="off"))
    assert "--scan" not in off.grading_exec()[0]


def test_a_tamper_line_from_the_plugin_is_the_agents_invalid_even_when_everything_else_agrees() -> None:
    class Tampered(FakePytest):
        def __call__(self, sb, cmd):  # noqa: ANN001, ANN204
            result = super().__call__(sb, cmd)
            nonce = (sb.last_stdin or b"").decode().strip()
            lines = result.stdout.split("\n")
            lines.insert(3, nonce + ' {"k":"tamper","n":1,"what":["_pytest.reports.TestReport.__init__"]}')
            return ExecResult(result.exit_code, "\n".join(lines), "")

    result, _ = run(Tampered(("test_a", "passed")))
    assert agent_invalid(result) and "TestReport.__init__" in result.reason


# ---------------------------------------------------------------- a task's own command: JUnit and exit code


def custom(xml: str | None, exit_code: int):  # noqa: ANN201
    def handler(sb: FakeSandbox, cmd: str) -> ExecResult:
        path = cmd.split("--junitxml=")[1].split()[0]
        if xml is not None:
            sb.files[path] = xml.encode()
        return ExecResult(exit_code, "", "")

    return handler


@pytest.mark.parametrize(
    ("xml", "exit_code", "reason"),
    [
        (junit_xml(("test_a", "failed")), 0, "exited 0 but the report has 1 failing"),
        (junit_xml(("test_a", "passed")), 1, "exited 1 but the report has no failing"),
        (junit_xml(("test_a", "error")), 2, "exit 2"),
        (junit_xml(("test_a", "passed")), 137, "killed"),
        ("<html>not junit</html>", 0, "garbled"),
        (None, 0, "no JUnit report"),
    ],
)
def test_a_custom_command_is_judged_from_the_report_and_exit_code(xml: str | None, exit_code: int, reason: str) -> None:
    spec = UnitTestsVerifierSpec(command="python3 -m pytest --junitxml={{ junit_xml }} {{ tests_dir }}")
    result, _ = run(custom(xml, exit_code), spec)
    assert agent_invalid(result) and reason in result.reason and result.extra["stream"].startswith("off")


# ---------------------------------------------------------------- the parsers directly


def test_junit_address_is_pytests_mangling() -> None:
    assert junit_address("tests/test_math.py::test_a") == ("tests.test_math", "test_a")
    assert junit_address("tests/sub/test_x.py::TestK::test_b[a::b/c]") == ("tests.sub.test_x.TestK", "test_b[a::b/c]")
    assert junit_address("tests/test_x.py") == ("", "tests.test_x")


def test_counts_that_disagree_with_pytests_are_caught() -> None:
    stream = Stream({"preflight": 1}, started=True, items=1, tests={"t.py::a": {"setup": ("passed", False), "call": ("passed", False),
                                                                                "teardown": ("passed", False)}},
                    finish={"exit": 0, "collected": 1, "failed": 1})
    with pytest.raises(Exception, match="failed reports but pytest counted 1"):
        outcomes(stream, 0, junit_xml(("a", "passed"), classname="t"))


def test_parse_stream_wants_the_preflight_first_and_the_start_before_anything() -> None:
    with pytest.raises(Exception, match="preflight"):
        parse_stream("n {}\n", "n")
    with pytest.raises(Exception, match="before the plugin started"):
        parse_stream('{"preflight":1}\nn {"k":"items","n":1}\n', "n")


def test_parse_junit_reads_both_root_forms() -> None:
    single = junit_xml(("test_a", "passed")).replace("<testsuites>", "").replace("</testsuites>", "")
    assert parse_junit(single).cases[0].status == "passed"


# ---------------------------------------------------------------- the in-process mode's per-run canaries


def test_each_run_adds_two_canaries_named_like_a_real_test() -> None:
    staged: list[bytes] = []
    fake = FakePytest(("test_a", "passed"))

    def handler(sb: FakeSandbox, cmd: str) -> ExecResult:
        staged.extend(v for k, v in sb.files.items() if k.endswith("/tests/test_math.py") and sb.last_argv[:2] == ["bash", "-c"])
        return fake(sb, cmd)

    for _ in range(2):
        result, _ = run(handler)
        assert result.reward == 1.0 and result.extra["canaries"] == "held", result
        assert [c.name for c in result.details] == ["tests.test_math.test_a"]  # the canaries are not judged
    names = [set(re.findall(rb"^def (test_a_[0-9a-f]{6})\(", text, flags=re.M)) for text in staged]
    assert len(names) == 2 and all(len(n) == 2 for n in names) and not names[0] & names[1], staged
    assert all(text.startswith(HIDDEN["test_math.py"]) for text in staged)  # appended to a real hidden module


@pytest.mark.parametrize(("bent", "which"), [(("passed", "passed"), "fail-canary"), (("failed", "skipped"), "pass-canary"),
                                             (("failed", "failed"), "pass-canary")],
                         ids=["every-failure-forced-to-pass", "skipped", "everything-forced-to-fail"])
def test_a_run_whose_canaries_come_back_wrong_is_the_agents_failure(bent: tuple[str, str], which: str) -> None:
    result, _ = run(FakePytest(("test_a", "passed"), canaries=bent))
    assert agent_invalid(result) and which in result.reason, result


def test_the_canaries_hold_without_a_scan_too() -> None:
    result, _ = run(FakePytest(("test_a", "failed"), canaries=("passed", "passed")), UnitTestsVerifierSpec(detect_tampering="off"))
    assert agent_invalid(result) and "fail-canary" in result.reason


def test_the_boot_imports_from_source_only() -> None:
    from agentenv.verifiers.unit_tests import PYTEST_BOOT

    assert "sys.pycache_prefix = '/dev/null/nocache'" in PYTEST_BOOT and "SourcelessFileLoader" not in PYTEST_BOOT
