"""Every intent on a small directory-backed fake sandbox (unit) and on real Docker (docker)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from agentenv.intent_exec import EpisodeState, IntentExecutor
from agentenv.intents import Intent
from sandboxes.errors import SandboxFileNotFound
from sandboxes.types import ExecResult, FileEntry, SandboxSpec


class DirSandbox:
    """A fake ``Sandbox`` over a host directory: paths are real host paths under ``root``.

    Enough for the executor's contract (exec with stdin/cwd/timeout, read/write);
    it isolates nothing and is for unit tests only.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._spec = SandboxSpec(image="fake", workdir=str(root))

    @property
    def id(self) -> str:
        return "fake"

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None) -> ExecResult:
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd if not isinstance(cmd, str) else ["bash", "-c", cmd], input=stdin or b"",
                               capture_output=True, timeout=timeout or 60, cwd=cwd or self._spec.workdir)
        except subprocess.TimeoutExpired:
            return ExecResult(124, "", "", timed_out=True, duration_s=time.monotonic() - t0)
        return ExecResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"),
                          duration_s=time.monotonic() - t0)

    def read_file(self, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            raise SandboxFileNotFound(path) from None

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data.encode() if isinstance(data, str) else data)

    def list_files(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        it = Path(path).rglob("*") if recursive else Path(path).iterdir()
        return sorted((FileEntry(str(p), p.stat().st_size, p.is_dir(), p.stat().st_mode) for p in it), key=lambda e: e.path)

    def snapshot(self, *a: object, **k: object):  # pragma: no cover - not used here
        raise NotImplementedError

    def close(self) -> None:
        pass


@pytest.fixture
def ex(tmp_path: Path) -> IntentExecutor:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 1\n")
    (tmp_path / "src" / "b.txt").write_text("alpha\nbeta\ngamma\n")
    (tmp_path / "README.md").write_text("# demo\n")
    return IntentExecutor(DirSandbox(tmp_path))


def run(ex: IntentExecutor, name: str, **args: object):
    return ex.execute(Intent(name, args))  # type: ignore[arg-type]


pytestmark = pytest.mark.unit


def test_exec_shell_string_and_argv(ex: IntentExecutor) -> None:
    r = run(ex, "exec_shell", command="echo hi; echo err >&2; exit 3")
    assert not r.ok and r.exit_code == 3 and "hi" in r.output and "err" in r.output and r.error is None
    r = run(ex, "exec_shell", command=["bash", "-lc", "pwd"], cwd="src")
    assert r.ok and r.output.strip().endswith("/src")


def test_exec_shell_timeout_and_bad_args(ex: IntentExecutor) -> None:
    r = run(ex, "exec_shell", command="sleep 5", timeout_s=1)
    assert r.timed_out and not r.ok and "timed out" in (r.error or "")
    assert "must be" in (run(ex, "exec_shell", command=5).error or "")
    assert "missing" in (run(ex, "exec_shell").error or "")


def test_read_file_offset_limit_and_tail(ex: IntentExecutor) -> None:
    r = run(ex, "read_file", path="src/b.txt", offset=2, limit=1)
    assert r.ok and r.output == "beta" and r.data["start"] == 2 and r.data["total_lines"] == 3 and r.truncated
    assert run(ex, "read_file", path="src/b.txt", offset=-1).output == "gamma"
    assert "not found" in (run(ex, "read_file", path="nope").error or "")


def test_write_file_and_append(ex: IntentExecutor) -> None:
    assert run(ex, "write_file", path="new/x.txt", content="one\n").data["created"]
    run(ex, "write_file", path="new/x.txt", content="two\n", append=True)
    assert (Path(ex.cwd) / "new/x.txt").read_text() == "one\ntwo\n"


def test_edit_replace_rules(ex: IntentExecutor) -> None:
    assert "occurs 2 times" in (run(ex, "edit_replace", path="src/a.py", old="return 1", new="return 2").error or "")
    assert "not found" in (run(ex, "edit_replace", path="src/a.py", old="nope", new="x").error or "")
    assert "identical" in (run(ex, "edit_replace", path="src/a.py", old="def", new="def").error or "")
    r = run(ex, "edit_replace", path="src/a.py", old="return 1", new="return 2", replace_all=True)
    assert r.ok and r.data["replacements"] == 2
    r = run(ex, "edit_replace", path="src/a.py", edits=[{"old": "def f", "new": "def h"}, {"old": "nope", "new": "x"}])
    assert not r.ok and "edit 2" in (r.error or "")
    assert "def f" in (Path(ex.cwd) / "src/a.py").read_text()  # all or nothing


def test_apply_patch_add_update_move_delete(ex: IntentExecutor) -> None:
    patch = """*** Begin Patch
*** Add File: docs/new.md
+hello
*** Update File: src/b.txt
*** Move to: src/c.txt
@@
 alpha
-beta
+BETA
*** Delete File: README.md
*** End Patch"""
    r = run(ex, "apply_patch", patch=patch)
    assert r.ok, r.error
    root = Path(ex.cwd)
    assert (root / "docs/new.md").read_text() == "hello\n"
    assert (root / "src/c.txt").read_text() == "alpha\nBETA\ngamma\n" and not (root / "src/b.txt").exists()
    assert not (root / "README.md").exists()
    bad = "*** Begin Patch\n*** Update File: src/c.txt\n@@\n-zeta\n+eta\n*** End Patch"
    r = run(ex, "apply_patch", patch=bad)
    assert not r.ok and "src/c.txt" in (r.error or "") and "patch line 3" in (r.error or "")


def test_glob_and_grep(ex: IntentExecutor) -> None:
    assert run(ex, "glob", pattern="**/*.py").data["items"] == [f"{ex.cwd}/src/a.py"]
    assert run(ex, "glob", pattern="*.{md,txt}").data["items"] == [f"{ex.cwd}/README.md"]
    r = run(ex, "grep", pattern="return", output_mode="content")
    assert r.data["items"] == [f"{ex.cwd}/src/a.py:2:    return 1", f"{ex.cwd}/src/a.py:6:    return 1"]
    r = run(ex, "grep", pattern="BETA", ignore_case=True, output_mode="count")
    assert r.data["items"] == [f"{ex.cwd}/src/b.txt:1"]
    r = run(ex, "grep", pattern="beta", output_mode="content", context_before=1, line_numbers=True)
    assert r.data["items"] == [f"{ex.cwd}/src/b.txt-1-alpha", f"{ex.cwd}/src/b.txt:2:beta"]
    assert run(ex, "grep", pattern="def", glob="*.txt").data["items"] == []
    assert "bad regex" in (run(ex, "grep", pattern="(").error or "")
    assert run(ex, "grep", pattern="e", head_limit=1).truncated


def test_plan_update_keeps_episode_state(ex: IntentExecutor) -> None:
    r = run(ex, "plan_update", items=[{"text": "read", "status": "completed"}, {"text": "fix", "status": "in_progress"}])
    assert r.ok and "[x] read" in r.output and ex.state.plan_updates == 1
    assert run(ex, "plan_update").data["items"][1] == {"text": "fix", "status": "in_progress"}
    assert "status must be" in (run(ex, "plan_update", items=[{"text": "x", "status": "done"}]).error or "")


def test_submit(ex: IntentExecutor) -> None:
    r = run(ex, "submit", answer="42")
    assert r.ok and ex.state.submitted and ex.state.answer == "42"


@pytest.mark.docker
def test_every_intent_on_docker(base_image: str) -> None:
    from sandboxes.docker_backend import DockerBackend  # docker tests never skip

    backend = DockerBackend()
    sb = backend.create(SandboxSpec(image=base_image))
    try:
        ex = IntentExecutor(sb, state=EpisodeState())
        assert run(ex, "write_file", path="pkg/m.py", content="x = 1\ny = 2\n").ok
        assert run(ex, "write_file", path="pkg/m.py", content="z = 3\n", append=True).ok
        assert run(ex, "read_file", path="pkg/m.py", offset=2, limit=2).output == "y = 2\nz = 3"
        assert run(ex, "edit_replace", path="pkg/m.py", old="y = 2", new="y = 20").ok
        patch = "*** Begin Patch\n*** Update File: pkg/m.py\n@@\n x = 1\n-y = 20\n+y = 200\n*** End Patch"
        assert run(ex, "apply_patch", patch=patch).ok
        r = run(ex, "exec_shell", command="python3 -c 'import pkg.m as m; print(m.y)'")
        assert r.ok and r.output.strip() == "200"
        assert run(ex, "glob", pattern="**/*.py").data["items"] == [f"{sb.spec.workdir}/pkg/m.py"]
        assert run(ex, "grep", pattern="y = ", output_mode="count").data["items"] == [f"{sb.spec.workdir}/pkg/m.py:1"]
        assert run(ex, "plan_update", items=[{"text": "t", "status": "pending"}]).ok
        assert run(ex, "submit").ok and ex.state.submitted
    finally:
        sb.close()
        backend.close()
