"""``disk_mb`` on storage drivers without a per-container quota: a size-limited layer directory.

Docker's ``storage_opt={"size": ...}`` works only on drivers with a quota
(overlay2 on xfs with pquota, btrfs, zfs, devicemapper). On fuse-overlayfs,
the driver this host runs, nothing limits the container's writable layer: a
sandbox with ``disk_mb=512`` once wrote 21 GB. This module closes that.

How: between ``containers.create`` and the first write (``put_archive``,
``start``), a filesystem of ``disk_mb`` is mounted on the container's layer
directory, the parent of ``GraphDriver.Data.UpperDir``. The whole layer
directory, not the upper dir alone: fuse-overlayfs copies a file up by
creating it in its work dir (``<layer>/work``) and renaming it into the upper
dir (``<layer>/diff``), and ``rename`` across two filesystems (or two mounts
of one) fails with ``EXDEV``. At create time the layer directory holds only
``link``, ``lower``, an empty ``diff`` and ``work/work``; they are recreated on
the new filesystem. Every byte and inode the container writes then lands
there, and writes past it fail with ``ENOSPC`` (``df /`` inside shows the
limit, since fuse-overlayfs reports its upper's ``statfs``).

Two kinds of filesystem:

* ``ext4`` (default): a sparse image, ``mkfs.ext4`` without a journal (a
  sandbox does not outlive a crash), mounted through a loop device; the image
  is unlinked once mounted, so its blocks go back when the mount does, and a
  crashed owner leaves no file behind. About 4% of ``disk_mb`` goes to ext4
  metadata; one inode per 16 KiB.
* ``tmpfs``: ``size=disk_mb``, one inode per 16 KiB. No mkfs, but the bytes
  are RAM that no container memory limit counts; for small limits only.

Both keep what the rest relies on: fuse-overlayfs whiteouts (char 0/0 nodes
and ``.wh.`` files), opaque-dir xattrs (``trusted.overlay.opaque``), user
xattrs, hard links, and the host reading the upper dir at the same path for
FAST snapshots and resets. Mounted ``nosuid,nodev,noatime``.

Undoing it: ``docker rm`` unmounts it itself (the driver's ``EnsureRemoveAll``
unmounts everything under the layer directory, lazily, before deleting it),
so removal never fails on it. ``DiskLimit.release()`` after the remove is
the safety net (a remove that failed, a daemon that did not unmount): it
unmounts lazily if the mount is still there. ``release_leaked()`` finds our
mounts (a layer-directory mount point that Docker itself never makes) whose
container no longer exists and unmounts them; the reaper calls it.

Where it cannot be enforced (a remote daemon, an upper dir that is not
visible here, no permission to mount, a storage driver not handled here, a
container already started or written), ``attach`` raises ``SpecError``
naming ``disk_mb`` and why: a limit is never accepted silently.

Usage::

    container = client.containers.create(...)
    limit = attach(container, disk_mb=512)       # before put_archive / start
    ...
    container.remove(force=True)
    limit.release()
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from sandboxes.errors import DaemonUnavailable, SandboxError, SpecError

SUPPORTED_DRIVERS = ("fuse-overlayfs",)
LOCAL_BASE_URL = "http+docker://localhost"  # the docker SDK's base URL for a unix socket
DEFAULT_STATE_DIR = Path("/var/lib/agentenv/disk")
TMPFS_SOURCE = "agentenv-disk"  # the tmpfs "device" name, how our tmpfs mounts are told apart
IMAGE_PREFIX = "agentenv-disk-"  # loop backing files: /sys/block/loopN/loop/backing_file
MIN_DISK_MB = 16
BYTES_PER_INODE = 16384
MOUNT_OPTIONS = "nosuid,nodev,noatime"
COMMAND_TIMEOUT_S = 60.0
_LAYER_ENTRIES = {"link", "lower", "diff", "work", "merged"}
_LAYER_DIR = re.compile(r"/[0-9a-f]{64}$")
# Two ``mount -o loop`` at once in one process may race for the same free loop device.
_mount_lock = threading.Lock()


class DiskKind(str, enum.Enum):
    """The filesystem that holds a container's writable layer."""

    EXT4 = "ext4"
    TMPFS = "tmpfs"


@dataclass(frozen=True)
class LimitMount:
    """One of our mounts as ``/proc/self/mountinfo`` shows it."""

    mount_point: str  # the layer directory
    fstype: str
    source: str  # /dev/loopN or TMPFS_SOURCE

    @property
    def upper_dir(self) -> str:
        return os.path.join(self.mount_point, "diff")


class DiskLimit:
    """A size-limited filesystem mounted on one container's layer directory."""

    def __init__(self, container_id: str, mount_point: str, disk_mb: int, kind: DiskKind) -> None:
        self.container_id = container_id
        self.mount_point = mount_point
        self.disk_mb = disk_mb
        self.kind = kind

    def __repr__(self) -> str:
        return f"DiskLimit({self.container_id[:12]}, {self.disk_mb} MB {self.kind.value} on {self.mount_point})"

    @property
    def mounted(self) -> bool:
        return any(m.mount_point == self.mount_point for m in our_mounts())

    def release(self) -> bool:
        """Unmount (lazily) if still mounted; True when this call unmounted it. Idempotent.

        Call it after ``container.remove(force=True)``: Docker's remove already unmounts,
        so this is a no-op then. While the container's root filesystem is still mounted
        (``<layer>/merged``: it runs, or a remove failed), the mount is left alone: taking
        it away would break ``docker exec`` (runc finds the rootfs by that path) and
        Docker's own unmount at remove; ``release_leaked`` catches it once the container
        is gone.
        """
        mounts = {mp for mp, _, _ in _mounts()}
        if self.mount_point not in mounts or os.path.join(self.mount_point, "merged") in mounts:
            return False
        _unmount(self.mount_point)
        return True


def attach(
    container: Any,
    disk_mb: int,
    *,
    kind: DiskKind = DiskKind.EXT4,
    state_dir: Path = DEFAULT_STATE_DIR,
) -> DiskLimit:
    """Limit a created, never-started container's writable layer to ``disk_mb`` MiB.

    ``container`` is a docker SDK container, fresh from ``containers.create``. Raises
    ``SpecError`` (naming ``disk_mb``) where the limit cannot be enforced; nothing is
    left mounted then.
    """
    if isinstance(disk_mb, bool) or not isinstance(disk_mb, int) or disk_mb < MIN_DISK_MB:
        raise SpecError(f"disk_mb: expected an integer >= {MIN_DISK_MB} (MiB), got {disk_mb!r}")
    layer = _layer_dir(container)
    tree = _read_layer(layer)
    with _mount_lock:
        if kind is DiskKind.EXT4:
            _mount_ext4(layer, disk_mb, state_dir, os.path.basename(layer))
        else:
            _mount_tmpfs(layer, disk_mb)
    try:
        _write_layer(layer, tree)
    except BaseException:
        _unmount(layer)
        raise
    return DiskLimit(str(container.id), layer, disk_mb, kind)


def our_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[LimitMount]:
    """Every disk-limit mount on this host (any container's, any process's)."""
    out = []
    for mount_point, fstype, source in _mounts(mountinfo):
        if not _LAYER_DIR.search(mount_point) or os.path.basename(os.path.dirname(mount_point)) not in SUPPORTED_DRIVERS:
            continue
        if (fstype == "tmpfs" and source == TMPFS_SOURCE) or (fstype == "ext4" and _is_our_loop(source)):
            out.append(LimitMount(mount_point, fstype, source))
    return out


def leaked_mounts(client: docker.DockerClient | None = None) -> list[LimitMount]:
    """Our mounts whose container no longer exists (Docker did not unmount them).

    A mount of another process's live container is not leaked: its container exists.
    """
    mounts = our_mounts()
    if not mounts:
        return []  # the common case asks the daemon nothing
    client = _client(client)
    try:
        layers = set()
        for c in client.api.containers(all=True):
            try:
                data = (client.api.inspect_container(c["Id"]).get("GraphDriver") or {}).get("Data") or {}
            except docker.errors.NotFound:
                continue  # removed meanwhile: its mount, if any, is a leak candidate
            if data.get("UpperDir"):
                layers.add(os.path.dirname(str(data["UpperDir"])))
    except docker.errors.DockerException as exc:
        raise DaemonUnavailable(f"disk limits: cannot list containers to find leaked mounts: {exc}") from exc
    return [m for m in mounts if m.mount_point not in layers]


def release_leaked(client: docker.DockerClient | None = None, *, dry_run: bool = False) -> list[LimitMount]:
    """Unmount every leaked disk-limit mount; return what was (or would be) unmounted."""
    leaked = leaked_mounts(client)
    if not dry_run:
        for m in leaked:
            _unmount(m.mount_point)
    return leaked


# -- checks ---------------------------------------------------------------------------


def _layer_dir(container: Any) -> str:
    """The container's layer directory, after proving the limit can be enforced on it here."""
    api = container.client.api
    if str(api.base_url) != LOCAL_BASE_URL:
        raise SpecError(
            f"disk_mb: the Docker daemon at {api.base_url} is not local (unix socket), so its container "
            "layers cannot be mounted from here; use a storage driver with quotas (storage_opt) or drop disk_mb"
        )
    container.reload()
    graph = container.attrs.get("GraphDriver") or {}
    driver, data = str(graph.get("Name", "")), graph.get("Data") or {}
    if driver not in SUPPORTED_DRIVERS:
        raise SpecError(
            f"disk_mb: storage driver {driver!r} has no per-container quota here and is not one this host can "
            f"limit by a mount (handled: {', '.join(SUPPORTED_DRIVERS)})"
        )
    if (container.attrs.get("State") or {}).get("Running"):
        raise SpecError(f"disk_mb: container {container.name} is already running; the limit must be attached before start")
    upper, work = str(data.get("UpperDir") or ""), str(data.get("WorkDir") or "")
    layer = os.path.dirname(upper)
    if os.path.basename(upper) != "diff" or os.path.dirname(work) != layer or not _LAYER_DIR.search(layer):
        raise SpecError(f"disk_mb: unexpected {driver} layout (UpperDir {upper!r}, WorkDir {work!r})")
    if not os.path.isdir(upper):
        raise SpecError(f"disk_mb: the upper dir {upper} is not visible from this process (daemon in another namespace?)")
    if os.geteuid() != 0:
        raise SpecError(f"disk_mb: mounting a size-limited layer needs root, and this process runs as uid {os.geteuid()}")
    if any(mp == layer or mp.startswith(layer + "/") for mp, _, _ in _mounts()):
        raise SpecError(f"disk_mb: {layer} is mounted already (a limit attached twice, or the container is in use)")
    return layer


@dataclass(frozen=True)
class _Entry:
    rel: str
    is_dir: bool
    mode: int
    uid: int
    gid: int
    data: bytes = b""


def _read_layer(layer: str) -> list[_Entry]:
    """The few entries Docker put in a fresh layer directory; refuses anything else."""
    unexpected = set(os.listdir(layer)) - _LAYER_ENTRIES
    if unexpected:
        raise SpecError(f"disk_mb: layer directory {layer} holds unexpected entries {sorted(unexpected)}")
    if os.listdir(os.path.join(layer, "diff")):
        raise SpecError(
            f"disk_mb: the upper dir {layer}/diff is not empty; the limit must be attached right after create, "
            "before put_archive or start"
        )
    out = []
    for dirpath, dirs, files in os.walk(layer):
        for name in sorted(dirs) + sorted(files):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, layer)
            if os.path.isdir(path) and not os.path.islink(path):
                out.append(_Entry(rel, True, st.st_mode & 0o7777, st.st_uid, st.st_gid))
            elif os.path.isfile(path) and not os.path.islink(path) and st.st_size < 4096:
                with open(path, "rb") as f:
                    out.append(_Entry(rel, False, st.st_mode & 0o7777, st.st_uid, st.st_gid, f.read()))
            else:
                raise SpecError(f"disk_mb: layer directory {layer} holds an unexpected entry {rel!r}")
    st = os.lstat(layer)
    return [_Entry(".", True, st.st_mode & 0o7777, st.st_uid, st.st_gid), *out]


def _write_layer(layer: str, tree: list[_Entry]) -> None:
    lost = os.path.join(layer, "lost+found")
    if os.path.isdir(lost):
        os.rmdir(lost)
    for e in tree:  # os.walk order: parents before children
        path = os.path.normpath(os.path.join(layer, e.rel))
        if e.is_dir:
            os.makedirs(path, exist_ok=True)
        else:
            with open(path, "wb") as f:
                f.write(e.data)
        os.chown(path, e.uid, e.gid)
        os.chmod(path, e.mode)


# -- mounting ---------------------------------------------------------------------------


def _run(cmd: list[str]) -> None:
    if shutil.which(cmd[0]) is None:
        raise SpecError(f"disk_mb: {cmd[0]} is not installed here, so the limit cannot be made")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"disk_mb: {' '.join(cmd)} ran past {COMMAND_TIMEOUT_S:.0f}s") from exc
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()
        if "permission denied" in err.lower() or "must be superuser" in err.lower():
            raise SpecError(f"disk_mb: no permission to mount a size-limited layer ({cmd[0]}: {err})")
        raise SandboxError(f"disk_mb: {' '.join(cmd)} failed (exit {proc.returncode}): {err}")


def _mount_ext4(layer: str, disk_mb: int, state_dir: Path, layer_id: str) -> None:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, image = tempfile.mkstemp(prefix=f"{IMAGE_PREFIX}{layer_id[:12]}-", suffix=".img", dir=state_dir)
    try:
        os.ftruncate(fd, disk_mb << 20)  # sparse: no block is used until written
        os.close(fd)
        fd = -1
        _run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-i", str(BYTES_PER_INODE), "-m", "0",
              "-O", "^has_journal", "-L", TMPFS_SOURCE, "-E", "root_owner=0:0", image])  # fmt: skip
        _run(["mount", "-t", "ext4", "-o", f"loop,{MOUNT_OPTIONS}", image, layer])
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(image)  # the loop device holds it; its blocks go back with the mount


def _mount_tmpfs(layer: str, disk_mb: int) -> None:
    inodes = max(1024, (disk_mb << 20) // BYTES_PER_INODE)
    _run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m,nr_inodes={inodes},mode=0700,{MOUNT_OPTIONS}", TMPFS_SOURCE, layer])


def _unmount(mount_point: str) -> None:
    """Lazy unmount: never blocked by a busy mount (a live fuse-overlayfs keeps it open)."""
    try:
        _run(["umount", "-l", mount_point])
    except SandboxError:
        if any(mp == mount_point for mp, _, _ in _mounts()):
            raise  # gone meanwhile (Docker's remove unmounts too) is success


# -- reading the host's mounts -------------------------------------------------------------


def _mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str, str]]:
    """(mount point, fstype, source) of every mount, octal escapes decoded."""
    out = []
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 2:
                out.append((_unescape(fields[4]), rest[0], _unescape(rest[1])))
    return out


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def _is_our_loop(source: str) -> bool:
    if not source.startswith("/dev/loop"):
        return False
    try:
        with open(f"/sys/block/{os.path.basename(source)}/loop/backing_file") as f:
            return os.path.basename(f.read().strip()).startswith(IMAGE_PREFIX)
    except OSError:
        return False


def _client(client: docker.DockerClient | None) -> docker.DockerClient:
    if client is not None:
        return client
    try:
        return docker.from_env(timeout=60)
    except docker.errors.DockerException as exc:
        raise DaemonUnavailable(f"cannot reach the Docker daemon: {exc}") from exc


__all__ = [
    "DEFAULT_STATE_DIR",
    "MIN_DISK_MB",
    "SUPPORTED_DRIVERS",
    "DiskKind",
    "DiskLimit",
    "LimitMount",
    "attach",
    "leaked_mounts",
    "our_mounts",
    "release_leaked",
]
