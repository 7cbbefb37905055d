"""An oracle replay and a scripted pytest for verifier unit tests, over ``sandboxes.testing.FakeSandbox``."""

from __future__ import annotations

import re

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentenv.types import Episode, Variant
from sandboxes.testing import FakeSandbox
from sandboxes.types import ExecResult


class FakeReplay:
    """``OracleReplay`` over a prepared fake sandbox; counts calls, can be told to fail."""

    def __init__(self, sandbox: FakeSandbox | None = None, answer: str | None = None, error: str | None = None) -> None:
        self.sandbox = sandbox or FakeSandbox()
        self.answer = answer
        self.error = error
        self.calls = 0

    def compute(self, key: str, fn: Callable[[Any, str | None], Any]) -> Any:
        from agentenv.errors import OracleError

        self.calls += 1
        if self.error:
            raise OracleError(self.error)
        return fn(self.sandbox, self.answer)


def make_variant(**params: Any) -> Variant:
    return Variant(task_id="t/fake", seed=0, params=params, instruction="do it")


def make_episode(final_answer: str | None = None, oracle: Any = None, **params: Any) -> Episode:
    return Episode(task_id="t/fake", variant=make_variant(**params), final_answer=final_answer, oracle=oracle)


def junit_xml(*cases: tuple[str, str], classname: str = "tests.test_math") -> str:
    """A JUnit report of (name, status) cases, headers consistent."""
    body, failures, errors, skipped = [], 0, 0, 0
    for name, status in cases:
        inner = {"failed": "<failure message='x'/>", "error": "<error message='x'/>", "skipped": "<skipped/>"}.get(status, "")
        failures += status == "failed"
        errors += status == "error"
        skipped += status == "skipped"
        body.append(f'<testcase classname="{classname}" name="{name}">{inner}</testcase>')
    return (
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{len(cases)}" failures="{failures}" '
        f'errors="{errors}" skipped="{skipped}">{"".join(body)}</testsuite></testsuites>'
    )


class FakePytest:
    """Plays the grading exec: the preflight line, then the plugin's stream for ``cases``, a JUnit report, an exit.

    ``cases`` are (name, status) in ``tests/test_math.py``; status passed | failed | error | skipped.
    The knobs are the cheats and breakages a test wants to show: ``junit`` replaces the report
    (None: none written; a tuple of cases: those plus the run's canaries, all passed), ``exit_code`` the process's exit, ``lines`` is appended to the stream,
    ``finish=False`` drops the session-finish line, ``nonce`` forges the tag, ``preflight`` adds
    fields to the preflight report, ``collect`` adds collector outcomes (node id -> failed | skipped).
    """

    def __init__(self, *cases: tuple[str, str], junit: str | tuple[tuple[str, str], ...] | None | bool = True, exit_code: int | None = None,
                 lines: Sequence[str] = (), finish: bool = True, nonce: str | None = None,
                 preflight: Mapping[str, Any] | None = None, collect: Mapping[str, str] | None = None,
                 timed_out: bool = False, stdout_tail: str = "",
                 canaries: tuple[str, str] | None = ("failed", "passed")) -> None:
        self.canaries = canaries
        self.cases, self.junit, self.exit_code, self.lines = cases, junit, exit_code, list(lines)
        self.finish, self.nonce, self.preflight = finish, nonce, dict(preflight or {})
        self.collect, self.timed_out, self.stdout_tail = dict(collect or {}), timed_out, stdout_tail

    def __call__(self, sb: FakeSandbox, cmd: str) -> ExecResult:
        import json

        argv = sb.last_argv
        if argv[:2] != ["bash", "-c"] or len(argv) < 9:
            return ExecResult(0, "", "")
        junit_path = argv[6]
        staged = sb.files.get(f"{argv[5]}/tests/test_math.py", b"").decode()
        drawn = re.findall(r"^def (test_\w+)\(\):\n    assert (\d+) == (\d+)$", staged, flags=re.M)
        canary_cases = []
        module_skipped = self.collect.get("tests/test_math.py") is not None
        if self.canaries is not None and not module_skipped:  # the run's canaries, as an honest pytest reports them (or as a cheat bends them)
            fail = next((n for n, a, b in drawn if a != b), None)
            passing = next((n for n, a, b in drawn if a == b), None)
            canary_cases = [(n, o) for n, o in zip((fail, passing), self.canaries) if n]
        cases = (*self.cases, *canary_cases)
        nonce = self.nonce if self.nonce is not None else (sb.last_stdin or b"").decode().strip()

        def line(kind: str, **fields: Any) -> str:
            return f"{nonce} " + json.dumps({"k": kind, **fields}, sort_keys=True, separators=(",", ":"))

        out = [json.dumps({"preflight": 1, "hooks": [], "writable": [], "neutralised": [], **self.preflight})]
        out.append(line("start", pid=7))
        failed = 0
        for nodeid, outcome in self.collect.items():
            out.append(line("collect", id=nodeid, outcome=outcome))
            failed += outcome == "failed"
        interrupted = any(o == "failed" for o in self.collect.values())
        items = 0 if interrupted else len(cases)
        out.append(line("items", n=items))
        for name, status in ([] if interrupted else cases):
            nodeid = f"tests/test_math.py::{name}"
            setup = {"error": "failed", "skipped": "skipped"}.get(status, "passed")
            out.append(line("test", id=nodeid, when="setup", outcome=setup, xfail=False))
            if setup == "passed":
                out.append(line("test", id=nodeid, when="call", outcome="failed" if status == "failed" else "passed", xfail=False))
            out.append(line("test", id=nodeid, when="teardown", outcome="passed", xfail=False))
            failed += status in ("failed", "error")
        honest_exit = 2 if interrupted else 5 if not items else 1 if failed else 0
        if self.finish:
            out.append(line("finish", exit=honest_exit, collected=items, failed=failed))
        out.extend(self.lines)
        if self.junit is True:
            sb.files[junit_path] = junit_xml(*cases).encode()
        elif isinstance(self.junit, tuple):  # a rewriter that knows the run's test ids: all of them as passed
            sb.files[junit_path] = junit_xml(*self.junit, *[(n, "passed") for n, _ in canary_cases]).encode()
        elif isinstance(self.junit, str):
            sb.files[junit_path] = self.junit.encode()
        code = self.exit_code if self.exit_code is not None else honest_exit
        stdout = "\n".join(out) + "\n" + self.stdout_tail
        return ExecResult(124 if self.timed_out else code, stdout, "", timed_out=self.timed_out)
