"""In-place reset of a Docker sandbox to its base image's pristine state.

Why: destroying a released sandbox and starting a new container costs about
0.3-0.5 s of CPU on fuse-overlayfs; a reset touches only what the episode
changed (the overlay upper dir is the exact list) and costs a few tens of ms.

What ``reset_sandbox`` guarantees when it returns True:

* no process of the sandbox user is left but the agent (every other one was
  SIGKILLed and reaped); root's processes are never touched;
* every path the overlay upper-dir walk reports (the same walk FAST
  snapshots use) is, as the sandbox sees it, identical to the base image's
  (the image's lower layers read on the host, whiteouts and opaque dirs of
  those layers honoured): type, content (sha256), mode, owner, symlink
  target, and the mtime of regular files; paths the base does not have are
  gone; base paths that were deleted are back; opaque (deleted then
  re-created) dirs list exactly the base's entries;
* the scratch mounts (``/tmp`` when it is a tmpfs, ``/dev/shm``,
  ``/dev/mqueue``) are empty, and no SysV IPC object exists (the sandbox
  user's are removed: a killed PostgreSQL leaves its shared memory);
* the sandbox's snapshot lineage is reset, so its next FAST snapshot is a
  full diff against the base image (stale identical copies in the upper dir
  are packed again, which restores the same bytes).

Who checks what: the work (kill, clear, restore) is done by the agent, which
runs as root where the sandbox user cannot reach it; the verdict is the
host's own (``sandboxes.host_view``): processes from the container's cgroup
on the host, file state from the overlay upper dir on the host (type, mode,
owner, content, mtime, symlink target and extended attributes of every
entry against the base image's), scratch mounts through
``/proc/<init>/root``, and the agent's own files byte for byte. Only the SysV
IPC count is the agent's word (the host cannot read another IPC namespace
without entering it).

It refuses (returns False; the caller destroys the sandbox) when any of
that cannot be done or checked: an untrusted or compromised sandbox (its
user is root, or its channel once failed authentication), no agent or a dead one, an unreadable upper
or lower dir, a path the sandbox user may not delete or write (a root-owned
file it replaced, a root-owned directory it modified), a file it may not
read, a process that survives, a non-empty scratch mount, a SysV IPC object,
a verification listing too large for one answer, a failed verification, or
the deadline. Not restored and not checked: hard-link identity between base
paths (contents are restored, links may become copies), directory mtimes,
PID numbers, kernel state outside the file system (page cache, keyrings)
and the container's logs. The agent process itself is kept, not restarted:
the sandbox user cannot signal, trace or replace it (docs/sandboxes.md).
"""

from __future__ import annotations

import io
import json
import logging
import os
import posixpath
import stat
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxes.channel import AGENT_DIR, AGENT_PATH
from sandboxes.beneath import Deadline
from sandboxes.overlay import OPAQUE_MARKERS, WHITEOUT_PREFIX, Keep, LowerView, user_xattrs, xattr_pax
from sandboxes.host_view import HostView

if TYPE_CHECKING:
    from sandboxes.docker_backend import DockerSandbox

log = logging.getLogger(__name__)

HELPER_SOURCE = Path(__file__).with_name("reset_helper.py").read_bytes()
AGENT_SOURCE = Path(__file__).with_name("agent.py").read_bytes()
HOST_SETTLE_S = 2.0  # killed processes leave the cgroup once reaped
SCRATCH_MOUNTS = ("/dev/shm", "/dev/mqueue")
DEFAULT_RESET_TIMEOUT_S = 30.0


class ResetRefused(Exception):
    """Internal: why a reset could not guarantee a pristine sandbox."""


def _agent_live(sb: DockerSandbox) -> bool:
    return not sb._closed and sb.has_agent and sb._channel is not None and sb._channel.is_open


def _untrusted(sb: DockerSandbox) -> str | None:
    if sb.compromised is not None:
        return f"compromised: {sb.compromised}"
    if sb.untrusted is not None:
        return f"no trust boundary: {sb.untrusted}"
    if not _agent_live(sb):
        return "no live agent"
    return None


def host_unclean(sb: DockerSandbox, scratch: list[str], deadline: float) -> str | None:
    """The host's own verdict on processes, scratch mounts and the agent's files, or None when clean."""
    view = HostView(sb.container)
    settle = min(deadline, time.monotonic() + HOST_SETTLE_S)
    left = view.user_processes(0)
    while left and time.monotonic() < settle:
        time.sleep(0.01)
        left = view.user_processes(0)
    if left:
        return f"the host sees sandbox-user processes: {[(p.pid, p.state, p.cmd[:60]) for p in left[:10]]}"
    seen = view.scratch(scratch)
    if seen is None:
        return "the host cannot list the scratch mounts"
    busy = {k: v[:5] for k, v in seen.items() if v}
    if busy:
        return f"the host sees scratch mounts not empty: {busy}"
    return agent_files_changed(sb)


def agent_files_changed(sb: DockerSandbox) -> str | None:
    """Whether the agent's directory is exactly what the host put there (from the upper dir)."""
    upper = _upper_dir(sb)
    if upper is None:
        return None  # not visible here: the files are root's and the user cannot write them
    top = os.path.join(upper, AGENT_DIR.lstrip("/"))
    try:
        names = sorted(n for n in os.listdir(top) if n not in OPAQUE_MARKERS)
        st_dir, st_file = os.lstat(top), os.lstat(os.path.join(upper, AGENT_PATH.lstrip("/")))
        with open(os.path.join(upper, AGENT_PATH.lstrip("/")), "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"the agent's files cannot be read on the host: {exc}"
    if names != [posixpath.basename(AGENT_PATH)] or data != AGENT_SOURCE:
        return f"the agent's directory changed: {names}"
    if (st_dir.st_uid, st_file.st_uid) != (0, 0) or stat.S_IMODE(st_file.st_mode) & 0o022:
        return "the agent's files are no longer root's alone"
    return None


def _upper_dir(sb: DockerSandbox) -> str | None:
    data = (sb.container.attrs.get("GraphDriver") or {}).get("Data") or {}
    upper = str(data.get("UpperDir") or "")
    return upper if upper and os.access(upper, os.R_OK | os.X_OK) else None


def _scratch_mounts(sb: DockerSandbox) -> list[str]:
    return (["/tmp"] if sb.spec.tmpfs_mb > 0 else []) + list(SCRATCH_MOUNTS)


def _run_helper(sb: DockerSandbox, req: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``reset_helper.run(req)`` inside the sandbox, in the agent's process (no interpreter start)."""
    _, body = sb.agent_call({"op": "helper", "request": req}, HELPER_SOURCE, timeout=timeout)
    out: dict[str, Any] = json.loads(body)
    return out


def _unclean(out: dict[str, Any]) -> str | None:
    """Why a helper answer shows a sandbox that still runs something or holds scratch state, or None."""
    if out["procs"]:
        return f"sandbox-user processes survive: {out['procs'][:10]}"
    if out["scratch_errors"] or any(out["scratch"].values()):
        return f"scratch mounts not empty: {out['scratch_errors'][:5] or out['scratch']}"
    if out["ipc"]:
        return f"{out['ipc']} SysV IPC objects exist"
    return None


class Resetter:
    """One reset of one sandbox; ``run`` raises ``ResetRefused`` with the reason."""

    def __init__(self, sb: DockerSandbox, timeout: float) -> None:
        self.sb = sb
        self.deadline = time.monotonic() + timeout
        self.keep = Keep(sb)
        data = (sb.container.attrs.get("GraphDriver") or {}).get("Data") or {}
        self.upper = str(data.get("UpperDir") or "")
        lowers = [d for d in str(data.get("LowerDir") or "").split(":") if d]
        if not self.upper or not os.access(self.upper, os.R_OK | os.X_OK):
            raise ResetRefused("the overlay upper dir is not readable here")
        if not lowers or not all(os.access(d, os.R_OK | os.X_OK) for d in lowers):
            raise ResetRefused("the image's lower layers are not readable here")
        self.base = LowerView(lowers)
        self.scratch = _scratch_mounts(sb)

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ResetRefused("deadline passed")
        return left

    def helper(self, req: dict[str, Any]) -> dict[str, Any]:
        return _run_helper(self.sb, req, self._left())

    def run(self) -> None:
        first = self.helper({"kill": True, "clear": True, "scratch": self.scratch})
        self._check_clean(first)
        self._check_host()
        changes = self.sb._backend.snapshots.changes(self.sb, Deadline(self._left(), f"reset of sandbox {self.sb.id}"))
        deleted_paths, members = self._plan(changes.paths, changes.deleted, changes.opaque)
        if deleted_paths or members:
            blob = self._blob(deleted_paths, members)
            head, _ = self.sb.agent_call({"op": "unpack"}, blob, timeout=self._left())
            if head.get("failed"):
                raise ResetRefused(f"the sandbox user cannot restore: {head['failed'][:5]}")
        self._verify()

    def _check_clean(self, out: dict[str, Any]) -> None:
        why = _unclean(out)
        if why is not None:
            raise ResetRefused(why)

    def _check_host(self) -> None:
        why = host_unclean(self.sb, self.scratch, self.deadline)
        if why is not None:
            raise ResetRefused(why)

    def _plan(self, paths: list[str], deleted: list[str], opaque: list[str]) -> tuple[list[str], dict[str, str]]:
        """Paths to delete, and base paths to (re)write: sandbox path -> host path of the base entry."""
        drop: list[str] = []
        members: dict[str, str] = {}
        opaque_set = set(opaque)
        for path in paths:
            host = self.base.lookup(path)
            if host is None:
                drop.append(path)
                continue
            up = os.path.join(self.upper, path.lstrip("/"))
            kind = _kind(up)
            if path in opaque_set or kind != _kind(host):
                self._add_tree(path, host, members)  # replaced or emptied: the whole base subtree
            elif not _same_host(up, host):
                members[path] = host  # a dir gets back its mode (and mtime where the user owns it)
        for path in deleted + opaque:
            host = self.base.lookup(path)
            if host is not None:
                self._add_tree(path, host, members)
        return drop, members

    def _add_tree(self, path: str, host: str, members: dict[str, str]) -> None:
        members[path] = host
        if os.path.isdir(host) and not os.path.islink(host):
            for name in self.base.children(path):
                child = posixpath.join(path, name)
                child_host = self.base.lookup(child)
                if child_host is not None and self.keep(child):
                    self._add_tree(child, child_host, members)

    def _blob(self, drop: list[str], members: dict[str, str]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            manifest = json.dumps({"deleted": drop, "opaque": []}).encode()
            info = tarfile.TarInfo(".agentenv-snapshot.json")
            info.size = len(manifest)
            tar.addfile(info, io.BytesIO(manifest))
            for path in sorted(members):  # parents sort before their children
                host = members[path]
                ti = tar.gettarinfo(host, arcname=path.lstrip("/"))
                ti.pax_headers = {**ti.pax_headers, **xattr_pax(host)}
                if ti.isreg():
                    with open(host, "rb") as f:
                        tar.addfile(ti, f)
                else:
                    tar.addfile(ti)
        return buf.getvalue()

    def _verify(self) -> None:
        """The host's verdict, from the upper dir: every entry there equals the base image's."""
        changes = self.sb._backend.snapshots.changes(self.sb, Deadline(self._left(), f"reset of sandbox {self.sb.id}"))
        for path in changes.deleted:
            if self.base.lookup(path) is not None:
                raise ResetRefused(f"base path {path} is still deleted")
        for path in changes.paths:
            host = self.base.lookup(path)
            if host is None:
                raise ResetRefused(f"{path} is not in the base image but still present")
            up = os.path.join(self.upper, path.lstrip("/"))
            if not _same_host(up, host, dir_mtime=False):
                raise ResetRefused(f"{path} differs from the base image (seen on the host)")
            if user_xattrs(up) != user_xattrs(host):
                raise ResetRefused(f"{path} has extended attributes the base image does not: {sorted(user_xattrs(up))}")
        for path in changes.opaque:
            names = [n for n in self.base.children(path) if self.keep(posixpath.join(path, n))]
            up = os.path.join(self.upper, path.lstrip("/"))
            seen = sorted(n for n in os.listdir(up) if n not in OPAQUE_MARKERS and not n.startswith(WHITEOUT_PREFIX))
            if [n for n in seen if self.keep(posixpath.join(path, n))] != names:
                raise ResetRefused(f"opaque dir {path} lists {seen}, the base {names}")
        self._check_host()


def _kind(host: str) -> int:
    try:
        return stat.S_IFMT(os.lstat(host).st_mode)
    except OSError:
        return -1


def _same_host(upper: str, base: str, *, dir_mtime: bool = True) -> bool:
    """Whether an upper-dir entry equals the base's, read on the host: type, mode, owner, content,
    mtime of files (and of dirs with ``dir_mtime``), symlink target, user extended attributes."""
    try:
        a, b = os.lstat(upper), os.lstat(base)
    except OSError:
        return False
    if (a.st_mode, a.st_uid, a.st_gid) != (b.st_mode, b.st_uid, b.st_gid):
        return False
    if user_xattrs(upper) != user_xattrs(base):
        return False
    if stat.S_ISDIR(a.st_mode):
        return not dir_mtime or int(a.st_mtime) == int(b.st_mtime)
    if stat.S_ISLNK(a.st_mode):
        return os.readlink(upper) == os.readlink(base)
    if not stat.S_ISREG(a.st_mode) or a.st_size != b.st_size or int(a.st_mtime) != int(b.st_mtime):
        return False
    with open(upper, "rb") as f, open(base, "rb") as g:
        while True:
            x, y = f.read(1 << 20), g.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def quiesce_sandbox(sb: DockerSandbox, timeout: float = DEFAULT_RESET_TIMEOUT_S) -> str | None:
    """Stop everything of the episode but its files, in place; None when done, else why not.

    Every sandbox-user process is SIGKILLed and reaped, the scratch mounts are
    emptied, and no SysV IPC object may exist: what is left is the overlay's
    file state, exactly what a FAST snapshot would carry to a fork (which has
    no processes, empty scratch mounts and no IPC objects either). The host
    checks the processes and scratch mounts itself. Grading in place after
    this sees what grading in a fork would see.
    """
    why = _untrusted(sb)
    if why is not None:
        return why
    deadline = time.monotonic() + timeout
    scratch = _scratch_mounts(sb)
    try:
        why = _unclean(_run_helper(sb, {"kill": True, "clear": True, "scratch": scratch}, timeout))
        return why if why is not None else host_unclean(sb, scratch, deadline)
    except Exception as exc:  # noqa: BLE001 - a refusal, never a guess: the caller grades in a fork
        return f"{type(exc).__name__}: {exc}"


def reset_sandbox(sb: DockerSandbox, timeout: float = DEFAULT_RESET_TIMEOUT_S) -> bool:
    """Reset ``sb`` in place; True only when every guarantee of this module holds."""
    why: str | None = None
    try:
        untrusted = _untrusted(sb)
        if untrusted is not None:
            raise ResetRefused(untrusted)
        Resetter(sb, timeout).run()
    except ResetRefused as exc:
        why = str(exc)
    except Exception as exc:  # any read, permission or transport problem: refuse, never guess
        why = f"{type(exc).__name__}: {exc}"
    sb.last_reset_refusal = why
    if why is not None:
        log.info("reset of sandbox %s refused: %s", sb.id, why)
        return False
    sb.lineage = (None, 0)
    return True


__all__ = ["DEFAULT_RESET_TIMEOUT_S", "ResetRefused", "host_unclean", "quiesce_sandbox", "reset_sandbox"]
