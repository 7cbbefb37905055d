"""One adversarial test per isolation property of a default Docker sandbox.

Each test runs what a hostile or careless agent would run and checks the
sandbox holds: no network, no capabilities, bounded processes, bounded
memory, a non-root user, and typed errors for forbidden or missing paths.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import docker
import pytest

from sandboxes.docker_backend import DockerBackend
from sandboxes.errors import SandboxFileNotFound, SandboxPermissionError
from sandboxes.types import SandboxSpec

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def backend(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerBackend]:
    be = DockerBackend(docker_client, run_id=f"iso{uuid.uuid4().hex[:8]}", snapshot_dir=tmp_path_factory.mktemp("s"))
    yield be
    be.close()


@pytest.fixture(scope="module")
def spec(base_image: str) -> SandboxSpec:
    return SandboxSpec(image=base_image, memory_mb=96, pids=64, cpus=0.5)


def test_network_has_no_route_out(backend: DockerBackend, spec: SandboxSpec) -> None:
    sb = backend.create(spec)
    probe = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n    s.connect(('1.1.1.1', 80)); print('CONNECTED')\n"
        "except OSError as e:\n    print('blocked', e)\n"
    )
    r = sb.exec(["python3", "-c", probe], timeout=10)
    assert r.stdout.startswith("blocked"), r
    assert sb.exec("cat /proc/net/route").stdout.count("\n") <= 1  # header only: no default route
    assert sb.exec(["python3", "-c", "import socket; print(socket.if_nameindex())"]).stdout.strip() == "[(1, 'lo')]"


def test_capabilities_are_all_dropped(backend: DockerBackend, spec: SandboxSpec) -> None:
    sb = backend.create(spec.model_copy(update={"user": "root"}))  # even root has none
    status = sb.exec("grep CapEff /proc/self/status").stdout.split()
    assert status == ["CapEff:", "0000000000000000"]
    sb.exec("touch /workspace/f")
    assert sb.exec("chown 1000 /workspace/f").exit_code != 0
    assert sb.exec("mount -t tmpfs none /mnt").exit_code != 0
    assert sb.exec("grep NoNewPrivs /proc/self/status").stdout.split() == ["NoNewPrivs:", "1"]


def test_fork_bomb_is_contained_and_returns_within_the_deadline(backend: DockerBackend, spec: SandboxSpec) -> None:
    sb = backend.create(spec)
    t0 = time.monotonic()
    # The bomb runs in the background; the shell then spins without forking. The agent's pids
    # watchdog sees the sandbox at half its limit and kills this command and all it started
    # (exit 137) before the deadline would (124); either way the whole tree goes down.
    r = sb.exec("bomb() { bomb | bomb & }; bomb; while :; do :; done", timeout=3)
    elapsed = time.monotonic() - t0
    assert r.exit_code in (124, 137), r
    assert "fork" in r.stderr.lower(), "the pids limit should have stopped the bomb"
    assert r.timed_out or "half its pids limit" in r.stderr, r
    assert elapsed < 8, f"fork bomb took {elapsed:.1f}s to contain"
    limit = sb.exec("cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max")  # v1 or v2
    assert limit.stdout.strip() == "64"
    after = sb.exec("ps -e --no-headers | wc -l", timeout=10)
    assert after.exit_code == 0 and int(after.stdout) < 10, after


def test_memory_bomb_is_oom_killed(backend: DockerBackend, spec: SandboxSpec) -> None:
    sb = backend.create(spec)
    bomb = "a = []\nwhile True:\n    a.append(bytearray(8 << 20))\n"
    r = sb.exec(["python3", "-c", bomb], timeout=30)
    assert r.oom_killed, r
    assert r.exit_code == 137 and not r.timed_out
    assert sb.exec("echo alive").stdout == "alive\n"  # the agent survived: the bomb was picked


def test_default_user_is_unprivileged_agent(backend: DockerBackend, spec: SandboxSpec) -> None:
    sb = backend.create(spec)
    assert sb.exec("id -u; id -un").stdout.split() == ["1000", "agent"]
    assert sb.exec("touch /etc/owned").exit_code != 0


def test_forbidden_and_missing_paths_raise_typed_errors(backend: DockerBackend, spec: SandboxSpec) -> None:
    sb = backend.create(spec)
    with pytest.raises(SandboxPermissionError):
        sb.write_file("/etc/passwd", "root::0:0::/:/bin/sh\n")
    with pytest.raises(SandboxPermissionError):
        sb.write_file("/usr/local/bin/new/tool", b"x")
    with pytest.raises(SandboxPermissionError):
        sb.read_file("/etc/shadow")
    with pytest.raises(SandboxFileNotFound):
        sb.read_file("/workspace/missing.txt")
    assert b"root:" in sb.read_file("/etc/passwd")  # readable, just not writable
