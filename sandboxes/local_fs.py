"""Host-side file access for ``LocalBackend`` sandboxes, confined to one directory.

A local sandbox's files are a plain host directory (its *root*). Its commands
may plant anything there, including symlinks to host paths, so every access
from the host side goes through ``Confined``:

* a path is resolved *as if the root were* ``/`` (like ``chroot``): a relative
  path starts at the spec's workdir, absolute symlink targets are re-rooted;
* ``..`` that would climb above the root, and symlinks whose target leaves the
  root, raise ``PathEscape``. An absolute symlink is followed only if its
  re-rooted target exists in the sandbox: ``link -> /etc/passwd`` means the
  host's file to a plain-subprocess command, so we refuse it instead of
  reading (or creating) the sandbox's own ``/etc/passwd``;
* the resolved path is then opened one component at a time with
  ``O_NOFOLLOW`` relative to the parent's descriptor, so a symlink swapped in
  after resolution (a background process racing us) fails instead of being
  followed;
* only regular files are read (a FIFO would block us) and writes go to a
  temporary file renamed over the target (a symlink at the target is replaced,
  never written through).

``copy_tree`` (snapshots) never follows symlinks: it copies them as links,
copies regular files and directories, and skips FIFOs, sockets and devices.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sandboxes.errors import (
    PathEscape,
    SandboxError,
    SandboxFileNotFound,
    SandboxFileTooLarge,
    SandboxLost,
    SandboxPermissionError,
    SpecError,
)
from sandboxes.types import FileEntry

_MAX_SYMLINKS = 40  # Linux's own limit
_CHECK = "\0exists"  # marker in the resolution queue; NUL is never a path component
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _split(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


class Confined:
    """File operations on ``root`` that never touch anything outside it."""

    def __init__(self, root: Path, workdir: str, label: str) -> None:
        self.root = root
        self.workdir = workdir
        self.label = label  # the sandbox id, for messages

    # -- resolution ---------------------------------------------------------

    def resolve(self, path: str, *, follow_last: bool = True) -> tuple[str, ...]:
        """The components of ``path`` inside the root, all symlinks followed.

        Components that do not exist are kept as given (a write may create
        them). Raises ``PathEscape`` for anything that leaves the root.
        """
        if not isinstance(path, str) or not path or "\0" in path:
            raise SpecError(f"sandbox {self.label}: path must be a non-empty string without NUL, got {path!r}")
        todo = _split(path if path.startswith("/") else f"{self.workdir}/{path}")
        done: list[str] = []
        hops = 0
        while todo:
            part = todo.pop(0)
            if part == _CHECK:
                if not os.path.lexists(self.host(done)):
                    raise PathEscape(
                        f"sandbox {self.label}: {path!r} goes through an absolute symlink to "
                        f"'/{'/'.join(done)}', which is not in the sandbox (host paths are never exposed)"
                    )
                continue
            if part == "..":
                if not done:
                    raise PathEscape(f"sandbox {self.label}: {path!r} climbs above the sandbox root")
                done.pop()
                continue
            host = self.host([*done, part])
            try:
                st = os.lstat(host)
            except OSError:
                done.append(part)
                continue
            is_last = all(p == _CHECK for p in todo)
            if not stat.S_ISLNK(st.st_mode) or (is_last and not follow_last):
                done.append(part)
                continue
            hops += 1
            if hops > _MAX_SYMLINKS:
                raise SandboxError(f"sandbox {self.label}: too many levels of symbolic links in {path!r}")
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
                todo = [*_split(target), _CHECK, *todo]
            else:
                todo = [*_split(target), *todo]
        return tuple(done)

    def host(self, parts: list[str] | tuple[str, ...]) -> str:
        """The host path of already-resolved components (for a subprocess cwd)."""
        return os.path.join(self.root, *parts)

    # -- operations ---------------------------------------------------------

    def read(self, path: str, *, limit: int) -> bytes:
        """The bytes of the regular file ``path``; a file over ``limit`` bytes raises ``SandboxFileTooLarge``
        before anything is read (and one that grows past it while being read, too)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise SpecError(f"sandbox {self.label}: read_file limit must be an int >= 0 (bytes), got {limit!r}")
        parts = self.resolve(path)
        if not parts:
            raise SpecError(f"sandbox {self.label}: {path!r} is a directory, not a file")
        with self._mapped(path), self._dir(parts[:-1], create=False) as dfd:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if stat.S_ISDIR(st.st_mode):
                    raise SpecError(f"sandbox {self.label}: {path!r} is a directory, not a file")
                if not stat.S_ISREG(st.st_mode):
                    raise SpecError(f"sandbox {self.label}: {path!r} is not a regular file (fifo, socket or device)")
                if st.st_size > limit:
                    raise SandboxFileTooLarge(self._too_large(path, f"{st.st_size} bytes", limit))
                data = f.read(limit + 1)
                if len(data) > limit:  # it grew after the fstat
                    raise SandboxFileTooLarge(self._too_large(path, f"more than {limit} bytes", limit))
                return data

    def _too_large(self, path: str, got: str, limit: int) -> str:
        return (
            f"sandbox {self.label}: {path!r}: expected at most {limit} bytes (read_file's limit), got {got}; "
            "nothing was read (pass a larger limit, or read it in parts with a command)"
        )

    def write(self, path: str, data: bytes, mode: int | None) -> None:
        """Replace ``path`` atomically. ``mode=None`` keeps an existing file's mode; a new file gets 0644."""
        if mode is not None and (isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777):
            raise SpecError(f"sandbox {self.label}: write_file mode must be an int in 0..0o7777 or None, got {mode!r}")
        parts = self.resolve(path)
        if not parts:
            raise SpecError(f"sandbox {self.label}: cannot write to the root directory")
        name = parts[-1]
        tmp = f".{name[:200]}.agentenv-{uuid.uuid4().hex[:8]}"
        with self._mapped(path), self._dir(parts[:-1], create=True) as dfd:
            if mode is None:
                mode = self._existing_mode(name, dfd)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    os.fchmod(f.fileno(), mode)
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise

    @staticmethod
    def _existing_mode(name: str, dfd: int) -> int:
        """The permission bits of the regular file ``name`` in ``dfd``, or 0644 for a new one.

        Not following a symlink is safe: ``resolve`` already followed every link
        in the path, so a link here was swapped in since, and is replaced, not kept.
        """
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return 0o644
        return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644

    def makedirs(self, path: str) -> None:
        """Create the directory ``path`` and its parents (no-op if it exists)."""
        with self._mapped(path), self._dir(self.resolve(path), create=True):
            pass

    def list(self, path: str, *, recursive: bool) -> list[FileEntry]:
        parts = self.resolve(path)
        entries: list[FileEntry] = []
        with self._mapped(path), self._dir(parts, create=False) as top:
            stack: list[tuple[int, str]] = [(os.dup(top), "/" + "/".join(parts))]
            while stack:
                fd, base = stack.pop()
                try:
                    with os.scandir(fd) as it:
                        items = list(it)
                    for item in items:
                        st = item.stat(follow_symlinks=False)
                        full = f"{base.rstrip('/')}/{item.name}"
                        is_dir = stat.S_ISDIR(st.st_mode)
                        entries.append(
                            FileEntry(
                                path=full,
                                size=st.st_size,
                                is_dir=is_dir,
                                mode=stat.S_IMODE(st.st_mode),
                                is_symlink=stat.S_ISLNK(st.st_mode),
                            )
                        )
                        if recursive and is_dir:
                            stack.append((os.open(item.name, _DIR_FLAGS, dir_fd=fd), full))
                finally:
                    os.close(fd)
        return sorted(entries, key=lambda e: e.path)

    # -- helpers ------------------------------------------------------------

    @contextmanager
    def _dir(self, parts: tuple[str, ...], *, create: bool) -> Iterator[int]:
        """A descriptor on the directory ``parts``, opened without following any symlink."""
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise SandboxLost(f"sandbox {self.label}: its directory {self.root} is gone ({exc})") from exc
        try:
            for part in parts:
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                        os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                    ):
                        raise PathEscape(f"sandbox {self.label}: {part!r} became a symlink while being accessed") from exc
                    raise
                os.close(fd)
                fd = nfd
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _mapped(self, path: str) -> Iterator[None]:
        """Turn ``OSError`` into the ``sandboxes.errors`` class that names ``path``."""
        try:
            yield
        except SandboxError:
            raise
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise SandboxFileNotFound(f"sandbox {self.label}: no such file {path!r} ({exc.strerror})") from exc
        except IsADirectoryError as exc:
            raise SpecError(f"sandbox {self.label}: {path!r} is a directory, not a file") from exc
        except PermissionError as exc:
            raise SandboxPermissionError(f"sandbox {self.label}: permission denied on {path!r} ({exc.strerror})") from exc
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise SandboxPermissionError(f"sandbox {self.label}: {path!r} is on a read-only file system") from exc
            if exc.errno == errno.ELOOP:
                raise PathEscape(f"sandbox {self.label}: {path!r} is a symlink that cannot be followed here") from exc
            raise SandboxError(f"sandbox {self.label}: {path!r}: {exc}") from exc


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a sandbox directory without following symlinks; ``dst`` must not exist.

    No hard links are kept (every copy is independent). Directory modes are
    applied last so a read-only directory can still be filled.
    """
    os.mkdir(dst, 0o700)
    dirs: list[tuple[str, str]] = [(str(src), str(dst))]
    stats: list[tuple[str, str]] = []
    while dirs:
        s_dir, d_dir = dirs.pop()
        stats.append((s_dir, d_dir))
        with os.scandir(s_dir) as it:
            for item in it:
                s, d = item.path, os.path.join(d_dir, item.name)
                if item.is_symlink():
                    os.symlink(os.readlink(s), d)
                elif item.is_dir(follow_symlinks=False):
                    os.mkdir(d, 0o700)
                    dirs.append((s, d))
                elif item.is_file(follow_symlinks=False):
                    shutil.copy2(s, d, follow_symlinks=False)
                # FIFOs, sockets, devices: not part of a snapshot
    for s_dir, d_dir in reversed(stats):
        shutil.copystat(s_dir, d_dir, follow_symlinks=False)


def remove_tree(path: Path) -> None:
    """``rmtree`` that also removes what the sandbox made read-only (chmod 555 dirs)."""

    def fix(func: Callable[..., Any], failed: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(failed), 0o700)
            func(failed)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=fix)


__all__ = ["Confined", "copy_tree", "remove_tree"]
