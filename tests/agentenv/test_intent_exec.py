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
from sandboxes.errors import SandboxFileNotFound, SandboxFileTooLarge
from sandboxes.types import READ_LIMIT, ExecResult, FileEntry, SandboxSpec


class DirSandbox:
    """A fake ``Sandbox`` over a host directory: paths are real host paths under ``root``.

    Enough for the executor's contract (exec with stdin/cwd/timeout, read/write);
    it isolates nothing and is for unit tests only.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._spec = SandboxSpec(image="fake", workdir=str(root))
        self.reads: list[tuple[str, int | None]] = []  # (path, limit) of every read that returned bytes

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

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        try:
            size = Path(path).stat().st_size
        except FileNotFoundError:
            raise SandboxFileNotFound(path) from None
        cap = READ_LIMIT if limit is None else limit
        if size > cap:  # refused before reading, as the contract says
            raise SandboxFileTooLarge(f"{path}: {size} bytes, over the {cap}-byte limit")
        self.reads.append((path, limit))
        return Path(path).read_bytes()

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        existed = p.exists()
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        if mode is not None:
            p.chmod(mode)
        elif not existed:
            p.chmod(0o644)

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


def test_edits_patches_appends_and_moves_keep_the_file_mode(ex: IntentExecutor) -> None:
    root = Path(ex.cwd)
    script = root / "run.sh"
    script.write_text("#!/bin/sh\necho one\n")
    script.chmod(0o755)
    assert run(ex, "edit_replace", path="run.sh", old="one", new="two").ok
    patch = "*** Begin Patch\n*** Update File: run.sh\n@@\n-echo two\n+echo three\n*** End Patch"
    assert run(ex, "apply_patch", patch=patch).ok
    assert run(ex, "write_file", path="run.sh", content="echo four\n", append=True).ok
    assert run(ex, "write_file", path="run.sh", content="#!/bin/sh\necho five\n").ok
    assert script.stat().st_mode & 0o777 == 0o755
    move = "*** Begin Patch\n*** Update File: run.sh\n*** Move to: bin/run.sh\n@@\n-echo five\n+echo six\n*** End Patch"
    assert run(ex, "apply_patch", patch=move).ok
    moved = root / "bin" / "run.sh"
    assert moved.read_text() == "#!/bin/sh\necho six\n" and not script.exists()
    assert moved.stat().st_mode & 0o777 == 0o755, "a moved script lost its execute bit"
    assert run(ex, "write_file", path="fresh.txt", content="x").ok
    assert (root / "fresh.txt").stat().st_mode & 0o777 == 0o644


def test_edits_keep_every_byte_they_do_not_change(ex: IntentExecutor) -> None:
    f = Path(ex.cwd) / "latin1.py"
    f.write_bytes(b"# caf\xe9 au lait\r\nx = 1\n\xff\xfe tail\n")
    r = run(ex, "edit_replace", path="latin1.py", old="x = 1", new="x = 2")
    assert r.ok, r.error
    assert f.read_bytes() == b"# caf\xe9 au lait\r\nx = 2\n\xff\xfe tail\n"
    assert all("\udc80" > ch or ch > "\udcff" for line in r.data["snippet"] for ch in line), "lone surrogates shown to the model"
    patch = "*** Begin Patch\n*** Update File: latin1.py\n@@\n-x = 2\n+x = 3\n*** End Patch"
    assert run(ex, "apply_patch", patch=patch).ok
    assert f.read_bytes() == b"# caf\xe9 au lait\r\nx = 3\n\xff\xfe tail\n"
    assert run(ex, "write_file", path="latin1.py", content="y = 4\n", append=True).ok
    assert f.read_bytes() == b"# caf\xe9 au lait\r\nx = 3\n\xff\xfe tail\ny = 4\n"


@pytest.mark.parametrize("blob", [b"\x7fELF\x02\x01\x00\x00 x = 1 \x00\x00", bytes(range(128, 256)) * 4 + b"x = 1"])
def test_binary_files_are_refused_by_the_edit_tools_and_left_unchanged(ex: IntentExecutor, blob: bytes) -> None:
    f = Path(ex.cwd) / "blob.bin"
    f.write_bytes(blob)
    r = run(ex, "edit_replace", path="blob.bin", old="x = 1", new="x = 2")
    assert not r.ok and "binary file" in (r.error or "") and r.exit_code is None
    patch = "*** Begin Patch\n*** Update File: blob.bin\n@@\n-x = 1\n+x = 2\n*** End Patch"
    r = run(ex, "apply_patch", patch=patch)
    assert not r.ok and "binary file" in (r.error or "")
    assert f.read_bytes() == blob


def test_a_file_over_the_read_limit_is_read_by_range_never_whole(tmp_path: Path) -> None:
    sb = DirSandbox(tmp_path)
    ex = IntentExecutor(sb, read_limit=4096)
    big = tmp_path / "big.log"
    big.write_bytes(b"".join(b"line %d\n" % i for i in range(1, 5001)) + b"x" * 20_000 + b"\nlast")
    r = run(ex, "read_file", path="big.log", offset=10, limit=3)
    assert r.ok, r.error
    assert r.data["lines"] == ["line 10", "line 11", "line 12"] and r.data["start"] == 10 and r.truncated
    assert r.data["total_lines"] == 5002 and r.data["size"] == big.stat().st_size
    tail = run(ex, "read_file", path="big.log", offset=-2)
    assert tail.data["start"] == 5001 and tail.data["lines"][1] == "last"
    assert tail.data["lines"][0].startswith("xxxx") and tail.data["lines"][0].endswith("[line truncated]")
    assert len(tail.data["lines"][0]) < 9000  # one huge line is capped, not sent whole
    assert all(limit == 4096 for _, limit in sb.reads)
    assert not any(p.endswith("big.log") for p, _ in sb.reads), "the whole file went through read_file"


def test_editing_a_file_over_the_read_limit_is_refused_with_its_size(tmp_path: Path) -> None:
    ex = IntentExecutor(DirSandbox(tmp_path), read_limit=1024)
    big = tmp_path / "big.txt"
    big.write_bytes(b"a = 1\n" * 1000)
    r = run(ex, "edit_replace", path="big.txt", old="a = 1", new="a = 2", replace_all=True)
    assert not r.ok and "file is 6000 bytes, over the 1024-byte limit" in (r.error or ""), r.error
    assert run(ex, "write_file", path="big.txt", content="b\n").ok  # overwriting needs no read
    assert big.read_bytes() == b"b\n"


def test_the_read_limit_follows_the_sandbox_memory(tmp_path: Path) -> None:
    sb = DirSandbox(tmp_path)
    sb._spec = SandboxSpec(image="fake", workdir=str(tmp_path), memory_mb=32)
    assert IntentExecutor(sb).read_limit == 4 << 20
    assert IntentExecutor(DirSandbox(tmp_path)).read_limit == 8 << 20


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


@pytest.mark.docker
def test_file_tools_on_docker_keep_modes_bytes_and_the_agent_alive(base_image: str) -> None:
    """On a real container with 64 MiB of memory: an edit keeps a script's execute bit and a Latin-1
    byte, an edit of a binary file is refused, and a 200 MB file is read by range, the sandbox still alive."""
    from sandboxes.docker_backend import DockerBackend

    backend = DockerBackend()
    sb = backend.create(SandboxSpec(image=base_image, memory_mb=64))
    try:
        ex = IntentExecutor(sb, state=EpisodeState())
        w = sb.spec.workdir
        assert sb.exec(f"printf '#!/bin/sh\\necho caf\\351\\n' > {w}/run.sh && chmod 755 {w}/run.sh").ok
        assert run(ex, "edit_replace", path="run.sh", old="echo", new="printf '%s\\n'").ok
        assert sb.exec(f"stat -c %a {w}/run.sh").stdout.strip() == "755"
        assert sb.read_file(f"{w}/run.sh") == b"#!/bin/sh\nprintf '%s\\n' caf\xe9\n"
        assert sb.exec(f"head -c 4096 /dev/urandom > {w}/blob.bin").ok
        before = sb.read_file(f"{w}/blob.bin")
        assert "binary file" in (run(ex, "edit_replace", path="blob.bin", old="a", new="b").error or "")
        assert sb.read_file(f"{w}/blob.bin") == before
        assert sb.exec(f"yes 'a fairly long line of text for the log' | head -c 200000000 > {w}/big.log", timeout=120).ok
        r = run(ex, "read_file", path="big.log", offset=1_000_000, limit=2)
        assert r.ok and r.data["lines"] == ["a fairly long line of text for the log"] * 2, r.error
        assert run(ex, "exec_shell", command="echo alive").output.strip() == "alive"
    finally:
        sb.close()
        backend.close()
