"""Per-test outcomes from two sources that must agree: the nonce-tagged stream and the JUnit report.

``parse_stream`` reads what the in-sandbox plugin (``pytest_stream``) wrote to
the exec's stdout, after the preflight's line; ``outcomes`` checks the stream
against itself, the process's exit code and the JUnit XML, and returns the
per-test cases the verifier scores. Every contradiction raises: ``AgentCaused``
where the agent's code is what can produce it (a line without the nonce, a
duplicate, a tamper line from the plugin's integrity check, no session-finish
line, counts that disagree with the exit code or with the report),
``VerifierError`` where our own invocation failed (the
plugin never loaded, a usage error).

Why the agent, so often: the hidden tests and this plugin collect and run fine
on the oracle's state (``agentenv check`` proves every task), and nothing of
the agent runs before the plugin loads; what differs in a graded run is the
agent's code, so a run that cannot be read is the agent's doing and counts as
a failure (reward 0), not as a free pass.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentenv.verifiers.common import AgentCaused, VerifierError


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


def junit_address(nodeid: str) -> tuple[str, str]:
    """(classname, name) pytest's junitxml gives a node id (its ``mangle_test_address``)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


@dataclass
class Stream:
    """What the plugin reported, in order. ``tests`` maps node id -> phase -> (outcome, was xfail)."""

    preflight: Mapping[str, Any]
    started: bool = False
    items: int | None = None
    tests: dict[str, dict[str, tuple[str, bool]]] = field(default_factory=dict)
    collect: dict[str, str] = field(default_factory=dict)  # node id -> failed | skipped
    internal: list[str] = field(default_factory=list)
    tamper: list[str] = field(default_factory=list)  # pytest internals the plugin saw changed
    finish: Mapping[str, int] | None = None

    def failed_reports(self) -> int:
        """What pytest's ``session.testsfailed`` counts: failed reports that are not xfail, collectors too."""
        phases = sum(1 for by in self.tests.values() for outcome, xfail in by.values() if outcome == "failed" and not xfail)
        return phases + sum(1 for outcome in self.collect.values() if outcome == "failed")

    def cases(self) -> list[TestCase]:
        out = []
        for nodeid, by in self.tests.items():
            outcomes = {when: o for when, (o, _) in by.items()}
            if outcomes.get("setup") == "failed" or outcomes.get("teardown") == "failed":
                status = "error"
            elif outcomes.get("call") == "failed":
                status = "failed"
            elif "skipped" in (outcomes.get("setup"), outcomes.get("call")):
                status = "skipped"
            else:
                status = "passed"
            out.append(TestCase(*junit_address(nodeid), status))
        for nodeid, outcome in self.collect.items():
            out.append(TestCase(*junit_address(nodeid), "error" if outcome == "failed" else "skipped"))
        return out


_KINDS = ("start", "items", "collect", "test", "internal", "tamper", "finish")


def parse_stream(stdout: str, nonce: str) -> Stream:
    """The preflight line, then the plugin's lines; raises at the first line that is not ours or not in order."""
    if stdout and not stdout.endswith("\n"):
        raise AgentCaused(f"the result stream ends mid-line ({stdout[-80:]!r}): it was cut or written to by the code under test")
    lines = stdout.split("\n")[:-1] if stdout else []
    if not lines:
        raise VerifierError("the grading command wrote nothing (no preflight line): it did not start")
    try:
        preflight = json.loads(lines[0])
    except json.JSONDecodeError:
        preflight = None
    if not isinstance(preflight, dict) or preflight.get("preflight") != 1:
        raise VerifierError(f"the in-sandbox preflight failed: {lines[0][:200]!r}")
    stream = Stream(preflight)
    prefix = nonce + " "
    for number, line in enumerate(lines[1:], start=2):
        if not line.startswith(prefix):
            raise AgentCaused(f"line {number} of the result stream does not carry this run's nonce: {line[:80]!r}")
        try:
            event = json.loads(line[len(prefix):])
            kind = event["k"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise AgentCaused(f"line {number} of the result stream is garbled: {line[len(prefix):][:80]!r}") from exc
        if kind not in _KINDS:
            raise AgentCaused(f"line {number} of the result stream has an unknown kind {kind!r}")
        if stream.finish is not None:
            raise AgentCaused(f"line {number} of the result stream comes after the session-finish line")
        if kind == "start":
            if stream.started:
                raise AgentCaused(f"line {number}: a second plugin start on the result stream")
            stream.started = True
            continue
        if not stream.started:
            raise AgentCaused(f"line {number}: a {kind!r} line before the plugin started")
        _add(stream, kind, event, number)
    return stream


def _add(stream: Stream, kind: str, event: Mapping[str, Any], number: int) -> None:
    try:
        if kind == "items":
            if stream.items is not None:
                raise AgentCaused(f"line {number}: a second end-of-collection line")
            stream.items = int(event["n"])
        elif kind == "collect":
            nodeid = str(event["id"])
            if nodeid in stream.collect:
                raise AgentCaused(f"line {number}: a second collection outcome for {nodeid}")
            stream.collect[nodeid] = str(event["outcome"])
        elif kind == "test":
            nodeid, when, outcome = str(event["id"]), str(event["when"]), str(event["outcome"])
            if when not in ("setup", "call", "teardown") or outcome not in ("passed", "failed", "skipped"):
                raise AgentCaused(f"line {number}: a test outcome {when}/{outcome} pytest never reports")
            phases = stream.tests.setdefault(nodeid, {})
            if when in phases:
                raise AgentCaused(f"line {number}: a second {when} outcome for {nodeid} (exactly one is accepted)")
            if (when != "setup" and "setup" not in phases) or (when == "call" and "teardown" in phases):
                raise AgentCaused(f"line {number}: the {when} outcome of {nodeid} is out of order")
            phases[when] = (outcome, bool(event.get("xfail")))
        elif kind == "internal":
            stream.internal.append(str(event.get("error", "")))
        elif kind == "tamper":
            stream.tamper.extend(str(what) for what in event["what"])
        else:
            stream.finish = {"exit": int(event["exit"]), "collected": int(event["collected"]), "failed": int(event["failed"])}
    except (KeyError, TypeError, ValueError) as exc:
        raise AgentCaused(f"line {number} of the result stream lacks a field: {exc}") from exc


def outcomes(stream: Stream, exit_code: int, junit_xml: str | None) -> list[TestCase]:
    """The per-test cases, once the stream, the exit code and the JUnit report all agree."""
    if not stream.started:
        raise VerifierError(f"the stream plugin never started (pytest exit {exit_code}): our invocation failed")
    if stream.tamper:
        raise AgentCaused(
            f"the code under test changed pytest internals while the tests ran ({', '.join(stream.tamper[:4])}): "
            "what decides or records an outcome is not what pytest loaded"
        )
    if stream.finish is None:
        raise AgentCaused(
            f"no session-finish line (process exit {exit_code}): the process ended before pytest finished; "
            "the code under test exited it (os._exit), killed it or crashed it"
        )
    finish = stream.finish
    if finish["exit"] != exit_code:
        raise AgentCaused(f"pytest finished with exit status {finish['exit']} but the process exited {exit_code}: "
                          "the code under test changed the exit")
    if exit_code == 4:
        raise VerifierError("pytest exited 4 (usage error): our invocation is wrong")
    if exit_code == 2:
        errors = sorted(n for n, o in stream.collect.items() if o == "failed")
        raise AgentCaused(
            f"the hidden tests failed to collect (pytest exit 2; errors in {', '.join(errors[:3]) or 'collection'}); "
            "they collect on the oracle's state (agentenv check), so the agent's code broke collection"
        )
    if exit_code == 5 or stream.items == 0:
        raise AgentCaused(
            "no tests were collected (pytest exit 5): the hidden tests collect on the oracle's state, so the agent's "
            "code skipped or hid them (SkipTest or pytest.skip at import)"
        )
    if exit_code == 3 or stream.internal:
        raise AgentCaused(f"pytest hit an internal error ({', '.join(stream.internal) or 'exit 3'}) running the agent's code")
    if exit_code not in (0, 1):
        raise AgentCaused(f"pytest exited {exit_code} (killed or crashed) while running the agent's code")
    _check_counts(stream, exit_code)
    cases = stream.cases()
    _check_junit(cases, junit_xml)
    return cases


def _check_counts(stream: Stream, exit_code: int) -> None:
    finish = stream.finish or {}
    failed = stream.failed_reports()
    if failed != finish["failed"]:
        raise AgentCaused(f"the stream has {failed} failed reports but pytest counted {finish['failed']}")
    if stream.items is None or stream.items != finish["collected"] or len(stream.tests) != stream.items:
        raise AgentCaused(f"pytest collected {finish['collected']} tests (end of collection said {stream.items}) "
                          f"but the stream has outcomes for {len(stream.tests)}")
    incomplete = [n for n, by in stream.tests.items()
                  if "teardown" not in by or (by["setup"][0] == "passed") != ("call" in by)]
    if incomplete:
        raise AgentCaused(f"tests without a complete set of outcomes on the stream: {', '.join(incomplete[:3])}")
    if (exit_code == 0) != (failed == 0):
        raise AgentCaused(f"pytest exited {exit_code} with {failed} failed reports: the exit contradicts the outcomes")


def _category(status: str) -> str:
    return "bad" if status in ("failed", "error") else status


def _check_junit(cases: list[TestCase], junit_xml: str | None) -> None:
    if junit_xml is None:
        raise AgentCaused("pytest finished but there is no JUnit report: the code under test removed it")
    try:
        report = parse_junit(junit_xml)
    except (ET.ParseError, ValueError) as exc:
        raise AgentCaused(f"the JUnit report is garbled though pytest finished: {exc}") from exc
    theirs: dict[tuple[str, str], str] = {}
    for case in report.cases:  # one test can appear twice (a failing call and a failing teardown)
        key = (case.classname, case.name)
        theirs[key] = "bad" if "bad" in (theirs.get(key), _category(case.status)) else _category(case.status)
    ours = Counter((c.classname, c.name) for c in cases)
    dupes = [k for k, n in ours.items() if n > 1]
    if dupes:
        raise VerifierError(f"two node ids map to one JUnit name {dupes[0]}: cannot cross-check")
    mine = {(c.classname, c.name): _category(c.status) for c in cases}
    if mine.keys() != theirs.keys():
        extra, missing = sorted(theirs.keys() - mine.keys()), sorted(mine.keys() - theirs.keys())
        raise AgentCaused(f"the JUnit report names other tests than the stream (extra {extra[:2]}, missing {missing[:2]}): "
                          "it was rewritten")
    differ = [f"{'.'.join(k)}: stream {mine[k]}, report {theirs[k]}" for k in mine if mine[k] != theirs[k]]
    if differ:
        raise AgentCaused("the JUnit report disagrees with the streamed outcomes (rewritten after the fact?): " + "; ".join(differ[:3]))


__all__ = ["Report", "Stream", "TestCase", "junit_address", "outcomes", "parse_junit", "parse_stream"]
