"""Reading a directory the sandbox user can change while the host reads it, without leaving it.

The host reads a live container's overlay upper directory as root (FAST
snapshots, the in-place reset). The sandbox user owns much of that tree and
may rename, swap or replace any entry it owns at any moment. A path-based
``lstat`` then ``open`` is two lookups: between them a directory may become a
symlink to a host directory (the open then reads a host file) and a regular
file may become a FIFO (the open then blocks forever). Here every lookup is
made relative to a directory file descriptor beneath the root:

* a directory is opened with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
  RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`` in one system call (Linux 5.6+),
  else one component at a time with ``O_NOFOLLOW | O_DIRECTORY``: no symlink,
  ``..`` or mount point is ever crossed;
* the entry itself is opened with ``O_PATH | O_NOFOLLOW`` (which opens no
  device or FIFO and follows no symlink), typed by ``fstat`` of that file
  descriptor, never by an earlier ``lstat`` by name, and only a regular file or
  a directory is re-opened through it for reading (``O_NONBLOCK``);
* a ``Deadline`` bounds the whole read: past it, ``DeadlinePassed``.

Not protected against: contents changing while they are read (a snapshot of a
file the sandbox is writing is torn, as it would be inside the sandbox), and a
tree so large the caller's deadline passes (then the read is refused, not
partial).
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import stat
import time
from dataclasses import dataclass

# From <linux/openat2.h>.
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on every architecture (a new-style syscall)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_REOPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class DeadlinePassed(TimeoutError):
    """A bounded host-side read ran past its deadline."""


class Deadline:
    """A monotonic deadline; ``check()`` raises ``DeadlinePassed`` naming what was being done."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        return self._end - time.monotonic()

    def check(self) -> None:
        if time.monotonic() > self._end:
            raise DeadlinePassed(f"{self.what}: over its {self.seconds:g} s deadline")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load_syscall() -> object | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_syscall = _load_syscall()
_openat2_works: bool | None = None  # unknown until first tried (ENOSYS on kernels before 5.6, or seccomp)


def _openat2(dir_fd: int, rel: str, flags: int) -> int | None:
    """``openat2`` beneath ``dir_fd`` with no symlinks; None where the kernel has no openat2."""
    global _openat2_works
    if _syscall is None or _openat2_works is False:
        return None
    how = _OpenHow(flags, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)
    fd = _syscall(  # type: ignore[operator]
        ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(rel)),
        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd >= 0:
        _openat2_works = True
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM) and _openat2_works is None:
        _openat2_works = False  # not this kernel (or a seccomp filter): the per-component walk
        return None
    raise OSError(err, os.strerror(err), rel)


def _walk_open(dir_fd: int, rel: str) -> int:
    """Open directory ``rel`` beneath ``dir_fd`` one component at a time, never following a symlink."""
    fd = os.dup(dir_fd)
    try:
        for part in rel.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise OSError(errno.EXDEV, "'..' in a path read beneath a root", rel)
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_dir_beneath(root_fd: int, rel: str) -> int:
    """A file descriptor of directory ``rel`` (relative, '/'-separated) beneath ``root_fd``.

    Raises ``OSError`` (ELOOP, ENOTDIR, EXDEV, ENOENT) where any component is a
    symlink, not a directory, a mount point or gone.
    """
    rel = rel.strip("/") or "."
    fd = _openat2(root_fd, rel, _DIR_FLAGS)
    return fd if fd is not None else _walk_open(root_fd, rel)


@dataclass(frozen=True)
class Entry:
    """One entry read beneath the root: its ``fstat`` (or ``lstat`` for a symlink or special file)."""

    st: os.stat_result
    fd: int | None  # open (caller closes) for regular files and directories
    link: str | None  # the target of a symlink


def open_entry(parent_fd: int, name: str) -> Entry | None:
    """Open ``name`` in directory ``parent_fd`` without following it; None when it is gone.

    The entry is first opened with ``O_PATH | O_NOFOLLOW``, which opens no
    device, FIFO or symlink target, and typed by ``fstat`` of that descriptor.
    Regular files and directories are then re-opened through it (the same
    inode, whatever happened to the name since) with ``O_NONBLOCK``; symlinks
    come back with their target; FIFOs, devices and sockets with their ``fstat``
    only: none of them is ever opened for reading.
    """
    if "/" in name or name in ("", ".", ".."):
        raise OSError(errno.EINVAL, "not a single path component", name)
    try:
        pfd = os.open(name, _PATH_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(pfd)
        if stat.S_ISLNK(st.st_mode):
            return Entry(st, None, os.readlink("", dir_fd=pfd))
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return Entry(st, None, None)
        fd = os.open(f"/proc/self/fd/{pfd}", _REOPEN_FLAGS)
    finally:
        os.close(pfd)
    return Entry(os.fstat(fd), fd, None)


def read_fd(fd: int, size: int, deadline: Deadline | None = None) -> bytes:
    """At most ``size`` bytes of an open regular file, from its start (fewer if it shrank)."""
    chunks = []
    left = size
    offset = 0
    while left > 0:
        if deadline is not None:
            deadline.check()
        data = os.pread(fd, min(left, 1 << 20), offset)
        if not data:
            break
        chunks.append(data)
        left -= len(data)
        offset += len(data)
    return b"".join(chunks)


def split(path: str) -> tuple[str, str]:
    """('/a/b/c') -> ('a/b', 'c'): the parent relative to the root, and the name."""
    parent, name = posixpath.split(path.strip("/"))
    return parent, name


__all__ = [
    "Deadline",
    "DeadlinePassed",
    "Entry",
    "open_dir_beneath",
    "open_entry",
    "read_fd",
    "split",
]
