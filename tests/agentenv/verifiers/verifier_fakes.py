"""In-memory fakes of a sandbox and an oracle replay for verifier unit tests (imported by the tests here)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentenv.types import Episode, Variant
from sandboxes.errors import SandboxFileNotFound, SandboxFileTooLarge
from sandboxes.types import ExecResult, FileEntry, SandboxSpec

Handler = Callable[["FakeSandbox", str], ExecResult]


class FakeSandbox:
    """Files in a dict; ``exec`` answers ``mktemp -d`` itself and hands other commands to ``handler``.

    ``special`` maps paths to what ``list_files`` reports there instead of a file: ``"dir"``,
    ``"symlink"``, ``"fifo"`` (size 0; reading one raises, as a real read would block) or an int
    (a file of that many bytes, e.g. a huge sparse file; reading it without a limit raises).
    The argv, env and stdin of the latest command are kept for handlers (``last_argv`` ...).
    """

    _ids = itertools.count()

    def __init__(self, files: Mapping[str, bytes] | None = None, handler: Handler | None = None,
                 special: Mapping[str, Any] | None = None) -> None:
        self.files: dict[str, bytes] = dict(files or {})
        self.special: dict[str, Any] = dict(special or {})
        self.last_argv: list[str] = []
        self.last_env: dict[str, str] = {}
        self.last_stdin: bytes | None = None
        self.reads: list[tuple[str, int | None]] = []
        self.execs: list[tuple[list[str], dict[str, str], bytes | None]] = []
        self.handler = handler or (lambda _sb, _cmd: ExecResult(0, "", ""))
        self.commands: list[str] = []
        self.closed = False
        self._id = f"fake-{next(self._ids)}"

    @property
    def id(self) -> str:
        return self._id

    @property
    def spec(self) -> SandboxSpec:
        return SandboxSpec(image="fake")

    def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        text = cmd if isinstance(cmd, str) else " ".join(cmd)
        self.commands.append(text)
        self.last_argv = [cmd] if isinstance(cmd, str) else list(cmd)
        self.last_env, self.last_stdin = dict(env or {}), stdin
        self.execs.append((self.last_argv, self.last_env, stdin))
        if isinstance(cmd, list) and cmd[:3] == ["rm", "-rf", "--"]:
            for target in cmd[3:]:
                for path in [p for p in self.files if p == target or p.startswith(target.rstrip("/") + "/")]:
                    del self.files[path]
            return ExecResult(0, "", "")
        if isinstance(cmd, list) and cmd[:2] == ["tail", "-c"]:
            return ExecResult(0, self.files.get(cmd[-1], b"")[-int(cmd[2]):].decode(errors="replace"), "")
        if isinstance(cmd, list) and cmd[:2] == ["mktemp", "-d"]:
            return ExecResult(0, cmd[2].replace("XXXXXXXX", f"{next(self._ids):08d}") + "\n", "")
        rm = re.match(r"bash -c rm -rf -- (.*)", text)
        if rm:
            for target in rm.group(1).replace("'", "").split():
                for path in [p for p in self.files if p == target or p.startswith(target.rstrip("/") + "/")]:
                    del self.files[path]
            return ExecResult(0, "", "")
        if text.startswith("bash -c for p in"):
            return ExecResult(0, "", "")
        return self.handler(self, text)

    def grading_exec(self) -> tuple[list[str], dict[str, str], bytes | None]:
        """The argv, env and stdin of the unit-tests verifier's ``bash -c`` grading command."""
        return next(e for e in self.execs if e[0][:2] == ["bash", "-c"] and len(e[0]) > 9)

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        self.reads.append((path, limit))
        kind = self.special.get(path)
        if kind == "fifo":
            raise AssertionError(f"read_file({path!r}) of a FIFO would block forever")
        if isinstance(kind, int):
            if limit is None or kind > limit:
                raise SandboxFileTooLarge(f"{path}: {kind} bytes") if limit is not None else MemoryError(path)
            return b"\0" * kind
        if path not in self.files:
            raise SandboxFileNotFound(path)
        if limit is not None and len(self.files[path]) > limit:
            raise SandboxFileTooLarge(f"{path}: {len(self.files[path])} bytes over {limit}")
        return self.files[path]

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        self.files[path] = data.encode() if isinstance(data, str) else data

    def list_files(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        base = path.rstrip("/") + "/"
        entries: dict[str, FileEntry] = {}
        for p, data in self.files.items():
            if p.startswith(base):
                head = p[len(base):].split("/", 1)
                full = base + head[0]
                entries[full] = FileEntry(full, len(data), True, 0o755) if len(head) > 1 else FileEntry(full, len(data), False, 0o644)
        for p, kind in self.special.items():
            if p.startswith(base) and "/" not in p[len(base):]:
                size = kind if isinstance(kind, int) else 0
                entries[p] = FileEntry(p, size, kind == "dir", 0o644, kind == "symlink")
        if not entries and not any(p.startswith(base) for p in self.files):
            raise SandboxFileNotFound(path)
        return sorted(entries.values(), key=lambda e: e.path)

    def snapshot(self, kind: Any = None, *, tag: str | None = None) -> Any:
        return dict(self.files)

    def close(self) -> None:
        self.closed = True


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
    (None: none written), ``exit_code`` the process's exit, ``lines`` is appended to the stream,
    ``finish=False`` drops the session-finish line, ``nonce`` forges the tag, ``preflight`` adds
    fields to the preflight report, ``collect`` adds collector outcomes (node id -> failed | skipped).
    """

    def __init__(self, *cases: tuple[str, str], junit: str | None | bool = True, exit_code: int | None = None,
                 lines: Sequence[str] = (), finish: bool = True, nonce: str | None = None,
                 preflight: Mapping[str, Any] | None = None, collect: Mapping[str, str] | None = None,
                 timed_out: bool = False, stdout_tail: str = "") -> None:
        self.cases, self.junit, self.exit_code, self.lines = cases, junit, exit_code, list(lines)
        self.finish, self.nonce, self.preflight = finish, nonce, dict(preflight or {})
        self.collect, self.timed_out, self.stdout_tail = dict(collect or {}), timed_out, stdout_tail

    def __call__(self, sb: FakeSandbox, cmd: str) -> ExecResult:
        import json

        argv = sb.last_argv
        if argv[:2] != ["bash", "-c"] or len(argv) < 9:
            return ExecResult(0, "", "")
        junit_path = argv[6]
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
        items = 0 if interrupted else len(self.cases)
        out.append(line("items", n=items))
        for name, status in ([] if interrupted else self.cases):
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
            sb.files[junit_path] = junit_xml(*self.cases).encode()
        elif isinstance(self.junit, str):
            sb.files[junit_path] = self.junit.encode()
        code = self.exit_code if self.exit_code is not None else honest_exit
        stdout = "\n".join(out) + "\n" + self.stdout_tail
        return ExecResult(124 if self.timed_out else code, stdout, "", timed_out=self.timed_out)
