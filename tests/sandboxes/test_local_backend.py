"""LocalBackend beyond the shared contract: one adversarial test per property it claims.

Each property runs in both modes (bubblewrap, when it works here, and plain
subprocesses); properties only one mode has are tested in that mode, and the
limitations the module docstring admits are pinned too, so that a change in
what is isolated shows up as a test change.

Nothing here skips and nothing is left out at collection: every bubblewrap
case is collected and runs on every host (``scripts/setup.sh`` installs
bubblewrap). Where bubblewrap cannot make namespaces, each of them fails,
naming the probe's reason: a case that cannot run here is a failure, never a
silent pass. ``test_the_bwrap_probe_tells_the_truth_on_this_host`` checks the
probe itself (a broken probe cannot fake either verdict), that insisting on
bubblewrap where it fails is refused with the probe's reason, and that the
automatic fallback is logged. ``AGENTENV_EXPECT_BWRAP=1`` (or ``0``) pins the
verdict a machine must reach.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandboxes.local_backend as local_backend
from sandboxes.errors import PathEscape, SandboxLost, SandboxPermissionError, SnapshotError, SpecError
from sandboxes.local_backend import ISOLATION_BWRAP, ISOLATION_PLAIN, LocalBackend, LocalSandbox
import sandboxes.local_exec as local_exec
from sandboxes.local_exec import BwrapProbe
from sandboxes.types import SandboxSpec, SnapshotKind

pytestmark = pytest.mark.unit

SPEC = SandboxSpec(image="agentenv-base:latest")
PROBE = LocalBackend.probe()
MODES = ["bwrap", "plain"]  # both on every host: a bwrap case that cannot run here fails, naming why


@pytest.fixture(params=MODES)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalBackend]:
    if request.param == "bwrap" and not PROBE.works:
        pytest.fail(f"a bubblewrap case cannot run on this host (scripts/setup.sh installs it): {PROBE.reason}", pytrace=False)
    made = LocalBackend(tmp_path / "root", use_bwrap=request.param == "bwrap")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def sandbox(backend: LocalBackend) -> Iterator[LocalSandbox]:
    made = backend.create(SPEC)
    try:
        yield made
    finally:
        made.close()


def _host_pids_with(needle: bytes) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if name.isdigit() and needle in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def _token() -> str:
    return f"28{secrets.randbelow(10)}.{secrets.randbelow(10**6):06d}"


# -- what it says about itself -------------------------------------------------


def test_isolation_is_stated_plainly(backend: LocalBackend) -> None:
    assert "does NOT isolate" in (local_backend.__doc__ or "")
    assert backend.isolation == (ISOLATION_BWRAP if backend.use_bwrap else ISOLATION_PLAIN)
    assert "NOT enforced" in backend.isolation
    if not backend.use_bwrap:
        assert "NO file system isolation" in backend.isolation and "NO network isolation" in backend.isolation


def test_the_bwrap_probe_tells_the_truth_on_this_host(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    expected = os.environ.get("AGENTENV_EXPECT_BWRAP")
    if expected is not None:
        assert PROBE.works == (expected == "1"), f"AGENTENV_EXPECT_BWRAP={expected} but the probe says: {PROBE.reason}"
    assert PROBE.reason
    if PROBE.works:
        backend = LocalBackend(tmp_path)
        try:
            assert backend.use_bwrap and backend.isolation == ISOLATION_BWRAP and "bubblewrap" in backend.mode_reason
            assert int(backend.create(SPEC).exec("ls /proc | grep -c '^[0-9]'").stdout) < 10  # own pid namespace
        finally:
            backend.close()
        return
    # "no" must be true: the simplest namespaced command fails here too, not only our full argv
    if PROBE.bwrap is not None:
        minimal = [PROBE.bwrap, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
        done = subprocess.run(minimal, capture_output=True, timeout=30)
        assert done.returncode != 0, f"bwrap works with {minimal} but the probe says no: {PROBE.reason}"
    with pytest.raises(SpecError, match="bubblewrap") as refused:
        LocalBackend(tmp_path, use_bwrap=True)
    assert PROBE.reason in str(refused.value)
    with caplog.at_level(logging.WARNING, logger=local_backend.__name__):
        fallback = LocalBackend(tmp_path)
    try:
        assert not fallback.use_bwrap and fallback.isolation == ISOLATION_PLAIN
        assert PROBE.reason in fallback.mode_reason and "NO isolation" in fallback.mode_reason
        assert any(PROBE.reason in r.getMessage() for r in caplog.records), "the fallback must not be silent"
    finally:
        fallback.close()


def test_without_bwrap_insisting_is_refused_and_the_fallback_is_logged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reason = "bwrap: No permissions to create new namespace (simulated)"
    monkeypatch.setattr(local_backend, "probe_bwrap", lambda: BwrapProbe(False, reason, "/usr/bin/bwrap"))
    with pytest.raises(SpecError, match=r"use_bwrap: expected a host where bubblewrap works, got: .*simulated"):
        LocalBackend(tmp_path, use_bwrap=True)
    with caplog.at_level(logging.WARNING, logger=local_backend.__name__):
        fallback = LocalBackend(tmp_path)
    assert not fallback.use_bwrap and fallback.isolation == ISOLATION_PLAIN
    assert reason in fallback.mode_reason and any(reason in r.getMessage() for r in caplog.records)
    fallback.close()
    caplog.clear()
    forced = LocalBackend(tmp_path, use_bwrap=False)  # asked for: no warning
    assert "use_bwrap=False" in forced.mode_reason and not caplog.records
    forced.close()


def test_the_probe_names_why_bwrap_does_not_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(local_exec, "_which", lambda program: None)
    missing = local_exec._probe_bwrap()
    assert not missing.works and "not on PATH" in missing.reason
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(local_exec, "_which", lambda program: str(fake) if program == "bwrap" else None)
    refused = local_exec._probe_bwrap()
    assert not refused.works and refused.bwrap == str(fake)
    assert "exit 1: bwrap: No permissions to create new namespace" in refused.reason


# -- paths never leave the sandbox -------------------------------------------


def test_symlink_to_a_host_file_is_neither_read_nor_written(sandbox: LocalSandbox) -> None:
    before = Path("/etc/passwd").read_bytes()
    assert sandbox.exec("ln -s /etc/passwd leak").ok
    with pytest.raises(PathEscape):
        sandbox.read_file("leak")
    with pytest.raises(PathEscape):
        sandbox.write_file("/workspace/leak", b"owned\n")
    with pytest.raises(PathEscape):
        sandbox.list_files("leak")
    assert Path("/etc/passwd").read_bytes() == before
    assert not (sandbox.root / "etc" / "passwd").exists()  # nor created inside instead


def test_intermediate_directory_symlink_escape_is_refused(sandbox: LocalSandbox) -> None:
    name = f"agentenv-escape-{secrets.token_hex(4)}"
    assert sandbox.exec("ln -s /etc etcdir && ln -s ../../../../../../../../.. up").ok
    for path in ("etcdir/passwd", "up/etc/passwd", "/workspace/up/etc/hostname"):
        with pytest.raises(PathEscape):
            sandbox.read_file(path)
    for path in (f"etcdir/{name}", f"up/tmp/{name}", f"etcdir/sub/{name}"):
        with pytest.raises(PathEscape):
            sandbox.write_file(path, b"x")
    with pytest.raises(PathEscape):
        sandbox.list_files("etcdir", recursive=True)
    assert not Path("/etc", name).exists() and not Path("/tmp", name).exists() and not Path("/etc/sub").exists()


@pytest.mark.parametrize("path", ["/../etc/passwd", "../../../../etc/passwd", "/workspace/../../etc/passwd"])
def test_dotdot_above_the_root_is_refused(sandbox: LocalSandbox, path: str) -> None:
    with pytest.raises(PathEscape):
        sandbox.read_file(path)
    with pytest.raises(PathEscape):
        sandbox.write_file(path, b"x")


def test_links_and_dotdot_inside_the_sandbox_work(sandbox: LocalSandbox) -> None:
    sandbox.write_file("real.txt", b"real")
    assert sandbox.exec("ln -s real.txt rel && ln -s /workspace/real.txt abs && ln -s /workspace ws").ok
    assert sandbox.read_file("rel") == sandbox.read_file("abs") == sandbox.read_file("ws/real.txt") == b"real"
    assert sandbox.read_file("/workspace/../workspace/./real.txt") == b"real"
    sandbox.write_file("rel", b"through")  # like `echo > rel`: the target changes, the link stays
    assert sandbox.read_file("real.txt") == b"through"
    assert os.path.islink(sandbox.root / "workspace" / "rel")


def test_a_fifo_is_refused_not_waited_on(backend: LocalBackend, sandbox: LocalSandbox) -> None:
    assert sandbox.exec("mkfifo pipe && echo kept > file").ok
    with pytest.raises(SpecError, match="not a regular file"):  # a wait would hang: pytest-timeout fails it
        sandbox.read_file("pipe")
    restored = backend.restore(sandbox.snapshot())  # a snapshot neither blocks on it nor keeps it
    assert [e.path for e in restored.list_files("/workspace")] == ["/workspace/file"]
    restored.close()


def test_snapshots_keep_symlinks_as_links(backend: LocalBackend, sandbox: LocalSandbox) -> None:
    assert sandbox.exec("ln -s /etc/passwd leak").ok
    restored = backend.restore(sandbox.snapshot())
    try:
        assert os.readlink(restored.root / "workspace" / "leak") == "/etc/passwd"
        with pytest.raises(PathEscape):
            restored.read_file("leak")
    finally:
        restored.close()


def test_os_permission_errors_become_sandbox_permission_error(
    sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox.write_file("secret.txt", b"s")
    real_open = os.open

    def deny(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "secret.txt":  # root bypasses file modes, so the kernel's answer is simulated
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(SandboxPermissionError):
        sandbox.read_file("secret.txt")


# -- processes ---------------------------------------------------------------


def test_timeout_kills_a_child_that_left_the_process_group(sandbox: LocalSandbox) -> None:
    token = _token()
    result = sandbox.exec(f"setsid sleep {token} & sleep {token}", timeout=1)
    assert result.timed_out
    deadline = time.monotonic() + 3
    while _host_pids_with(f"sleep\0{token}".encode()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _host_pids_with(f"sleep\0{token}".encode()) == []


def test_background_processes_end_by_close_at_the_latest(backend: LocalBackend) -> None:
    sandbox = backend.create(SPEC)
    token = _token()
    assert sandbox.exec(f"sleep {token} &").ok
    alive = _host_pids_with(f"sleep\0{token}".encode())
    # under bubblewrap the pid namespace ends with the command; plain mode keeps them until close
    assert (alive == []) if backend.use_bwrap else (len(alive) == 1)
    sandbox.close()
    assert _host_pids_with(f"sleep\0{token}".encode()) == []


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
def test_memory_limit_is_an_address_space_rlimit(backend: LocalBackend) -> None:
    sandbox = backend.create(SandboxSpec(image="x", memory_mb=128))
    try:
        result = sandbox.exec(["python3", "-c", "b = bytearray(512 * 2**20)"], timeout=30)
        assert result.exit_code == 1 and "MemoryError" in result.stderr
        assert not result.oom_killed  # documented: allocations fail, nothing is OOM-killed
    finally:
        sandbox.close()


def test_undecodable_output_is_replaced_not_raised(sandbox: LocalSandbox) -> None:
    assert sandbox.exec(["printf", "\\377ok"]).stdout == "\ufffdok"


# -- what each mode exposes ----------------------------------------------------


def _bwrap_hides_the_host_and_the_network(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "root", use_bwrap=True)
    sandbox = backend.create(SPEC)
    networked = backend.create(SandboxSpec(image="x", network=True))
    try:
        assert sandbox.exec("test -e /etc/passwd || test -e /work || test -e /root").exit_code == 1
        assert sandbox.exec(["test", "-e", str(tmp_path)]).exit_code == 1
        interfaces = sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()
        assert interfaces == ["lo"]
        assert len(networked.exec("tail -n +3 /proc/net/dev").stdout.splitlines()) == len(
            Path("/proc/net/dev").read_text().splitlines()[2:]
        )
        assert int(sandbox.exec("ls /proc | grep -c '^[0-9]'").stdout) < 10  # own pid namespace
        assert sandbox.exec("mkdir /newdir").exit_code != 0  # root is read-only outside the sandbox's dirs
        assert sandbox.exec("touch /usr/agentenv-x").exit_code != 0
        assert sandbox.exec("echo ok > /tmp/t && cat /tmp/t && echo $HOME").stdout == "ok\n/home/agent\n"
    finally:
        backend.close()


if PROBE.works:  # collected only where the probe says yes (its verdict is itself tested above)
    test_bwrap_hides_the_host_and_the_network = _bwrap_hides_the_host_and_the_network


def test_plain_mode_exposes_the_host(tmp_path: Path) -> None:
    """Pins the documented limitation: plain subprocesses see the host."""
    backend = LocalBackend(tmp_path / "root", use_bwrap=False)
    try:
        sandbox = backend.create(SPEC)
        assert sandbox.exec("test -r /etc/passwd").ok
        assert sandbox.exec("pwd").stdout.strip() == str(sandbox.root / "workspace")
    finally:
        backend.close()


def test_bwrap_refuses_a_workdir_under_a_host_directory(backend: LocalBackend) -> None:
    spec = SandboxSpec(image="x", workdir="/usr/src/app")
    if backend.use_bwrap:
        with pytest.raises(SpecError, match="workdir"):
            backend.create(spec)
    else:
        sandbox = backend.create(spec)
        assert sandbox.exec("ls").ok
        sandbox.close()


# -- snapshots and lifecycle -----------------------------------------------------


def test_image_snapshots_outlive_the_backend_and_fast_ones_do_not(tmp_path: Path) -> None:
    first = LocalBackend(tmp_path, use_bwrap=False)
    sandbox = first.create(SPEC)
    sandbox.write_file("a.txt", b"durable")
    image = sandbox.snapshot(SnapshotKind.IMAGE, tag="my-env.v1")
    fast = sandbox.snapshot(SnapshotKind.FAST)
    first.close()

    second = LocalBackend(tmp_path, use_bwrap=False)
    try:
        assert second.find_image("my-env.v1") == image
        assert second.restore(image).read_file("a.txt") == b"durable"
        with pytest.raises(SnapshotError, match="gone"):
            second.restore(fast)
        with pytest.raises(SnapshotError):
            second.find_image("never-tagged")
    finally:
        second.close()


def test_bad_tags_and_foreign_refs_are_refused(backend: LocalBackend, sandbox: LocalSandbox) -> None:
    with pytest.raises(SpecError):
        sandbox.snapshot(SnapshotKind.IMAGE, tag="../../escape")
    foreign = sandbox.snapshot()
    with pytest.raises(SnapshotError, match="docker"):
        backend.restore(type(foreign)(**{**foreign.__dict__, "backend": "docker"}))
    with pytest.raises(SpecError):
        backend.fork(foreign, 0)


def test_a_removed_directory_is_sandbox_lost(backend: LocalBackend) -> None:
    sandbox = backend.create(SPEC)
    shutil.rmtree(sandbox.root)
    with pytest.raises(SandboxLost):
        sandbox.exec("true")
    sandbox.close()


def test_close_removes_read_only_trees_and_the_run_directory(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, use_bwrap=False)
    sandbox = backend.create(SPEC)
    assert sandbox.exec("mkdir -p ro/sub && touch ro/sub/f && chmod 555 ro/sub ro").ok
    root = sandbox.root
    backend.close()
    assert not root.exists() and not backend.run_dir.exists()
    with pytest.raises(SandboxLost):
        backend.create(SPEC)


def test_a_missing_program_exits_127(sandbox: LocalSandbox) -> None:
    result = sandbox.exec(["agentenv-no-such-program"])
    assert result.exit_code == 127 and "agentenv-no-such-program" in result.stderr


def test_reap_removes_runs_of_dead_owners_only(tmp_path: Path) -> None:
    live = LocalBackend(tmp_path, use_bwrap=False)
    crashed = LocalBackend(tmp_path, use_bwrap=False)
    crashed.create(SPEC)
    # what a crash leaves: the owner is gone (an impossible start time stands in for a dead pid)
    owner = crashed.run_dir / "owner.json"
    owner.write_text(owner.read_text().replace('"start": "', '"start": "dead-'))
    assert LocalBackend.reap(tmp_path) == 1
    assert not crashed.run_dir.exists() and live.run_dir.exists()
    assert LocalBackend.reap(tmp_path) == 0
    live.close()
