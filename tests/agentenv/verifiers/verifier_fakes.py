"""In-memory fakes of a sandbox and an oracle replay for verifier unit tests (imported by the tests here)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentenv.types import Episode, Variant
from sandboxes.errors import SandboxFileNotFound
from sandboxes.types import ExecResult, SandboxSpec

Handler = Callable[["FakeSandbox", str], ExecResult]


class FakeSandbox:
    """Files in a dict; ``exec`` answers ``mktemp -d`` itself and hands other commands to ``handler``."""

    _ids = itertools.count()

    def __init__(self, files: Mapping[str, bytes] | None = None, handler: Handler | None = None) -> None:
        self.files: dict[str, bytes] = dict(files or {})
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

    def read_file(self, path: str) -> bytes:
        if path not in self.files:
            raise SandboxFileNotFound(path)
        return self.files[path]

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        self.files[path] = data.encode() if isinstance(data, str) else data

    def list_files(self, path: str, *, recursive: bool = False) -> list[Any]:
        return []

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
