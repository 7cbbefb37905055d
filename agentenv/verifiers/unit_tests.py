"""Hidden pytest files run in the grading sandbox, judged from a JUnit XML report only.

How the report is kept honest (and what is *not* protected):

* The hidden files are staged at verify time into a fresh ``mktemp -d``
  directory; the report goes to a random file name in another fresh one. The
  agent, gone by now, could not pre-plant either.
* stdout is never read: printing ``PASSED`` earns nothing.
* pytest runs as ``python3 -I`` (no ``PYTHON*`` variables, no user site, no
  cwd on ``sys.path``, so no planted ``sitecustomize``/``pytest.py``), with
  plugin autoload off, our own ini file, ``--confcutdir`` at the staging dir
  (no planted ``conftest.py`` above it) and the cache provider off. The
  workdir is put on ``sys.path`` by the ini's ``pythonpath`` so tests can
  import the agent's code.
* The exit code must agree with the report: 0 with failures, or 1 without,
  is ``invalid``; so are a timeout, no report, a garbled report, zero tests,
  and exit codes meaning a pytest crash, usage error or a kill.
* Not protected: the code under test runs in the pytest process, so code
  written *to attack the grader* (patching pytest at import, rewriting the
  report from an ``atexit`` hook) can still lie. Treat this like SWE-bench
  grading: robust to accidents and cheap tricks, not to a targeted exploit.
"""

from __future__ import annotations

import secrets
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from agentenv.types import CheckResult, Episode, UnitTestsVerifierSpec, VerifierResult
from agentenv.verifiers.common import BaseVerifier, VerifierContext, check, fresh_dir, invalid, score, stage
from sandboxes.errors import SandboxFileNotFound
from sandboxes.types import Sandbox

# pytest exit codes (ExitCode): 0 ok, 1 tests failed, 2 interrupted (collection errors), 3 internal
# error, 4 usage error, 5 no tests collected.
_DECIDED_WITH_FAILURES = {1, 2}


@dataclass(frozen=True)
class TestCase:
    classname: str
    name: str
    status: str  # passed | failed | error | skipped

    @property
    def node(self) -> str:
        return f"{self.classname}.{self.name}" if self.classname else self.name


@dataclass(frozen=True)
class Report:
    cases: tuple[TestCase, ...]
    declared_tests: int
    declared_bad: int  # failures + errors as the suite header says

    @property
    def bad(self) -> int:
        return sum(1 for c in self.cases if c.status in ("failed", "error"))


def parse_junit(xml_text: str) -> Report:
    """Parse pytest's JUnit XML (either family); ``ValueError`` when it is not a consistent report."""
    root = ET.fromstring(xml_text)
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite") if root.tag == "testsuites" else []
    if not suites:
        raise ValueError(f"root element is <{root.tag}>, expected <testsuites> or <testsuite>")
    cases: list[TestCase] = []
    declared = bad = 0
    for suite in suites:
        declared += int(suite.get("tests", "0"))
        bad += int(suite.get("failures", "0")) + int(suite.get("errors", "0"))
        for case in suite.iter("testcase"):
            kinds = {child.tag for child in case}
            status = (
                "error" if "error" in kinds else "failed" if "failure" in kinds else "skipped" if "skipped" in kinds else "passed"
            )
            cases.append(TestCase(case.get("classname", ""), case.get("name", ""), status))
    if len(cases) != declared:
        raise ValueError(f"header says {declared} tests but the report lists {len(cases)} test cases")
    report = Report(tuple(cases), declared, bad)
    if report.bad != bad:
        raise ValueError(f"header says {bad} failures/errors but the report lists {report.bad}")
    return report


def matches(test_id: str, case: TestCase) -> bool:
    """Does a spec's test id name this case? Accepts ``name``, ``file.py::Class::name`` or dotted forms."""
    if test_id == case.name or test_id == case.node:
        return True
    dotted = test_id.replace("::", ".").replace("/", ".").replace(".py.", ".")
    return case.node == dotted or case.node.endswith("." + dotted)


def judge(report: Report, exit_code: int, spec: UnitTestsVerifierSpec, started: float) -> VerifierResult:
    """Cross-check exit code and report, then score the required tests."""
    if not report.cases:
        return invalid("no tests were collected", started=started)
    if exit_code == 0 and report.bad:
        return invalid(f"pytest exited 0 but the report has {report.bad} failing tests", started=started)
    if exit_code in _DECIDED_WITH_FAILURES and not report.bad:
        return invalid(f"pytest exited {exit_code} but the report has no failing test", started=started)
    if exit_code not in (0, *_DECIDED_WITH_FAILURES):
        return invalid(f"pytest exited {exit_code} (internal error, usage error or killed)", started=started)
    required = [*spec.fail_to_pass, *spec.pass_to_pass]
    checks: list[CheckResult] = []
    if required:
        for test_id in required:
            found = [c for c in report.cases if matches(test_id, c)]
            kind = "FAIL_TO_PASS" if test_id in spec.fail_to_pass else "PASS_TO_PASS"
            if not found:
                checks.append(check(test_id, False, f"{kind}: not in the report (not collected or not run)"))
            else:
                bad = [c for c in found if c.status != "passed"]
                checks.append(check(test_id, not bad, f"{kind}: " + ", ".join(sorted({c.status for c in found}))))
    else:
        ran = [c for c in report.cases if c.status != "skipped"]
        if not ran:
            return invalid("every collected test was skipped", started=started)
        checks = [check(c.node, c.status == "passed", c.status) for c in ran]
    return score(checks, partial_credit=spec.partial_credit, started=started)


class UnitTestsVerifier(BaseVerifier):
    """Runs the task's hidden pytest files against the agent's final state."""

    kind = "unit_tests"

    def __init__(self, spec: UnitTestsVerifierSpec, ctx: VerifierContext) -> None:
        super().__init__(spec.name, ctx)
        self.spec = spec

    def _verify(self, sandbox: Sandbox, episode: Episode, started: float) -> VerifierResult:
        tests = {rel: data for rel, data in self.ctx.hidden.items()}
        if not any(rel.endswith(".py") for rel in tests):
            return invalid("the task has no hidden test files to run", started=started)
        root = stage(sandbox, {f"tests/{rel}": data for rel, data in tests.items()}, "tests")
        report_path = f"{fresh_dir(sandbox, 'report')}/{secrets.token_hex(8)}.xml"
        workdir = episode.workdir
        sandbox.write_file(f"{root}/pytest.ini", f"[pytest]\npythonpath = {workdir}\naddopts =\n")
        command = self._command(root, report_path, workdir)
        result = sandbox.exec(
            ["bash", "-c", command],
            timeout=self.spec.timeout_s,
            cwd=workdir,
            env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "AGENTENV_TESTS_DIR": f"{root}/tests"},
        )
        if result.timed_out:
            return invalid(f"tests timed out after {self.spec.timeout_s:g}s", started=started)
        try:
            xml_text = sandbox.read_file(report_path).decode("utf-8", errors="replace")
        except (SandboxFileNotFound, FileNotFoundError):
            tail = (result.stdout + result.stderr)[-500:]
            return invalid(f"no JUnit report was written (pytest exit {result.exit_code}); output tail: {tail}", started=started)
        try:
            report = parse_junit(xml_text)
        except (ET.ParseError, ValueError) as exc:
            return invalid(f"garbled JUnit report: {exc}", started=started)
        return judge(report, result.exit_code, self.spec, started)

    def _command(self, root: str, report_path: str, workdir: str) -> str:
        if self.spec.command:
            return self.ctx.render(
                self.spec.command, f"{self.name}.command", tests_dir=f"{root}/tests", junit_xml=report_path, workdir=workdir
            )
        return (
            f"python3 -I -m pytest -c {root}/pytest.ini --rootdir={root} --confcutdir={root} "
            f"-p no:cacheprovider -o junit_logging=no --junitxml={report_path} -q {root}/tests"
        )


__all__ = ["Report", "TestCase", "UnitTestsVerifier", "judge", "matches", "parse_junit"]
