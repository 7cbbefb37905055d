"""The local sandbox backend, for hosts without Docker and for debugging one task.

Each sandbox is a private host directory ``<run dir>/sandboxes/<id>/fs`` that
plays the part of the sandbox's ``/``: the spec's workdir is
``fs/workspace`` (for ``/workspace``), ``$HOME`` is ``fs/home/agent`` and
``$TMPDIR`` is ``fs/tmp``. Commands are subprocesses with a deadline (see
``sandboxes.local_exec``); file operations act on the directory directly,
confined to it (see ``sandboxes.local_fs``).

It runs in one of two modes, chosen by probing the host once
(``LocalBackend.probe()`` says which and why; falling back to plain mode is
logged as a warning, never silent):

* **bubblewrap** (``bwrap`` works here): every command gets its own user, pid,
  ipc, uts (and, unless ``spec.network``, network) namespaces. Its ``/`` is a
  read-only tmpfs holding the sandbox's own top-level directories read-write,
  the host's ``/usr``, ``/bin``, ``/lib*``, ``/sbin`` read-only, a few ``/etc``
  files (loader cache, alternatives; resolv.conf, hosts and certificates when
  networked), a fresh ``/proc`` and a minimal ``/dev``. The pid namespace ends
  with the command: background processes do **not** survive to the next
  ``exec`` (under Docker they live until ``close``).
* **plain subprocesses** (no working bwrap): the command runs on the host in the
  sandbox directory, with a clean environment. This isolates almost nothing.

What this backend does NOT isolate or enforce, in either mode:

* memory: only ``RLIMIT_AS`` = ``spec.memory_mb`` per process (virtual memory,
  not the sandbox's total; ``oom_killed`` is never set: allocations fail instead);
* processes: ``spec.pids`` is not enforced (``RLIMIT_NPROC`` counts every process
  of the host user, so it would throttle unrelated work and is ignored for root);
* CPU: ``spec.cpus`` is not enforced (the deadline is the only CPU bound);
* disk: ``spec.disk_mb`` is only ``RLIMIT_FSIZE`` (largest single file), not a
  quota; ``spec.tmpfs_mb`` is ignored (``/tmp`` is the sandbox's ``fs/tmp``);
* users: ``spec.user`` is recorded, not applied; commands run as the host user
  (mapped to uid 0 inside bubblewrap, without capabilities);
* ``spec.runtime`` and ``spec.image`` are recorded only: there is no image, the
  host's own tools in ``/usr`` are what a command runs;
* under bubblewrap, files that ``write_file`` puts under ``/etc``, ``/usr``,
  ``/bin``, ``/lib*``, ``/sbin`` are not seen by commands (those are the host's).

And without bubblewrap, additionally: the whole host file system is readable
and writable with the host user's rights (absolute paths in commands are host
paths: ``pwd`` prints the host directory, ``/workspace`` does not exist);
the network is the host's; commands see every host process and may signal the
host user's processes; background processes keep running until the sandbox
is closed or a command times out, when everything carrying the sandbox's
``AGENTENV_SANDBOX_ID`` variable is killed (a process that rewrites its
environment escapes that).

Snapshots copy files only (never processes), as independent copies (no hard
links), keeping symlinks as symlinks and skipping FIFOs, sockets and devices:

* ``FAST``: a copy under this backend's run directory, removed by ``close()``;
  restoring it from another process or after ``close()`` raises ``SnapshotError``.
* ``IMAGE``: the same copy under ``<root>/images/<id>`` with its ``ref.json``,
  and ``<root>/images/tags/<tag>`` naming it when tagged. It outlives the backend
  and the process (``find_image(tag)`` finds it again) but, unlike a Docker
  image, cannot be pushed anywhere and is removed only by deleting the folder.

Usage::

    backend = LocalBackend()
    sandbox = backend.create(SandboxSpec(image="agentenv-base:latest"))
    sandbox.write_file("hello.py", "print('hi')")
    print(sandbox.exec("python3 hello.py").stdout)
    backend.close()
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandboxes.errors import SandboxError, SandboxFileNotFound, SandboxLost, SnapshotError, SpecError
from sandboxes.labels import Owner, current_run_id
from sandboxes.local_exec import (
    MARKER_VAR,
    RESERVED_TOP,
    Limits,
    BwrapProbe,
    bwrap_argv,
    probe_bwrap,
    kill_marked,
    run_bounded,
)
from sandboxes.local_fs import Confined, copy_tree, remove_tree
from sandboxes.types import (
    DEFAULT_EXEC_TIMEOUT_S,
    READ_LIMIT,
    ExecResult,
    FileEntry,
    SandboxSpec,
    SnapshotKind,
    SnapshotRef,
)

log = logging.getLogger(__name__)

_MIB = 1 << 20
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

ISOLATION_BWRAP = (
    "bubblewrap: own user/pid/ipc/uts namespaces and no network unless spec.network; host /usr, /bin, /lib*, "
    "/sbin read-only; the rest of the host file system is not visible. NOT enforced: spec.pids, spec.cpus, "
    "spec.tmpfs_mb, spec.user, a total memory limit (only RLIMIT_AS per process) and a disk quota (only "
    "RLIMIT_FSIZE per file). Background processes die when the command ends."
)
ISOLATION_PLAIN = (
    "plain subprocesses: NO file system isolation (the host is readable and writable with the host user's "
    "rights), NO network isolation, NO process isolation (host processes are visible and signalable). "
    "Only a private working directory, a clean environment, a deadline that kills the process group and "
    "marked children, RLIMIT_AS per process and RLIMIT_FSIZE per file. NOT enforced: spec.pids, spec.cpus, "
    "spec.tmpfs_mb, spec.user, spec.network=False."
)


def _split_path(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


def default_root() -> Path:
    """``$AGENTENV_LOCAL_ROOT``, else ``$XDG_CACHE_HOME/agentenv/local`` (``~/.cache``)."""
    env = os.environ.get("AGENTENV_LOCAL_ROOT")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "agentenv" / "local"


class LocalSandbox:
    """One local sandbox; made by ``LocalBackend``, not directly."""

    def __init__(self, backend: LocalBackend, sid: str, spec: SandboxSpec, home: Path, origin: SnapshotRef | None):
        self._backend = backend
        self._id = sid
        self._spec = spec
        self._home = home
        self._origin = origin
        self._closed = False
        self._fs = Confined(home / "fs", spec.workdir, sid)

    @property
    def id(self) -> str:
        return self._id

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    @property
    def root(self) -> Path:
        """The host directory that is this sandbox's ``/`` (for debugging; prefer the file methods)."""
        return self._fs.root

    def __repr__(self) -> str:
        return f"LocalSandbox(id={self._id!r}, root={str(self._fs.root)!r}, closed={self._closed})"

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._check_open()
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise SpecError(f"sandbox {self._id}: cmd must be a string or a non-empty list of strings, got {cmd!r}")
        timeout = DEFAULT_EXEC_TIMEOUT_S if timeout is None else float(timeout)
        if timeout <= 0:
            raise SpecError(f"sandbox {self._id}: timeout must be > 0 seconds, got {timeout}")
        if stdin is not None and not isinstance(stdin, (bytes, bytearray, memoryview)):
            raise SpecError(f"sandbox {self._id}: stdin must be bytes, got {type(stdin).__name__}")
        parts = self._fs.resolve(cwd or self._spec.workdir)
        host_cwd = self._fs.host(parts)
        bwrap = self._backend.use_bwrap
        # under bwrap a cwd in a host system directory (/usr/lib) exists only inside: bwrap checks it
        if not (bwrap and parts and parts[0] in RESERVED_TOP) and not os.path.isdir(host_cwd):
            raise SandboxFileNotFound(f"sandbox {self._id}: cwd {cwd!r} is not a directory in the sandbox")
        prefix: list[str] = []
        if bwrap:
            prefix = bwrap_argv(
                fs_root=str(self._fs.root),
                top_entries=self._top_entries(),
                chdir="/" + "/".join(parts),
                network=self._spec.network,
            )
        limits = Limits(
            address_space=self._spec.memory_mb * _MIB,
            file_size=self._spec.disk_mb * _MIB if self._spec.disk_mb is not None else None,
        )
        try:
            return run_bounded(  # prlimit inside bwrap: a missing program then exits 127 in both modes
                [*prefix, *limits.argv(inside_bwrap=bwrap), *argv],
                cwd=str(self._fs.root) if bwrap else host_cwd,
                env=self._env(env),
                stdin=bytes(stdin) if stdin is not None else None,
                timeout=timeout,
                limit=self._spec.output_limit,
                marker=self._id,
            )
        except OSError as exc:  # the program itself could not be started (plain mode)
            return ExecResult(exit_code=127, stdout="", stderr=f"{argv[0]}: {exc.strerror or exc}\n")

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        self._check_open()
        return self._fs.read(path, limit=READ_LIMIT if limit is None else limit)

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._check_open()
        self._fs.write(path, data.encode() if isinstance(data, str) else bytes(data), mode)

    def list_files(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        self._check_open()
        return self._fs.list(path, recursive=recursive)

    def snapshot(self, kind: SnapshotKind = SnapshotKind.FAST, *, tag: str | None = None) -> SnapshotRef:
        self._check_open()
        kind = SnapshotKind(kind)
        if tag is not None and not _TAG.fullmatch(tag):
            raise SpecError(f"snapshot tag must match {_TAG.pattern}, got {tag!r}")
        snap_id = f"lsnap-{uuid.uuid4().hex[:16]}"
        home = (self._backend.images_dir if kind is SnapshotKind.IMAGE else self._backend.snapshots_dir) / snap_id
        staging = home.with_name(home.name + ".partial")
        try:
            staging.mkdir(parents=True)
            copy_tree(self._fs.root, staging / "fs")
            os.rename(staging, home)
        except OSError as exc:
            remove_tree(staging)
            raise SnapshotError(f"sandbox {self._id}: snapshot to {home} failed: {exc}") from exc
        ref = SnapshotRef(
            id=snap_id,
            kind=kind,
            backend=LocalBackend.name,
            base_image=(tag or snap_id) if kind is SnapshotKind.IMAGE else self._spec.image,
            location=str(home),
            spec=self._spec,
            parent=self._origin.id if self._origin else None,
            depth=self._origin.depth + 1 if self._origin else 0,
        )
        if kind is SnapshotKind.IMAGE:
            (home / "ref.json").write_text(json.dumps(ref.to_dict()))
            if tag is not None:
                self._backend._tag(tag, snap_id)
        return ref

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        kill_marked(self._id)
        remove_tree(self._home)
        self._backend._forget(self._id)

    # -- helpers ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxLost(f"sandbox {self._id} is closed")
        if not self._fs.root.is_dir():
            raise SandboxLost(f"sandbox {self._id}: its directory {self._fs.root} was removed")

    def _top_entries(self) -> list[str]:
        """Top-level names to bind under bwrap: real directories and files, never symlinks."""
        names = []
        with os.scandir(self._fs.root) as it:
            for item in it:
                if item.name in RESERVED_TOP or item.is_symlink():
                    continue
                if item.is_dir(follow_symlinks=False) or item.is_file(follow_symlinks=False):
                    names.append(item.name)
        return sorted(names)

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        def inside(path: str) -> str:  # plain mode runs with host rights: no need to confine these
            return path if self._backend.use_bwrap else self._fs.host(_split_path(path))

        env = {"PATH": _PATH, "LANG": "C.UTF-8", "HOME": inside("/home/agent"), "TMPDIR": inside("/tmp")}
        env.update(self._spec.env)
        env.update(extra or {})
        env[MARKER_VAR] = self._id  # last: the sweep on timeout and close depends on it
        return env


class LocalBackend:
    """Makes ``LocalSandbox`` es under ``root`` (see the module docstring for what they isolate).

    ``use_bwrap``: None probes the host (bubblewrap when it works, else plain
    subprocesses with a logged warning), True insists (``SpecError`` naming the
    probe's reason if it does not work here), False forces plain subprocesses.
    ``mode_reason`` says in words why this backend runs in the mode it does.
    """

    name = "local"

    @staticmethod
    def probe() -> BwrapProbe:
        """Whether bubblewrap isolation is available on this host, and why (probed once per process)."""
        return probe_bwrap()

    def __init__(self, root: Path | None = None, *, use_bwrap: bool | None = None) -> None:
        found = self.probe() if use_bwrap is not False else None
        if use_bwrap and found is not None and not found.works:
            raise SpecError(f"use_bwrap: expected a host where bubblewrap works, got: {found.reason}")
        self.use_bwrap: bool = bool(found and found.works)
        self.isolation: str = ISOLATION_BWRAP if self.use_bwrap else ISOLATION_PLAIN
        if found is None:
            self.mode_reason = "plain subprocesses: forced by use_bwrap=False"
        elif found.works:
            self.mode_reason = f"bubblewrap: {found.reason}"
        else:
            self.mode_reason = f"plain subprocesses, NO isolation: bubblewrap is unavailable ({found.reason})"
            log.warning("LocalBackend: %s", self.mode_reason)
        self.root = Path(root) if root is not None else default_root()
        self.run_dir = self.root / "runs" / f"{current_run_id()}-{uuid.uuid4().hex[:8]}"
        self.sandboxes_dir = self.run_dir / "sandboxes"
        self.snapshots_dir = self.run_dir / "snapshots"
        self.images_dir = self.root / "images"
        for d in (self.sandboxes_dir, self.snapshots_dir, self.images_dir / "tags"):
            d.mkdir(parents=True, exist_ok=True)
        me = Owner.me()
        (self.run_dir / "owner.json").write_text(json.dumps({"host": me.host, "pid": me.pid, "start": me.start}))
        self._lock = threading.Lock()
        self._live: dict[str, LocalSandbox] = {}
        self._closed = False

    def __repr__(self) -> str:
        mode = "bwrap" if self.use_bwrap else "plain"
        return f"LocalBackend(root={str(self.root)!r}, mode={mode}, live={len(self._live)})"

    def create(self, spec: SandboxSpec) -> LocalSandbox:
        return self._new(spec, origin=None)

    def restore(self, ref: SnapshotRef) -> LocalSandbox:
        if ref.backend != self.name:
            raise SnapshotError(f"snapshot {ref.id} was made by backend {ref.backend!r}, not {self.name!r}")
        if not (Path(ref.location) / "fs").is_dir():
            raise SnapshotError(
                f"snapshot {ref.id} ({ref.kind.value}) is gone from {ref.location} "
                "(FAST snapshots are removed when the backend that made them closes)"
            )
        return self._new(ref.spec, origin=ref)

    def fork(self, ref: SnapshotRef, n: int) -> list[LocalSandbox]:
        if n < 1:
            raise SpecError(f"fork needs n >= 1, got {n}")
        made: list[LocalSandbox] = []
        try:
            for _ in range(n):
                made.append(self.restore(ref))
        except BaseException:
            for sandbox in made:
                sandbox.close()
            raise
        return made

    def find_image(self, tag: str) -> SnapshotRef:
        """The ``IMAGE`` snapshot last tagged ``tag`` (by any backend sharing this root)."""
        try:
            snap_id = (self.images_dir / "tags" / tag).read_text().strip()
            return SnapshotRef.from_dict(json.loads((self.images_dir / snap_id / "ref.json").read_text()))
        except (OSError, ValueError) as exc:
            raise SnapshotError(f"no local image tagged {tag!r} under {self.images_dir}") from exc

    @classmethod
    def reap(cls, root: Path | None = None) -> int:
        """Remove run directories (and kill marked processes) of dead processes on this host.

        The local counterpart of the Docker reaper: a process that crashed
        without ``close()`` leaves ``<root>/runs/<run>``. Returns how many were removed.
        """
        removed = 0
        runs = (Path(root) if root is not None else default_root()) / "runs"
        for run in sorted(runs.iterdir()) if runs.is_dir() else []:
            try:
                owner = Owner(**json.loads((run / "owner.json").read_text()))
            except (OSError, ValueError, TypeError):
                continue  # being created, or not ours
            if owner.is_alive() is not False:
                continue
            for sandbox in (run / "sandboxes").glob("local-*"):
                kill_marked(sandbox.name)
            remove_tree(run)
            removed += 1
        return removed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            live = list(self._live.values())
        for sandbox in live:
            sandbox.close()
        remove_tree(self.run_dir)

    # -- helpers ------------------------------------------------------------

    def _new(self, spec: SandboxSpec, origin: SnapshotRef | None) -> LocalSandbox:
        top = spec.workdir.strip("/").split("/")[0]
        if self.use_bwrap and top in RESERVED_TOP:
            raise SpecError(f"workdir {spec.workdir!r}: under bubblewrap /{top} is the host's, pick another workdir")
        sid = f"local-{uuid.uuid4().hex[:12]}"
        home = self.sandboxes_dir / sid
        with self._lock:
            if self._closed:
                raise SandboxLost(f"backend {self!r} is closed")
            sandbox = LocalSandbox(self, sid, spec, home, origin)
            self._live[sid] = sandbox
        try:
            home.mkdir(parents=True)
            if origin is not None:
                copy_tree(Path(origin.location) / "fs", home / "fs")
            else:
                (home / "fs").mkdir()
            for path in (spec.workdir, "/tmp", "/home/agent"):
                sandbox._fs.makedirs(path)
            os.chmod(home / "fs" / "tmp", 0o1777)
        except BaseException as exc:
            sandbox.close()
            if isinstance(exc, OSError):
                error = SnapshotError if origin is not None else SandboxError
                raise error(f"could not make sandbox {sid} in {home}: {exc}") from exc
            raise
        return sandbox

    def _tag(self, tag: str, snap_id: str) -> None:
        path = self.images_dir / "tags" / tag
        tmp = path.with_name(f".{tag}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(snap_id)
        os.replace(tmp, path)

    def _forget(self, sid: str) -> None:
        with self._lock:
            self._live.pop(sid, None)


__all__ = ["ISOLATION_BWRAP", "ISOLATION_PLAIN", "LocalBackend", "LocalSandbox", "default_root"]
