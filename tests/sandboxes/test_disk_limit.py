"""disk_mb on fuse-overlayfs: a size-limited layer directory, against the real daemon.

Containers are built with the docker SDK and the same hardening kwargs as
``DockerBackend.start`` (the backend is not needed to prove the mount), and
commands run as the image's ``agent`` user, as sandbox commands do.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import pytest

from sandboxes import disk_limit as dl
from sandboxes.errors import SpecError

LIMIT_MB = 64
HARDENING: dict[str, Any] = dict(
    entrypoint=["sleep"],
    command=["infinity"],
    user="0:0",
    network_mode="none",
    cap_drop=["ALL"],
    cap_add=["SETUID", "SETGID", "KILL", "CHOWN", "FOWNER", "DAC_OVERRIDE"],
    security_opt=["no-new-privileges"],
    pids_limit=256,
    mem_limit="512m",
    memswap_limit="512m",
    init=True,
    detach=True,
    labels={"agentenv.test": "disk_limit"},
)


def _mounted(path: str) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def _our_loops() -> list[str]:
    out = []
    for dev in Path("/sys/block").glob("loop*"):
        try:
            backing = (dev / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if os.path.basename(backing).startswith(dl.IMAGE_PREFIX):
            out.append(f"{dev.name}: {backing}")
    return out


def _sh(container: Any, script: str, user: str = "agent") -> tuple[int, str]:
    rc, out = container.exec_run(["sh", "-c", script], user=user, workdir="/workspace")
    return rc, out.decode(errors="replace")


# -- unit: refusals that need no daemon ---------------------------------------------


def _fake(base_url: str = dl.LOCAL_BASE_URL, driver: str = "fuse-overlayfs", upper: str = "", running: bool = False) -> Any:
    layer = "/nonexistent/fuse-overlayfs/" + "a" * 64
    attrs = {
        "GraphDriver": {"Name": driver, "Data": {"UpperDir": upper or layer + "/diff", "WorkDir": layer + "/work"}},
        "State": {"Running": running},
    }
    return SimpleNamespace(id="c" * 64, name="fake", attrs=attrs, reload=lambda: None, client=SimpleNamespace(api=SimpleNamespace(base_url=base_url)))


@pytest.mark.unit
@pytest.mark.parametrize("bad", [0, 8, -1, 1.5, "512", True])
def test_attach_refuses_a_bad_size(bad: Any) -> None:
    with pytest.raises(SpecError, match="disk_mb"):
        dl.attach(_fake(), bad)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("container", "why"),
    [
        (_fake(base_url="http://10.0.0.5:2375"), "not local"),
        (_fake(base_url="http+docker://ssh"), "not local"),
        (_fake(driver="vfs"), "storage driver 'vfs'"),
        (_fake(running=True), "already running"),
        (_fake(upper="/var/lib/docker/fuse-overlayfs/x/upper"), "unexpected fuse-overlayfs layout"),
        (_fake(), "not visible"),
    ],
)
def test_attach_refuses_what_it_cannot_enforce(container: Any, why: str) -> None:
    with pytest.raises(SpecError, match="disk_mb") as info:
        dl.attach(container, 512)
    assert why in str(info.value)


@pytest.mark.unit
def test_attach_refuses_without_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    layer = tmp_path / "fuse-overlayfs" / ("b" * 64)
    (layer / "diff").mkdir(parents=True)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SpecError, match="needs root"):
        dl.attach(_fake_at(layer), 512)


def _fake_at(layer: Path) -> Any:
    c = _fake(upper=str(layer / "diff"))
    c.attrs["GraphDriver"]["Data"]["WorkDir"] = str(layer / "work")
    return c


@pytest.mark.unit
def test_our_mounts_reads_only_layer_dir_mounts_of_ours(tmp_path: Path) -> None:
    layer = "/var/lib/docker/fuse-overlayfs/" + "d" * 64
    info = tmp_path / "mountinfo"
    info.write_text(
        f"100 42 0:50 / {layer} rw,relatime shared:1 - tmpfs agentenv-disk rw,size=65536k\n"
        f"101 100 0:51 / {layer}/merged rw - fuse.fuse-overlayfs fuse-overlayfs rw\n"
        f"102 42 0:52 / /var/lib/docker/fuse-overlayfs/{'e' * 64} rw - tmpfs other rw\n"
        f"103 42 0:53 / /mnt/with\\040space rw - tmpfs agentenv-disk rw\n"
    )
    assert dl.our_mounts(str(info)) == [dl.LimitMount(layer, "tmpfs", "agentenv-disk")]


# -- the real daemon --------------------------------------------------------------------


@pytest.fixture
def limited(request: pytest.FixtureRequest, docker_client: docker.DockerClient, base_image: str) -> Iterator[tuple[Any, dl.DiskLimit]]:
    container = docker_client.containers.create(base_image, name=f"agentenv-disktest-{secrets.token_hex(4)}", **HARDENING)
    limit = None
    try:
        limit = dl.attach(container, LIMIT_MB, kind=request.param)
        container.start()
        yield container, limit
    finally:
        container.remove(force=True)
        if limit is not None:
            limit.release()


@pytest.mark.docker
@pytest.mark.parametrize("limited", list(dl.DiskKind), indirect=True, ids=lambda k: k.value)
def test_writes_past_the_limit_fail_and_the_container_stays_usable(limited: tuple[Any, dl.DiskLimit]) -> None:
    container, limit = limited
    assert limit.mounted
    rc, out = _sh(container, f"dd if=/dev/zero of=big bs=1M count={LIMIT_MB * 2}")
    assert rc != 0 and "No space left" in out, out
    rc, out = _sh(container, "rm big && fallocate -l 200M falloc")
    assert rc != 0 and "No space left" in out, out
    # many small files: inodes or blocks run out, whichever first
    rc, out = _sh(container, "rm -f falloc; python3 -c \"[open(f'f{i}', 'w').write('x') for i in range(100000)]\"")
    assert rc != 0 and "No space left" in out, out
    rc, out = _sh(container, "find . -name 'f*' -delete && echo still-usable > ok && cat ok && df -m / | tail -1")
    assert rc == 0 and "still-usable" in out, out
    assert int(out.split()[-5]) <= LIMIT_MB, out  # df / inside shows the limit, not the host's disk


@pytest.mark.docker
@pytest.mark.parametrize("limited", list(dl.DiskKind), indirect=True, ids=lambda k: k.value)
def test_the_host_reads_whiteouts_opaque_dirs_xattrs_and_hard_links(limited: tuple[Any, dl.DiskLimit]) -> None:
    container, limit = limited
    script = (
        "rm /etc/passwd && rm -rf /etc/apt && mkdir /etc/apt && echo new > /etc/apt/only && "
        "echo a > /workspace/a && ln /workspace/a /workspace/b && "
        "python3 -c \"import os; os.setxattr('/workspace/a', 'user.tag', b'v1')\""
    )
    rc, out = _sh(container, script, user="0:0")
    assert rc == 0, out
    upper = container.attrs["GraphDriver"]["Data"]["UpperDir"]
    assert upper.startswith(limit.mount_point + "/")
    # what FAST snapshots and resets read on the host, from the same path
    wh = os.lstat(os.path.join(upper, "etc/passwd"))
    assert stat.S_ISCHR(wh.st_mode) and wh.st_rdev == 0
    apt = os.path.join(upper, "etc/apt")
    assert "trusted.overlay.opaque" in os.listxattr(apt) or ".wh..wh..opq" in os.listdir(apt)
    assert "only" in os.listdir(apt)
    a, b = os.lstat(os.path.join(upper, "workspace/a")), os.lstat(os.path.join(upper, "workspace/b"))
    assert a.st_ino == b.st_ino and a.st_nlink == 2
    assert os.getxattr(os.path.join(upper, "workspace/a"), "user.tag") == b"v1"
    # and the container still sees them through fuse-overlayfs
    rc, out = _sh(container, "test ! -e /etc/passwd && ls /etc/apt && stat -c %h /workspace/a", user="0:0")
    assert rc == 0 and out.split() == ["only", "2"], out


@pytest.mark.docker
@pytest.mark.parametrize("kind", list(dl.DiskKind), ids=lambda k: k.value)
def test_removal_unmounts_even_when_the_mount_is_busy(docker_client: docker.DockerClient, base_image: str, kind: dl.DiskKind) -> None:
    container = docker_client.containers.create(base_image, **HARDENING)
    limit = dl.attach(container, LIMIT_MB, kind=kind)
    container.start()
    busy = subprocess.Popen(["sleep", "60"], cwd=limit.mount_point + "/diff")  # holds the mount
    try:
        container.remove(force=True)  # Docker unmounts it itself (lazily)
        assert not _mounted(limit.mount_point)
        assert limit.release() is False  # nothing left to do, and no error
    finally:
        busy.kill()
        busy.wait()
        limit.release()
    assert not _mounted(limit.mount_point)
    assert _our_loops() == []  # the loop device and its (unlinked) image are gone with the last user


@pytest.mark.docker
def test_release_leaves_a_live_container_alone_and_remove_then_unmounts(docker_client: docker.DockerClient, base_image: str) -> None:
    container = docker_client.containers.create(base_image, **HARDENING)
    limit = dl.attach(container, LIMIT_MB)
    container.start()
    try:
        assert limit.release() is False  # its rootfs is mounted: taking the layer away would break exec
        assert limit.mounted
        rc, out = _sh(container, f"dd if=/dev/zero of=big bs=1M count={LIMIT_MB * 2}")
        assert rc != 0 and "No space left" in out, out
    finally:
        container.remove(force=True)
    assert not _mounted(limit.mount_point) and limit.release() is False
    assert _our_loops() == []


@pytest.mark.docker
def test_release_unmounts_a_created_container_that_was_never_started(docker_client: docker.DockerClient, base_image: str) -> None:
    container = docker_client.containers.create(base_image, **HARDENING)
    try:
        limit = dl.attach(container, LIMIT_MB)
        assert limit.release() is True and not _mounted(limit.mount_point)
    finally:
        container.remove(force=True)
    assert _our_loops() == []


@pytest.mark.docker
def test_attach_twice_or_after_a_write_is_refused(docker_client: docker.DockerClient, base_image: str) -> None:
    container = docker_client.containers.create(base_image, **HARDENING)
    try:
        limit = dl.attach(container, LIMIT_MB, kind=dl.DiskKind.TMPFS)
        with pytest.raises(SpecError, match="mounted already"):
            dl.attach(container, LIMIT_MB)
        limit.release()
        container.put_archive("/", _tar_with("hello"))
        with pytest.raises(SpecError, match="not empty"):
            dl.attach(container, LIMIT_MB)
        assert not _mounted(limit.mount_point)
    finally:
        container.remove(force=True)


def _tar_with(name: str) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return buf.getvalue()


@pytest.mark.docker
def test_leaked_mounts_are_found_and_released_but_live_ones_are_not(docker_client: docker.DockerClient, base_image: str) -> None:
    container = docker_client.containers.create(base_image, **HARDENING)
    live = dl.attach(container, LIMIT_MB, kind=dl.DiskKind.TMPFS)
    with tempfile.TemporaryDirectory() as tmp:
        # a mount whose container is gone, as a crashed owner or a daemon that did not unmount leaves it
        orphan = os.path.join(tmp, "fuse-overlayfs", secrets.token_hex(32))
        os.makedirs(orphan)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", dl.TMPFS_SOURCE, orphan], check=True)
        try:
            leaked = dl.leaked_mounts(docker_client)
            assert [m.mount_point for m in leaked] == [orphan]
            assert dl.release_leaked(docker_client, dry_run=True) == leaked and _mounted(orphan)
            assert dl.release_leaked(docker_client) == leaked
            assert not _mounted(orphan)
            assert live.mounted
        finally:
            if _mounted(orphan):
                subprocess.run(["umount", "-l", orphan], check=False)
            container.remove(force=True)
            live.release()
    assert not _mounted(live.mount_point)


@pytest.mark.docker
def test_the_reaper_releases_leaked_disk_mounts(docker_client: docker.DockerClient) -> None:
    from sandboxes.reaper import release_disk_mounts

    with tempfile.TemporaryDirectory() as tmp:
        orphan = os.path.join(tmp, "fuse-overlayfs", secrets.token_hex(32))
        os.makedirs(orphan)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", dl.TMPFS_SOURCE, orphan], check=True)
        try:
            assert [m.mount_point for m in release_disk_mounts(docker_client)] == [orphan]
            assert not _mounted(orphan)
            assert release_disk_mounts(docker_client) == []
        finally:
            if _mounted(orphan):
                subprocess.run(["umount", "-l", orphan], check=False)
