"""Hidden pytest files run in the grading sandbox, judged from two sources that must agree.

The code under test runs inside the pytest process, as the sandbox user, so
the grader trusts nothing that process could write after the fact. What is
protected, and how:

* **Outcomes are streamed, not read back.** Our plugin (``pytest_stream``,
  staged with ``-p``, imported while pytest parses its command line, before
  any conftest, test module or code under test) writes one nonce-tagged line
  per test phase, per failed or skipped collector and at session finish
  (exit status, collected, failed) to a copy of the exec's stdout; pytest's
  own stdout and stderr go to a log file. A line sent cannot be taken back,
  so an ``atexit`` hook that rewrites the JUnit XML to all-pass is caught by
  the disagreement. The nonce comes over the exec's stdin (in no environment
  block, command line or file that ``/proc`` shows, unlike an environment
  variable) and the stream fd is moved to a close-on-exec descriptor, so
  printing, planting files or a subprocess cannot forge a line.
* **Cross-checks** (``pytest_outcomes``): exactly one outcome per test and
  phase, in order; a session-finish line whose exit status is the process's
  and whose counts match the lines; the JUnit report naming the same tests
  with the same verdicts. Any disagreement, a missing finish line (the code
  called ``os._exit``), a timeout (a hang at import), no tests collected
  (``SkipTest`` at import), every test skipped, a collection error (exit 2)
  is ``invalid`` *caused by the agent*: the hidden tests collect and pass on
  the oracle's state (``agentenv check``), so such a run counts as a failure
  (reward 0), never as an excluded episode.
* **Plugins and start-up hooks.** ``python3 -I -B`` (no ``PYTHON*``, no user
  site, no cwd on ``sys.path``), ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``,
  ``PYTEST_ADDOPTS`` / ``PYTEST_PLUGINS`` / ``BASH_ENV`` cleared, our own ini
  (``-c``), ``--rootdir`` and ``--confcutdir`` at a fresh staging dir, and
  ``-p no:cacheprovider -p no:stepwise -p no:pastebin``: a workspace
  ``conftest.py``, ``pytest.ini``, ``tox.ini``, ``setup.cfg`` /
  ``pyproject.toml`` pytest section, ``sitecustomize.py`` or ``*.pth`` is
  never read (``preflight`` lists them in ``extra["neutralised"]``). Start-up
  hooks in the interpreter's own directories that the sandbox user can write
  are compared with the oracle replay's; one the agent added or changed is an
  agent-caused ``invalid``.
* **Pytest patched from inside** (closed at run time): the plugin records, at
  load, the identity, ``__code__`` and defaults of everything that decides or
  records an outcome (``TestReport.__init__`` / ``from_item_and_call``, the
  ``passed`` / ``failed`` / ``skipped`` properties, ``call_and_report``,
  ``runtestprotocol``, ``call_runtest_hook``, ``CallInfo.from_call``,
  ``Function.runtest``, ``pytest_pyfunc_call``, ``Session.perform_collect``,
  ``pytest_runtestloop``, the JUnit writer, skipping, assertion rewriting,
  ``raises`` / ``approx``, pluggy's dispatch, ``unittest.case``,
  ``builtins.__import__``, ``AssertionError`` and a few more builtins, its own
  functions) and every hook implementation registered with it; at every
  ``pytest_runtest_logreport`` and at session finish it compares, and a
  change is a ``tamper`` line, which is an agent-caused ``invalid``. This
  holds whatever the obfuscation (``__import__`` of a ``chr()``-built name,
  ``setattr``), since it looks at the objects, not the source. A hidden test
  that itself monkeypatches one of these (``builtins.__import__`` to fake a
  missing module) trips it too: ``agentenv check`` shows that on the oracle.
* **Caller inspection and always-equal results** cannot be closed at run
  time in principle: code that looks at its caller (``sys._getframe``,
  ``inspect.stack``, ``PYTEST_CURRENT_TEST``, ``gc.get_objects``), or returns
  an ``int`` subclass whose ``__eq__`` is always true, behaves differently
  under test and no runner in the same process can tell. ``detect_tampering``
  scans the workspace's Python files with ``ast`` (``extra["tampering"]``)
  and sorts findings into *strong* (pytest or pluggy internals imported from
  non-test code, ``gc`` object walks, frame walking, ``/proc/self/mem``,
  ``ctypes``, ``settrace`` / ``setprofile``, ``__import__`` /
  ``import_module`` of a computed name, builtins patching, a ``__code__``
  rewrite, an ``__eq__`` / ``__ne__`` that ignores its arguments on a class
  derived from a builtin type or that just says ``True``) and *weak*
  (``atexit``, ``os._exit``, ``inspect`` and ``gc`` imports,
  ``PYTEST_CURRENT_TEST``, names of the report or the grader). ``"strict"``
  (the default) makes a strong finding an agent-caused ``invalid`` and flags
  weak ones; ``"fail"`` makes any finding one; ``"flag"`` only records;
  ``"off"`` skips the scan.

Not protected: a forger who first patches the plugin's own recorded
references or its check (reaching them through ``sys.modules`` or ``gc``), or
who rewrites a code object's bytes in place through ``ctypes``, defeats the
run-time check, and so does a hook implementation whose code claims a file in
the hidden tests' directory; all of these need means that the detector calls
strong, so only the detector stands there. So does a targeted exploit that
reads the nonce (``gc``, ``/proc/self/mem``) and forges a complete,
consistent stream and report. A workspace whose own (task-given) code uses
strong means (a vendored library that calls ``sys._getframe``) makes every
episode invalid under ``"strict"``: such a task sets ``"flag"``. Also not
protected: an image whose site-packages or pytest the sandbox user can write
(``extra["unprotected"]`` says so; keep them root-owned, as the base image
does); a custom ``command`` (it runs without the stream and is judged from
the JUnit XML and exit code only).
"""

from __future__ import annotations

import re
import secrets
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv.types import CheckResult, Episode, UnitTestsVerifierSpec, VerifierResult
from agentenv.verifiers.common import (
    MAX_READ_BYTES,
    AgentCaused,
    BaseVerifier,
    VerifierContext,
    VerifierError,
    check,
    fresh_dir,
    invalid,
    remove_dirs,
    score,
    stage,
)
from agentenv.verifiers.pytest_outcomes import Report, TestCase, outcomes, parse_junit, parse_stream
from sandboxes.errors import SandboxFileNotFound, SandboxFileTooLarge
from sandboxes.types import ExecResult, Sandbox

_HERE = Path(__file__).parent
PLUGIN = "agentenv_stream"
#: The in-sandbox tools, staged under these names (the plugin's name is what ``-p`` imports).
TOOLS = {f"{PLUGIN}.py": _HERE / "pytest_stream.py", "agentenv_preflight.py": _HERE / "preflight.py"}
#: pytest's built-in plugins that read state a workspace could plant or reach outside; never needed.
BLOCKED_PLUGINS = ("cacheprovider", "stepwise", "pastebin")
#: pytest's boot: imports from source only (no ``__pycache__`` read, since caches live under a prefix that
#: can never be a directory; no sourceless ``.pyc`` loader on the path hooks), then pytest. The scanner reads the sources, so
#: the code that runs is the code it read.
PYTEST_BOOT = (
    "import sys, importlib.machinery as m; sys.dont_write_bytecode = True; sys.pycache_prefix = '/dev/null/nocache'; "
    "sys.path_hooks[:] = [h for h in sys.path_hooks if 'FileFinder' not in repr(h)] + [m.FileFinder.path_hook("
    "(m.ExtensionFileLoader, m.EXTENSION_SUFFIXES), (m.SourceFileLoader, m.SOURCE_SUFFIXES))]; "
    "sys.path_importer_cache.clear(); "
    "sys.path.insert(0, sys.argv.pop(1)); import pytest; raise SystemExit(pytest.main())"
)
#: The grading exec: the preflight first (one JSON line on stdout, before anything of the agent runs), then
#: pytest with fd 3 = the exec's stdout (the stream) and its own stdout/stderr sent to a log file.
WRAPPER = (
    'tools=$1 root=$2 junit=$3 log=$4 workdir=$5 scan=$6; shift 6\n'
    'pre=$(python3 -I -S "$tools/agentenv_preflight.py" "$workdir" $scan </dev/null 2>/dev/null) '
    "&& printf '%s\\n' \"$pre\" || echo '{\"preflight\":0}'\n"
    "unset PYTEST_ADDOPTS PYTEST_PLUGINS PYTHONPATH PYTHONSTARTUP BASH_ENV ENV\n"
    'exec 3>&1 1>"$log" 2>&1\n'
    'exec python3 -I -B -c "$0" "$tools" -c "$root/pytest.ini" --rootdir="$root" --confcutdir="$root" '
    '"$@" -o junit_logging=no --junitxml="$junit" -q "$root/tests"\n'
)
# pytest exit codes (ExitCode) for the custom-command path: 0 ok, 1 tests failed, 2 interrupted.
_DECIDED_WITH_FAILURES = {1}


@dataclass(frozen=True)
class Canaries:
    """Two tests added to a hidden test module for one run: one must fail, one must pass, whatever the agent wrote.

    Their names are drawn per run (a real test's name plus a random suffix) and their bodies use
    no code of the agent's, so a run where the fail-canary passes (every failure forced to a pass,
    a forged stream or report) or the pass-canary does not pass (the run was cut short, everything
    forced to fail or skip) tells that the run itself was steered: the agent's failure, reward 0.
    """

    module: str
    fail: str
    passing: str

    @classmethod
    def draw(cls, hidden: dict[str, bytes]) -> Canaries | None:
        modules = sorted(rel for rel in hidden if rel.endswith(".py") and Path(rel).name.startswith("test"))
        if not modules:
            return None
        names = re.findall(rb"^def (test_\w+)\(", hidden[modules[0]], flags=re.M) or [b"test_case"]
        stem = secrets.choice(names).decode()
        return cls(modules[0], f"{stem}_{secrets.token_hex(3)}", f"{stem}_{secrets.token_hex(3)}")

    def source(self) -> bytes:
        a, b = secrets.randbelow(10**6), secrets.randbelow(10**6) + 1
        return (f"\n\ndef {self.fail}():\n    assert {a} == {a + b}\n"
                f"\n\ndef {self.passing}():\n    assert {a} == {a}\n").encode()

    def problem(self, cases: list[TestCase]) -> str | None:
        fail = [c.status for c in cases if c.name == self.fail]
        passing = [c.status for c in cases if c.name == self.passing]
        if fail != ["failed"]:
            return f"the run's fail-canary (a test that cannot pass) came back {fail or 'missing'}: the run was steered"
        if passing != ["passed"]:
            return f"the run's pass-canary (a test that cannot fail) came back {passing or 'missing'}: the run was steered"
        return None

    def without(self, cases: list[TestCase]) -> list[TestCase]:
        return [c for c in cases if c.name not in (self.fail, self.passing)]


def matches(test_id: str, case: TestCase) -> bool:
    """Does a spec's test id name this case? Accepts ``name``, ``file.py::Class::name`` or dotted forms."""
    if test_id == case.name or test_id == case.node:
        return True
    dotted = test_id.replace("::", ".").replace("/", ".").replace(".py.", ".")
    return case.node == dotted or case.node.endswith("." + dotted)


def judge(cases: list[TestCase] | Report, spec: UnitTestsVerifierSpec, started: float) -> VerifierResult:
    """Score the required tests (or every test that ran) of cross-checked outcomes."""
    cases = list(cases.cases) if isinstance(cases, Report) else cases
    if not cases:
        return invalid("no tests were collected", started=started, cause="agent")
    required = [*spec.fail_to_pass, *spec.pass_to_pass]
    checks: list[CheckResult] = []
    if required:
        for test_id in required:
            found = [c for c in cases if matches(test_id, c)]
            kind = "FAIL_TO_PASS" if test_id in spec.fail_to_pass else "PASS_TO_PASS"
            if not found:
                checks.append(check(test_id, False, f"{kind}: not in the report (not collected or not run)"))
            else:
                bad = [c for c in found if c.status != "passed"]
                checks.append(check(test_id, not bad, f"{kind}: " + ", ".join(sorted({c.status for c in found}))))
    else:
        ran = [c for c in cases if c.status != "skipped"]
        if not ran:
            return invalid("every collected test was skipped: they run on the oracle's state, so the agent's code "
                           "skipped them", started=started, cause="agent")
        checks = [check(c.node, c.status == "passed", c.status) for c in ran]
    return score(checks, partial_credit=spec.partial_credit, started=started)


class UnitTestsVerifier(BaseVerifier):
    """Runs the task's hidden pytest files against the agent's final state."""

    kind = "unit_tests"

    def __init__(self, spec: UnitTestsVerifierSpec, ctx: VerifierContext) -> None:
        super().__init__(spec.name, ctx)
        self.spec = spec

    def _verify(self, sandbox: Sandbox, episode: Episode, started: float) -> VerifierResult:
        if not any(rel.endswith(".py") for rel in self.ctx.hidden):
            return invalid("the task has no hidden test files to run", started=started)
        staged: list[str] = []
        try:
            hidden = dict(self.ctx.hidden)
            canaries = None if self.spec.command else Canaries.draw(hidden)
            if canaries is not None:
                hidden[canaries.module] = hidden[canaries.module] + canaries.source()
            root = stage(sandbox, {f"tests/{rel}": data for rel, data in hidden.items()}, "tests")
            staged.append(root)
            report_dir = fresh_dir(sandbox, "report")
            staged.append(report_dir)
            sandbox.write_file(f"{root}/pytest.ini", f"[pytest]\npythonpath = {episode.workdir}\naddopts =\n")
            if self.spec.command:
                return self._custom(sandbox, episode, root, f"{report_dir}/{secrets.token_hex(8)}.xml", started)
            tools = stage(sandbox, {name: path.read_bytes() for name, path in TOOLS.items()}, "tools")
            staged.append(tools)
            return self._streamed(sandbox, episode, root, tools, report_dir, started, canaries)
        finally:
            remove_dirs(sandbox, staged)

    # ------------------------------------------------------------ the default: streamed and cross-checked

    def _streamed(self, sandbox: Sandbox, episode: Episode, root: str, tools: str, report_dir: str, started: float,
                  canaries: Canaries | None = None) -> VerifierResult:
        nonce = secrets.token_hex(16)
        junit = f"{report_dir}/{secrets.token_hex(8)}.xml"
        log = f"{report_dir}/{secrets.token_hex(8)}.log"
        scan = "--scan" if self.spec.detect_tampering != "off" else ""
        blocked = [arg for name in BLOCKED_PLUGINS for arg in ("-p", f"no:{name}")]
        result = sandbox.exec(
            ["bash", "-c", WRAPPER, PYTEST_BOOT, tools, root, junit, log, episode.workdir, scan, "-p", PLUGIN, *blocked],
            timeout=self.spec.timeout_s,
            cwd=episode.workdir,
            env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "AGENTENV_STREAM_FD": "3", "BASH_ENV": "", "ENV": "",
                 "AGENTENV_TESTS_DIR": f"{root}/tests"},
            stdin=(nonce + "\n").encode(),
        )
        extra: dict[str, Any] = {"stream": "checked"}
        try:
            if result.timed_out:
                raise AgentCaused(f"tests timed out after {self.spec.timeout_s:g}s: the code under test hangs "
                                  "(at import or in a test) or is too slow; the oracle's state passes in time")
            if result.truncated:
                raise AgentCaused("the result stream overflowed the exec's output cap: something wrote to it")
            stream = parse_stream(result.stdout, nonce)
            extra.update(self._preflight(stream.preflight, episode))
            junit_xml = self._read_report(sandbox, junit)
            cases = outcomes(stream, result.exit_code, junit_xml)
            if canaries is not None and cases:  # none collected at all: judge() says so
                steered = canaries.problem(list(cases))
                if steered:
                    raise AgentCaused(steered)
                cases = canaries.without(list(cases))
                extra["canaries"] = "held"
        except AgentCaused as exc:
            return invalid(f"{exc}{self._log_tail(sandbox, log)}", started=started, cause="agent", extra=extra)
        except VerifierError as exc:
            return invalid(f"{exc}{self._log_tail(sandbox, log)}", started=started, extra=extra)
        verdict = judge(cases, self.spec, started)
        mode = self.spec.detect_tampering
        findings = extra.get("tampering", {}).get("findings", [])
        counted = [f for f in findings if mode == "fail" or (mode == "strict" and f.get("strength") == "strong")]
        if counted and not verdict.invalid:
            where = ", ".join(f"{f['path']}:{f['line']} {f['what']}" for f in counted[:3])
            kind = "strong " if mode == "strict" else ""
            return invalid(f"the workspace has code that can change how the tests judge it ({kind}tampering findings: "
                           f"{where}); detect_tampering is {mode!r}", started=started, cause="agent",
                           details=verdict.details, extra=extra)
        return VerifierResult(verdict.reward, verdict.passed, verdict.invalid, verdict.reason, verdict.details,
                              verdict.duration_s, {**extra, **verdict.extra}, verdict.invalid_cause)

    def _preflight(self, pre: Any, episode: Episode) -> dict[str, Any]:
        """What the preflight saw; an agent-reachable start-up hook that the oracle's sandbox lacks is the agent's."""
        extra: dict[str, Any] = {}
        if pre.get("neutralised"):
            extra["neutralised"] = list(pre["neutralised"])
        if "tampering" in pre:
            extra["tampering"] = pre["tampering"]
        reachable = {h["path"]: h["sha256"] for h in pre.get("hooks", []) if h.get("reachable")}
        writable = list(pre.get("writable", []))
        if writable:
            extra["unprotected"] = f"the sandbox user can write {', '.join(writable[:3])}: start-up code there is unchecked"
        if not reachable:
            return extra
        if episode.oracle is None:
            extra["startup_hooks_unverified"] = sorted(reachable)
            return extra
        theirs: dict[str, str] = episode.oracle.compute("startup_hooks", _oracle_hooks)
        changed = sorted(p for p, sha in reachable.items() if theirs.get(p) != sha)
        if changed:
            raise AgentCaused(f"start-up hooks the agent added or changed run before any test: {', '.join(changed[:3])}")
        return extra

    @staticmethod
    def _read_report(sandbox: Sandbox, path: str) -> str | None:
        try:
            return sandbox.read_file(path, limit=MAX_READ_BYTES).decode("utf-8", errors="replace")
        except (SandboxFileNotFound, FileNotFoundError):
            return None
        except SandboxFileTooLarge as exc:
            raise AgentCaused(f"the JUnit report is over {MAX_READ_BYTES} bytes: something wrote to it") from exc

    @staticmethod
    def _log_tail(sandbox: Sandbox, log: str) -> str:
        try:
            tail = sandbox.exec(["tail", "-c", "400", "--", log], timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001 - a diagnostic only
            return ""
        return f"; output tail: {tail}" if tail else ""

    # ------------------------------------------------------------ a task's own command: JUnit and exit code only

    def _custom(self, sandbox: Sandbox, episode: Episode, root: str, report_path: str, started: float) -> VerifierResult:
        command = self.ctx.render(
            self.spec.command or "", f"{self.name}.command", tests_dir=f"{root}/tests", junit_xml=report_path,
            workdir=episode.workdir,
        )
        result = sandbox.exec(
            ["bash", "-c", command], timeout=self.spec.timeout_s, cwd=episode.workdir,
            env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "AGENTENV_TESTS_DIR": f"{root}/tests", "BASH_ENV": ""},
        )
        extra = {"stream": "off (custom command)"}
        if result.timed_out:
            return invalid(f"tests timed out after {self.spec.timeout_s:g}s", started=started, cause="agent", extra=extra)
        try:
            xml_text = self._read_report(sandbox, report_path)
        except AgentCaused as exc:
            return invalid(str(exc), started=started, cause="agent", extra=extra)
        if xml_text is None:
            return invalid(f"no JUnit report was written (exit {result.exit_code}){_tail(result)}", started=started,
                           cause="agent", extra=extra)
        try:
            report = parse_junit(xml_text)
        except (ET.ParseError, ValueError) as exc:
            return invalid(f"garbled JUnit report: {exc}", started=started, cause="agent", extra=extra)
        contradiction = _contradiction(report, result.exit_code)
        if contradiction:
            return invalid(contradiction, started=started, cause="agent", extra=extra)
        verdict = judge(report, self.spec, started)
        return VerifierResult(verdict.reward, verdict.passed, verdict.invalid, verdict.reason, verdict.details,
                              verdict.duration_s, extra, verdict.invalid_cause)


def _contradiction(report: Report, exit_code: int) -> str | None:
    if exit_code == 0 and report.bad:
        return f"pytest exited 0 but the report has {report.bad} failing tests"
    if exit_code in _DECIDED_WITH_FAILURES and not report.bad:
        return f"pytest exited {exit_code} but the report has no failing test"
    if exit_code == 2:
        return "the hidden tests failed to collect (pytest exit 2); they collect on the oracle's state, so the agent's code broke collection"
    if exit_code not in (0, *_DECIDED_WITH_FAILURES):
        return f"pytest exited {exit_code} (internal error, usage error or killed)"
    return None


def _tail(result: ExecResult) -> str:
    tail = (result.stdout + result.stderr)[-500:]
    return f"; output tail: {tail}" if tail else ""


def _oracle_hooks(oracle_sandbox: Sandbox, _answer: str | None) -> dict[str, str]:
    """The start-up hook files of the oracle's sandbox (same image, set-up and solved), path -> sha256."""
    import json

    tools = stage(oracle_sandbox, {"agentenv_preflight.py": TOOLS["agentenv_preflight.py"].read_bytes()}, "tools")
    try:
        result = oracle_sandbox.exec(["python3", "-I", "-S", f"{tools}/agentenv_preflight.py", "/nonexistent"], timeout=60)
    finally:
        remove_dirs(oracle_sandbox, [tools])
    try:
        pre = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        raise VerifierError(f"the oracle sandbox's preflight gave {result.stdout[-200:]!r}") from exc
    return {h["path"]: h["sha256"] for h in pre.get("hooks", [])}


__all__ = ["BLOCKED_PLUGINS", "Report", "TestCase", "UnitTestsVerifier", "judge", "matches", "parse_junit"]
