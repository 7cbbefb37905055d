"""The overlay file system of a Docker container, read on the host.

What both the FAST snapshots (``docker_snapshots``) and the in-place reset
(``docker_reset``) need to read an overlay upper dir and the image's lower
layers the way the container sees them: whiteouts in both encodings
(``.wh.<name>`` files, 0/0 character devices), opaque directories (marker
files or xattrs), the paths that are never an episode's (engine files,
mounts, the agent), and the extended attributes an episode may set. It
imports nothing else of the Docker backend, so the backend, snapshots and
reset import it and each other without a cycle.
"""

from __future__ import annotations

import os
import posixpath
import stat
from typing import Any

from sandboxes.beneath import Deadline, open_dir_beneath
from sandboxes.channel import AGENT_DIR

# Paths Docker itself provides in every container; never part of a snapshot.
ENGINE_PATHS = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/.dockerenv", "/usr/sbin/docker-init")
MOUNTED_TREES = ("/proc", "/sys", "/dev", AGENT_DIR)
WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKERS = (".wh..wh..opq", ".wh..opq")
OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque", "user.fuseoverlayfs.opaque")
# Extended attributes that belong to the overlay or the kernel, never to an episode.
INTERNAL_XATTRS = ("trusted.overlay.", "user.overlay.", "user.fuseoverlayfs.", "security.", "system.")
PAX_XATTR = "SCHILY.xattr."


def user_xattrs(path: str | int) -> dict[str, bytes]:
    """The extended attributes of ``path`` (not followed; or an open file descriptor) an episode could have set."""
    try:
        names = os.listxattr(path) if isinstance(path, int) else os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    out = {}
    for name in names:
        if not name.startswith(INTERNAL_XATTRS):
            try:
                out[name] = os.getxattr(path, name) if isinstance(path, int) else os.getxattr(path, name, follow_symlinks=False)
            except OSError:
                continue
    return out


def xattr_pax(path: str | int) -> dict[str, str]:
    """``user_xattrs`` as PAX headers (values kept byte-exact through surrogateescape)."""
    return {PAX_XATTR + k: v.decode("utf-8", "surrogateescape") for k, v in user_xattrs(path).items()}


class Keep:
    """Filter out engine-provided paths, mounts (tmpfs) and the agent itself."""

    def __init__(self, sb: Any) -> None:
        trees = list(MOUNTED_TREES)
        if sb.spec.tmpfs_mb > 0:
            trees.append("/tmp")
        self._trees = tuple(trees)

    def __call__(self, path: str) -> bool:
        if path in ENGINE_PATHS or path.startswith("/.pivot_root"):  # runc leaves a whiteout for its pivot dir
            return False
        return not any(path == t or path.startswith(t + "/") for t in self._trees)


def readable_upper(sb: Any) -> str | None:
    data = (sb.container.attrs.get("GraphDriver") or {}).get("Data") or {}
    upper = data.get("UpperDir")
    return str(upper) if upper and os.access(upper, os.R_OK | os.X_OK) else None


def walk_upper(upper: str, deadline: Deadline | None = None) -> tuple[list[str], list[str], list[str]]:
    """Changed paths, whiteouts (deleted) and opaque dirs of an overlay upper dir.

    The upper dir of a running container changes under the walk: every
    directory is opened beneath ``upper`` with no symlink followed
    (``sandboxes.beneath``), so a directory swapped for a symlink is skipped,
    never listed through; an entry gone since its directory was listed is
    skipped too. Past ``deadline``, ``DeadlinePassed``.
    """
    paths: list[str] = []
    deleted: list[str] = []
    opaque: list[str] = []
    root = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        todo = ["/"]
        while todo:
            rel_dir = todo.pop()
            try:
                dfd = open_dir_beneath(root, rel_dir)
            except OSError:
                continue  # swapped for a symlink or removed since it was listed
            try:
                for name in os.listdir(dfd):
                    if deadline is not None:
                        deadline.check()
                    target = posixpath.join(rel_dir, name)
                    if name in OPAQUE_MARKERS:
                        opaque.append(rel_dir)
                        continue
                    if name.startswith(WHITEOUT_PREFIX):
                        deleted.append(posixpath.join(rel_dir, name[len(WHITEOUT_PREFIX) :]))
                        continue
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                        deleted.append(target)
                        continue
                    paths.append(target)
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(target)
                        if _opaque_at(dfd, name):
                            opaque.append(target)
            finally:
                os.close(dfd)
    finally:
        os.close(root)
    return paths, deleted, sorted(set(opaque))


def _opaque_at(dir_fd: int, name: str) -> bool:
    """``is_opaque`` of directory ``name`` in ``dir_fd``, opened without following it."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        return is_opaque(fd)
    finally:
        os.close(fd)


def is_opaque(path: str | int) -> bool:
    """Whether a directory (a path, not followed, or an open file descriptor) is an opaque overlay dir."""
    for attr in OPAQUE_XATTRS:
        try:
            if isinstance(path, int):
                if os.getxattr(path, attr) == b"y":
                    return True
            elif os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


class LowerView:
    """The merged view of an image's lower layers (host dirs, topmost first), read-only.

    Whiteouts are honoured in both encodings fuse-overlayfs and Docker use
    (``.wh.<name>`` files and 0/0 character devices), as are opaque dirs
    (``.wh..wh..opq`` markers or the overlay ``opaque`` xattrs).
    """

    def __init__(self, layers: list[str]) -> None:
        self.layers = layers
        self._visible: dict[str, list[int]] = {"/": self._root_layers()}

    def _root_layers(self) -> list[int]:
        out = []
        for i, layer in enumerate(self.layers):
            out.append(i)
            if _opaque_dir(layer):
                break
        return out

    def _host(self, i: int, path: str) -> str:
        return os.path.join(self.layers[i], path.lstrip("/"))

    def _whited_out(self, i: int, path: str) -> bool:
        parent, name = posixpath.split(path)
        if os.path.lexists(os.path.join(self._host(i, parent), WHITEOUT_PREFIX + name)):
            return True
        return _is_char0(self._host(i, path))

    def visible(self, path: str) -> list[int]:
        """Layers contributing entries to directory ``path`` (empty: not a dir in the base)."""
        got = self._visible.get(path)
        if got is not None:
            return got
        out: list[int] = []
        for i in self.visible(posixpath.dirname(path)):
            if self._whited_out(i, path):
                break
            host = self._host(i, path)
            if not os.path.lexists(host):
                continue
            if os.path.islink(host) or not os.path.isdir(host):
                break  # a non-dir hides everything below it
            out.append(i)
            if _opaque_dir(host):
                break
        self._visible[path] = out
        return out

    def lookup(self, path: str) -> str | None:
        """Host path of the base image's entry at ``path``, or None when the base has none."""
        if path == "/":
            return self.layers[self.visible("/")[0]]
        for i in self.visible(posixpath.dirname(path)):
            if self._whited_out(i, path):
                return None
            host = self._host(i, path)
            if os.path.lexists(host):
                return host
        return None

    def children(self, path: str) -> list[str]:
        """Names in base directory ``path``."""
        seen: set[str] = set()
        hidden: set[str] = set()
        for i in self.visible(path):
            layer_hidden = set()
            for name in os.listdir(self._host(i, path)):
                if name in OPAQUE_MARKERS:
                    continue
                if name.startswith(WHITEOUT_PREFIX):
                    layer_hidden.add(name[len(WHITEOUT_PREFIX) :])
                elif _is_char0(os.path.join(self._host(i, path), name)):
                    layer_hidden.add(name)
                elif name not in hidden:
                    seen.add(name)
            hidden |= layer_hidden | seen
        return sorted(seen)


def _is_char0(host: str) -> bool:
    try:
        st = os.lstat(host)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque_dir(host: str) -> bool:
    return any(os.path.lexists(os.path.join(host, m)) for m in OPAQUE_MARKERS) or is_opaque(host)


__all__ = [
    "ENGINE_PATHS",
    "INTERNAL_XATTRS",
    "MOUNTED_TREES",
    "OPAQUE_MARKERS",
    "OPAQUE_XATTRS",
    "PAX_XATTR",
    "WHITEOUT_PREFIX",
    "Keep",
    "LowerView",
    "is_opaque",
    "readable_upper",
    "user_xattrs",
    "walk_upper",
    "xattr_pax",
]
