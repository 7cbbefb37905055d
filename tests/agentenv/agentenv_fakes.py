"""Small in-process fakes for unit tests: a directory-backed backend and a one-tool harness.

The backend runs commands with ``subprocess`` in a private temp directory that
is also the spec's workdir, so tasks that stay inside their workdir behave as
in a container. The harness understands ``<tool_call>{"name", "arguments"}</tool_call>``
with tools ``sh`` and ``submit``, and turns anything else into a ``ParseError``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentenv.intents import Harness, Intent, IntentResult, ParsedTurn, ParseError, RenderedPrompt, ToolCall
from sandboxes.errors import SandboxFileNotFound, SandboxFileTooLarge
from sandboxes.types import READ_LIMIT, ExecResult, FileEntry, SandboxSpec, SnapshotKind, SnapshotRef


class FakeSandbox:
    def __init__(self, backend: FakeBackend, spec: SandboxSpec, root: Path) -> None:
        self._backend = backend
        self.root = root
        self._spec = spec.model_copy(update={"workdir": str(root)})
        self._id = uuid.uuid4().hex[:8]
        self.closed = False

    @property
    def id(self) -> str:
        return self._id

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        try:
            proc = subprocess.run(cmd, shell=isinstance(cmd, str), cwd=cwd or self.root, input=stdin,
                                  capture_output=True, timeout=timeout or 30, env={"PATH": "/usr/bin:/bin", **(env or {})})
        except subprocess.TimeoutExpired:
            return ExecResult(124, "", "", timed_out=True)
        return ExecResult(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))

    def _p(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_relative_to(self.root) else self.root / path.lstrip("/")

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        p = self._p(path)
        try:
            size = p.stat().st_size
        except FileNotFoundError as exc:
            raise SandboxFileNotFound(path) from exc
        cap = READ_LIMIT if limit is None else limit
        if size > cap:
            raise SandboxFileTooLarge(f"{path}: {size} bytes, over the {cap}-byte limit")
        return p.read_bytes()

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        p = self._p(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        existed = p.exists()
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        if mode is not None or not existed:
            p.chmod(0o644 if mode is None else mode)

    def list_files(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        base = self._p(path)
        items = base.rglob("*") if recursive else base.iterdir()
        return sorted((FileEntry(str(p), p.stat().st_size, p.is_dir(), p.stat().st_mode) for p in items), key=lambda e: e.path)

    def snapshot(self, kind: SnapshotKind = SnapshotKind.FAST, *, tag: str | None = None) -> SnapshotRef:
        blob = Path(tempfile.mkdtemp(prefix="fake-snap-")) / "tree"
        shutil.copytree(self.root, blob)
        self._backend.dirs.append(blob.parent)
        return SnapshotRef(uuid.uuid4().hex[:8], kind, "fake", self._spec.image, str(blob), self._spec)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            shutil.rmtree(self.root, ignore_errors=True)


class FakeBackend:
    name = "local"  # it runs no image, like the local backend

    def __init__(self) -> None:
        self.sandboxes: list[FakeSandbox] = []
        self.dirs: list[Path] = []

    def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox = FakeSandbox(self, spec, Path(tempfile.mkdtemp(prefix="fake-sbx-")))
        self.sandboxes.append(sandbox)
        return sandbox

    def restore(self, ref: SnapshotRef) -> FakeSandbox:
        sandbox = self.create(ref.spec)
        shutil.copytree(ref.location, sandbox.root, dirs_exist_ok=True)
        return sandbox

    def fork(self, ref: SnapshotRef, n: int) -> list[FakeSandbox]:
        return [self.restore(ref) for _ in range(n)]

    def open_count(self) -> int:
        return sum(1 for s in self.sandboxes if not s.closed)

    def close(self) -> None:
        for s in self.sandboxes:
            s.close()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


class FakeHarness(Harness):  # the Protocol's default turn_intents
    name = "fake"

    def render(self, instruction: str, effort: str | None = None) -> RenderedPrompt:
        return RenderedPrompt(messages=[{"role": "system", "content": "Use sh and submit."}, {"role": "user", "content": instruction}],
                              tools=[{"type": "function", "function": {"name": "sh"}}])

    def parse(self, output: str | Mapping[str, Any]) -> ParsedTurn:
        text = output if isinstance(output, str) else str(output.get("content", ""))
        calls, errors = [], []
        for i, raw in enumerate(_CALL.findall(text)):
            try:
                obj = json.loads(raw)
                calls.append(ToolCall(obj["name"], obj.get("arguments", {}), f"c{i}"))
            except (ValueError, KeyError, TypeError) as exc:
                errors.append(ParseError(f"bad tool call: {exc}", raw=raw))
        if not calls and not errors and text.strip():
            errors.append(ParseError("no <tool_call> found", raw=text[:100]))
        return ParsedTurn(text=_CALL.sub("", text), calls=calls, errors=errors)

    def to_intent(self, call: ToolCall) -> Intent | ParseError:
        if call.name == "sh":
            return Intent("exec_shell", {"command": call.arguments.get("command", "")}, call.call_id, tool="sh")
        if call.name == "submit":
            return Intent("submit", {"answer": call.arguments.get("answer")}, call.call_id, tool="submit")
        return ParseError(f"unknown tool {call.name!r}", call_id=call.call_id)

    def format_result(self, result: IntentResult) -> Mapping[str, Any]:
        return {"role": "tool", "content": result.output if result.ok else f"ERROR: {result.error or result.output}"}

    def format_error(self, error: ParseError) -> Mapping[str, Any]:
        return {"role": "tool", "content": f"ERROR: {error.message}"}


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
