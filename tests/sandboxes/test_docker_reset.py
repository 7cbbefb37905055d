"""DockerBackend.reset on the real daemon: a reset sandbox is indistinguishable from a fresh one.

Every check compares against a freshly started container of the same image,
so a reset that leaves anything behind (a file, a mode, an owner, a process)
fails here. The refusal cases check that reset says False rather than
guessing when the sandbox user cannot restore something exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandboxes.docker_backend import DockerBackend, DockerSandbox
from sandboxes.pool import SandboxPool
from sandboxes.types import SandboxSpec, SnapshotKind

pytestmark = pytest.mark.docker

WRITABLE = "/workspace /tmp /home/agent /dev/shm /dev/mqueue"
# Whole root fs (names, sizes, modes, owners, types, link targets) plus hashes and mtimes of the
# trees the sandbox user can write. Directory mtimes of root-owned mount points are left out.
LISTING = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /opt/agentenv \\) -prune -o "
    "-printf '%p %s %m %u %g %y %l\\n' | sort; "
    f"find {WRITABLE} -mindepth 1 -printf '%p %T@\\n' | sort; "
    f"find {WRITABLE} -type f -exec sha256sum {{}} + | sort"
)
PROCS = "ps -eo user,args --no-headers | grep -v -e 'ps -eo' -e '/bin/sh -c'"
EPISODE = """
set -e
mkdir -p /workspace/proj/src && echo 'print(1)' > /workspace/proj/src/main.py
head -c 100000 /dev/urandom > /workspace/blob.bin
echo scratch > /tmp/scratch.txt && mkdir -p /tmp/d/e && echo x > /tmp/d/e/f
echo new > /home/agent/notes.txt && mkdir /home/agent/.cache && echo c > /home/agent/.cache/c
echo 'alias ll=ls' >> /home/agent/.bashrc
chmod 600 /home/agent/.profile
touch -d 2001-01-01 /home/agent/.bash_logout
ln -s /etc/passwd /workspace/link && mkfifo /workspace/fifo /tmp/fifo
echo shm > /dev/shm/seg
setsid nohup sleep 1000 >/dev/null 2>&1 < /dev/null &
(sleep 1000 &) ; true
"""


@pytest.fixture
def backend(docker_client: docker.DockerClient, base_image: str, tmp_path: Path) -> Iterator[DockerBackend]:
    made = DockerBackend(docker_client, snapshot_dir=tmp_path / "snaps")
    try:
        yield made
    finally:
        made.close()


def _state(sb: DockerSandbox) -> tuple[str, str]:
    listing = sb.exec(LISTING, timeout=120)
    procs = sb.exec(PROCS)
    assert listing.exit_code == 0 and not listing.truncated, listing.stderr[-2000:]
    return listing.stdout, procs.stdout


def _diff(a: str, b: str) -> str:
    sa, sb = set(a.splitlines()), set(b.splitlines())
    return f"only after reset: {sorted(sa - sb)[:20]}\nonly fresh: {sorted(sb - sa)[:20]}"


def test_reset_after_an_episode_is_indistinguishable_from_fresh(backend: DockerBackend, base_image: str) -> None:
    spec = SandboxSpec(image=base_image)
    fresh, used = backend.create(spec), backend.create(spec)
    run = used.exec(EPISODE)
    assert run.ok, run.stderr
    removed = used.exec("rm /home/agent/.bashrc && rm -r /workspace/proj && mkdir /workspace/proj")
    assert removed.ok, removed.stderr
    assert "sleep 1000" in used.exec(PROCS).stdout
    assert used.reset(), used.last_reset_refusal
    want_files, want_procs = _state(fresh)
    got_files, got_procs = _state(used)
    assert got_procs == want_procs
    assert got_files == want_files, _diff(got_files, want_files)
    assert used.read_file("/home/agent/.bashrc") == fresh.read_file("/home/agent/.bashrc")
    # the sandbox is still usable, and a second reset of a clean one is a no-op that still verifies
    assert used.exec("echo ok > /workspace/again && cat /workspace/again").stdout == "ok\n"
    assert used.reset(), used.last_reset_refusal
    assert _state(used)[0] == want_files


def test_reset_removes_the_sandbox_users_sysv_ipc_objects(backend: DockerBackend, base_image: str) -> None:
    # What a killed PostgreSQL leaves behind: a SysV shared memory segment of the sandbox user.
    sb = backend.create(SandboxSpec(image=base_image))
    try:
        made = sb.exec(["python3", "-c", "import ctypes; print(ctypes.CDLL(None).shmget(0x5eed, 4096, 0o1600))"])
        assert made.ok and int(made.stdout) >= 0, made
        assert len(sb.exec("cat /proc/sysvipc/shm").stdout.splitlines()) == 2
        assert sb.reset(), sb.last_reset_refusal
        assert len(sb.exec("cat /proc/sysvipc/shm").stdout.splitlines()) == 1
    finally:
        sb.close()


def test_snapshot_after_reset_is_a_full_diff_of_the_base(backend: DockerBackend, base_image: str) -> None:
    sb = backend.create(SandboxSpec(image=base_image))
    sb.write_file("/workspace/a.txt", "a")
    first = sb.snapshot(SnapshotKind.FAST)
    sb.exec("rm /home/agent/.profile; echo b > /workspace/b.txt")
    assert sb.reset(), sb.last_reset_refusal
    assert sb.lineage == (None, 0)
    sb.write_file("/workspace/c.txt", "c")
    ref = sb.snapshot(SnapshotKind.FAST)
    assert ref.parent is None and ref.depth == 1, "the lineage restarts at the base image"
    restored = backend.restore(ref)
    assert restored.exec("ls -A /workspace").stdout.split() == ["c.txt"]
    assert restored.read_file("/home/agent/.profile") == sb.read_file("/home/agent/.profile")
    back = backend.restore(first)
    assert back.exec("ls -A /workspace").stdout.split() == ["a.txt"]


@pytest.fixture
def layered_image(docker_client: docker.DockerClient, base_image: str) -> Iterator[str]:
    """The base plus one layer: a world-writable root-owned file, a whiteout and an opaque dir."""
    setup = (
        "echo orig > /etc/agentenv-shared && chmod 666 /etc/agentenv-shared && "
        "rm /home/agent/.bash_logout && mkdir -p /opt/tree/sub && echo t > /opt/tree/sub/t && "
        "chown -R 1000:1000 /opt/tree"
    )
    c = docker_client.containers.run(base_image, ["sh", "-c", setup], user="0", detach=True)
    try:
        assert c.wait(timeout=60)["StatusCode"] == 0
        image = c.commit(repository="agentenv-reset-test", tag=c.id[:12])
    finally:
        c.remove(force=True)
    try:
        yield image.id
    finally:  # the backend fixture closes later: remove this image's sandboxes first
        for left in docker_client.containers.list(all=True, filters={"ancestor": image.id}):
            left.remove(force=True)
        docker_client.images.remove(image.id, force=True)


def test_reset_honours_lower_layer_whiteouts(backend: DockerBackend, layered_image: str) -> None:
    spec = SandboxSpec(image=layered_image)
    fresh, used = backend.create(spec), backend.create(spec)
    run = used.exec("echo back > /home/agent/.bash_logout && rm -r /opt/tree/sub && mkdir /opt/tree/sub && echo z > /opt/tree/sub/z")
    assert run.ok, run.stderr
    assert used.reset(), used.last_reset_refusal
    assert used.exec("ls -A /home/agent /opt/tree/sub").stdout == fresh.exec("ls -A /home/agent /opt/tree/sub").stdout
    assert used.read_file("/opt/tree/sub/t") == b"t\n"
    assert _state(used)[0] == _state(fresh)[0]


def test_reset_restores_a_lower_file_that_was_renamed_over(backend: DockerBackend, layered_image: str) -> None:
    # How PostgreSQL rewrites its files (write a temp file, rename it over the old one); on
    # fuse-overlayfs the first unlink of such a file uncovers the lower one instead of removing it.
    spec = SandboxSpec(image=layered_image)
    sb = backend.create(spec)
    try:
        assert sb.exec("echo new > /opt/tree/sub/t.tmp && mv /opt/tree/sub/t.tmp /opt/tree/sub/t").ok
        assert sb.reset(), sb.last_reset_refusal
        assert sb.read_file("/opt/tree/sub/t") == b"t\n"
    finally:
        sb.close()


def test_reset_restores_root_files_the_user_changed(backend: DockerBackend, layered_image: str) -> None:
    # The agent restores as root now: a world-writable root-owned file is put back exactly.
    sb = backend.create(SandboxSpec(image=layered_image))
    try:
        before = sb.exec("stat -c '%U %a %s' /etc/agentenv-shared; sha256sum /etc/agentenv-shared").stdout
        assert sb.exec("echo mine > /etc/agentenv-shared").ok  # world-writable, but root owns it and /etc
        assert sb.reset(), sb.last_reset_refusal
        assert sb.exec("stat -c '%U %a %s' /etc/agentenv-shared; sha256sum /etc/agentenv-shared").stdout == before
    finally:
        sb.close()
    other = backend.create(SandboxSpec(image=layered_image))
    other.exec("echo x > /workspace/x")
    other.close()
    assert other.reset() is False, "a closed sandbox is never reported reset"


def test_reset_refuses_a_compromised_or_root_sandbox(backend: DockerBackend, base_image: str) -> None:
    sb = backend.create(SandboxSpec(image=base_image))
    try:
        sb._mark_compromised("test: an answer failed authentication")
        assert sb.reset() is False and "compromised" in (sb.last_reset_refusal or "")
        assert sb.quiesce() is not None
    finally:
        sb.close()
    root = backend.create(SandboxSpec(image=base_image, user="root"))
    try:
        assert not root.trusted and root.untrusted
        assert root.exec("id -u").stdout == "0\n"
        assert root.reset() is False and "no trust boundary" in (root.last_reset_refusal or "")
        assert root.exec("cat /proc/1/status | grep -c Cap").ok, "the container's init survives"
        assert "CapEff:\t0000000000000000" in root.exec("cat /proc/self/status").stdout, "no capabilities for root"
    finally:
        root.close()


def test_pool_reuses_the_container_and_hands_it_out_clean(backend: DockerBackend, base_image: str) -> None:
    with SandboxPool(backend, SandboxSpec(image=base_image), size=1, max_size=1) as pool:
        fresh_files, fresh_procs = _state(pool.acquire(timeout=60))
    with SandboxPool(backend, SandboxSpec(image=base_image), size=1, max_size=1) as pool:
        sb = pool.acquire(timeout=60)
        first_id = sb.container_id
        assert sb.exec(EPISODE).ok
        ref = sb.snapshot(SnapshotKind.FAST)
        pool.release(sb)
        again = pool.acquire(timeout=60)
        assert again.container_id == first_id, "the released container is reused, not replaced"
        assert pool.stats["reset"] == 1 and pool.stats["started"] == 1
        files, procs = _state(again)
        assert procs == fresh_procs
        assert files == fresh_files, _diff(files, fresh_files)
        pool.release(again)
        restored = pool.restore(ref, timeout=60)
        assert restored.container_id == first_id
        assert restored.read_file("/workspace/proj/src/main.py") == b"print(1)\n"
        assert restored.exec("ls /home/agent/notes.txt").ok
        pool.release(restored)


def test_fast_lineage_of_200_cycles_through_a_resetting_pool(backend: DockerBackend, base_image: str) -> None:
    """Each cycle restores onto a reset-then-reused container; the lineage must neither lose nor gain files."""
    with SandboxPool(backend, SandboxSpec(image=base_image), size=2, max_size=4) as pool:
        current = pool.acquire(timeout=60)
        ids = set()
        for i in range(200):
            current.write_file(f"/workspace/lineage/step{i}.txt", str(i))
            ref = current.snapshot(SnapshotKind.FAST)
            nxt = pool.restore(ref, timeout=60)
            ids.add(nxt.container_id)
            pool.release(current)
            current = nxt
            if i % 50 == 0:
                assert current.exec("ls /workspace/lineage | wc -l").stdout.strip() == str(i + 1)
        assert current.exec("ls /workspace/lineage | wc -l").stdout.strip() == "200"
        assert current.read_file("/workspace/lineage/step123.txt") == b"123"
        assert ref.depth == 200
        assert pool.stats["reset"] >= 190 and len(ids) <= 4, (pool.stats, len(ids))
        pool.release(current)
