"""In-memory fakes of the sandbox contract for unit tests: ``FakeSandbox`` and ``FakeBackend``.

They pass the backend contract tests (``tests/sandboxes/test_contract.py``) for every property an
in-memory object can have; the ones it cannot (a command's child processes and background jobs,
output floods through pipes) are excluded there with the reason. It isolates nothing. What they model:

* **files**: a tree held in memory, ``files`` (absolute path -> bytes, which a test may read and
  change directly), ``modes``, ``dirs`` (explicit directories; every parent of an entry is one too),
  ``links`` (symlinks), ``fifos`` and ``sparse`` (path -> size: files of zero bytes never
  materialised, so a test can plant a terabyte). ``read_file`` follows symlinks and honours
  ``limit``/``READ_LIMIT``; reading a FIFO raises ``AssertionError``, since on a real sandbox it
  blocks forever.
* **exec**: a small shell (``FakeShell``, in ``sandboxes.testing_shell``): ``;``, ``&&``, ``||``,
  ``>``/``>>``/``<``, ``>&2``/``2>&1``, ``$VAR``/``${VAR:-default}``/``$$``, ``for X in ...; do
  ...; done`` and the commands in ``FakeShell.COMMANDS`` (echo, printf, cat, ls, test, mkdir, rm,
  ln, chmod, touch, truncate, wc, head, tail, mktemp, stat, od, sleep, kill, sh/bash ``-c``/``-s``,
  executable scripts, ...). No pipes, background jobs, command substitution or other control
  flow: those exit 2 with ``fake shell: unsupported``; an unknown program exits 127, as in sh.
  ``handler(sandbox, command_text)`` scripts anything else (pytest, a check script): it sees every
  command but an argv list naming a modelled program (the file plumbing library code does with
  ``["rm", "-rf", "--", ...]``, ``["mktemp", "-d", ...]``), and may return None to let the shell
  answer. Every call is recorded (``commands``, ``execs``, ``last_argv``, ``last_env``,
  ``last_stdin``; ``reads`` for ``read_file``).
* **deadlines**: the shell checks the deadline before each command and ``sleep`` sleeps only until
  it, then the result is ``timed_out`` with exit 124. Output past the spec's ``output_limit`` is
  dropped and ``truncated`` set.
* **snapshots**: ``snapshot`` copies the tree into a process-wide store (a host's snapshot store:
  any ``FakeBackend`` restores any fake snapshot), with ``parent``/``depth`` lineage; ``restore``,
  ``fork`` and (when enabled) ``apply_snapshot`` copy it back. FAST and IMAGE behave alike.
* **lifecycle**: ``close`` is idempotent; after it, or after ``kill`` (the container died under
  us), every call raises ``SandboxLost``. ``FakeBackend.close`` closes every sandbox it made.

Optional capabilities are off unless asked for, so ``isinstance`` checks against
``ResettableBackend`` and ``SnapshotApplier`` see what a test chose (``FakeBackend(resettable=True,
applies_snapshots=True)``); a fake sandbox is never ``Quiescable`` (subclass it to add ``quiesce``).

    backend = FakeBackend()
    sandbox = backend.create(SandboxSpec(image="img:1"))
    sandbox.write_file("/workspace/a.txt", "hi\\n")
    assert sandbox.exec("cat a.txt && echo more > b.txt").stdout == "hi\\n"
    ref = sandbox.snapshot()
    assert backend.restore(ref).read_file("/workspace/b.txt") == b"more\\n"
"""

from __future__ import annotations

import copy
import itertools
import posixpath
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandboxes.errors import SandboxError, SandboxFileNotFound, SandboxFileTooLarge, SandboxLost, SnapshotError, SpecError
from sandboxes.testing_shell import FakeShell, parents
from sandboxes.types import DEFAULT_EXEC_TIMEOUT_S, READ_LIMIT, ExecResult, FileEntry, SandboxSpec, SnapshotKind, SnapshotRef

Handler = Callable[["FakeSandbox", str], "ExecResult | None"]

_ids = itertools.count()
_snapshots: dict[str, _Tree] = {}  # ref id -> the tree it captured (process-wide, like a host's store)
_snapshots_lock = threading.Lock()


@dataclass
class _Tree:
    """Everything a snapshot captures: the files, never processes."""

    files: dict[str, bytes] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)
    fifos: set[str] = field(default_factory=set)
    sparse: dict[str, int] = field(default_factory=dict)


def _pristine_tree(spec: SandboxSpec) -> _Tree:
    return _Tree(dirs={"/", "/tmp", spec.workdir})


class FakeSandbox:
    """One in-memory sandbox; see the module docstring. Made by ``FakeBackend`` or directly.

    ``files`` seeds the tree (absolute path -> bytes). ``special`` plants what a test cannot write:
    path -> ``"dir"``, ``"symlink"`` (a dangling link), ``"fifo"`` or an int (a sparse file of that
    many bytes). ``spec`` defaults to ``SandboxSpec(image="fake")``.
    """

    def __init__(
        self,
        files: Mapping[str, bytes] | None = None,
        *,
        handler: Handler | None = None,
        special: Mapping[str, Any] | None = None,
        spec: SandboxSpec | None = None,
        backend: FakeBackend | None = None,
        origin: SnapshotRef | None = None,
    ) -> None:
        self._spec = spec or SandboxSpec(image="fake")
        self._id = f"fake-{next(_ids)}"
        self._backend = backend
        self._origin = origin
        tree = _pristine_tree(self._spec)
        self.files, self.modes, self.dirs = tree.files, tree.modes, tree.dirs
        self.links, self.fifos, self.sparse = tree.links, tree.fifos, tree.sparse
        self.files.update(files or {})
        for path, kind in (special or {}).items():
            if kind == "dir":
                self.dirs.add(path)
            elif kind == "symlink":
                self.links[path] = "/nonexistent"
            elif kind == "fifo":
                self.fifos.add(path)
            elif isinstance(kind, int):
                self.sparse[path] = kind
            else:
                raise SpecError(f"special[{path!r}] must be 'dir', 'symlink', 'fifo' or a size, got {kind!r}")
        self.handler = handler
        self.closed = False
        self.killed = False
        self.commands: list[str] = []
        self.execs: list[tuple[list[str], dict[str, str], bytes | None]] = []
        self.last_argv: list[str] = []
        self.last_env: dict[str, str] = {}
        self.last_stdin: bytes | None = None
        self.reads: list[tuple[str, int | None]] = []
        self._lock = threading.RLock()

    # -- the Sandbox protocol ---------------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._alive()
        argv = [cmd] if isinstance(cmd, str) else list(cmd)
        text = cmd if isinstance(cmd, str) else " ".join(cmd)
        self.commands.append(text)
        self.last_argv, self.last_env, self.last_stdin = argv, dict(env or {}), stdin
        self.execs.append((self.last_argv, self.last_env, stdin))
        modelled = not isinstance(cmd, str) and bool(argv) and argv[0] in FakeShell.COMMANDS and argv[0] not in ("sh", "bash")
        if self.handler is not None and not modelled:
            scripted = self.handler(self, text)
            if scripted is not None:
                return scripted
        limit = DEFAULT_EXEC_TIMEOUT_S if timeout is None else timeout
        shell = FakeShell(self, env={**self._spec.env, **(env or {})}, cwd=self._abs(cwd or self._spec.workdir),
                          deadline=time.monotonic() + limit, stdin=stdin)
        with self._lock:
            return shell.run(cmd)

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        self._alive()
        self.reads.append((path, limit))
        real = self.follow(self._abs(path))
        kind = self.kind(real)
        if kind is None:
            raise SandboxFileNotFound(f"{path}: no such file in sandbox {self._id}")
        if kind == "dir":
            raise SandboxError(f"{path}: is a directory, not a file (sandbox {self._id})")
        if kind == "fifo":
            raise AssertionError(f"read_file({path!r}) of a FIFO would block forever on a real sandbox")
        size = self.sparse[real] if kind == "sparse" else len(self.files[real])
        cap = READ_LIMIT if limit is None else limit
        if size > cap:
            raise SandboxFileTooLarge(f"{path}: {size} bytes, over the {cap}-byte limit")
        return bytes(size) if kind == "sparse" else self.files[real]

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._alive()
        with self._lock:
            self.put(self._abs(path), data.encode() if isinstance(data, str) else bytes(data), mode)

    def list_files(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        self._alive()
        base = self.follow(self._abs(path))
        if self.kind(base) != "dir":
            raise SandboxFileNotFound(f"{path}: no such directory in sandbox {self._id}")
        prefix = base.rstrip("/") + "/"
        found = {p for p in self._all_paths() if p.startswith(prefix)}
        found |= {parent for p in found for parent in parents(p) if parent.startswith(prefix)}
        if not recursive:
            found = {p for p in found if "/" not in p[len(prefix):]}
        return [self._entry(p) for p in sorted(found)]

    def snapshot(self, kind: SnapshotKind = SnapshotKind.FAST, *, tag: str | None = None) -> SnapshotRef:
        self._alive()
        with self._lock:
            tree = copy.deepcopy(self._tree())
        parent, ref_id = self._origin, uuid.uuid4().hex[:12]
        ref = SnapshotRef(
            id=ref_id, kind=SnapshotKind(kind), backend=self._backend.name if self._backend else "fake",
            base_image=self._spec.image, location=f"memory:{ref_id}", spec=self._spec,
            parent=parent.id if parent else None, depth=parent.depth + 1 if parent else 0,
        )
        with _snapshots_lock:
            _snapshots[ref.id] = tree
        return ref

    def close(self) -> None:
        self.closed = True

    # -- what a test does to it -------------------------------------------------------

    def kill(self) -> None:
        """The sandbox dies under us (container killed): every later call raises ``SandboxLost``."""
        self.killed = True

    def grading_exec(self) -> tuple[list[str], dict[str, str], bytes | None]:
        """The argv, env and stdin of the unit-tests verifier's ``bash -c`` grading command."""
        return next(e for e in self.execs if e[0][:2] == ["bash", "-c"] and len(e[0]) > 9)

    # -- the tree (used by FakeShell) -------------------------------------------------

    def kind(self, path: str) -> str | None:
        """``file``, ``sparse``, ``fifo``, ``link``, ``dir`` or None (absent); links are not followed."""
        if path in self.files:
            return "file"
        if path in self.sparse:
            return "sparse"
        if path in self.fifos:
            return "fifo"
        if path in self.links:
            return "link"
        if path in self.dirs or path == "/":
            return "dir"
        prefix = path.rstrip("/") + "/"
        return "dir" if any(p.startswith(prefix) for p in self._all_paths()) else None

    def follow(self, path: str) -> str:
        for _ in range(40):
            if path not in self.links:
                return path
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), self.links[path]))
        raise SandboxError(f"{path}: too many levels of symbolic links")

    def size(self, path: str) -> int:
        return {"file": lambda: len(self.files[path]), "sparse": lambda: self.sparse[path],
                "link": lambda: len(self.links[path])}.get(self.kind(path) or "", lambda: 0)()

    def put(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Create or replace a regular file (parents made); ``mode=None`` keeps an existing file's mode."""
        if self.kind(path) == "dir":
            raise SandboxError(f"{path}: is a directory")
        old = self.modes.get(path, 0o644) if path in self.files or path in self.sparse else 0o644
        self.remove(path)
        self.files[path] = data
        self.modes[path] = old if mode is None else mode
        self.dirs.update(parents(path))

    def remove(self, path: str) -> None:
        """Delete ``path`` and everything under it."""
        prefix = path.rstrip("/") + "/"
        stores: tuple[dict[str, Any], ...] = (self.files, self.modes, self.links, self.sparse)
        for store in stores:
            for p in [p for p in store if p == path or p.startswith(prefix)]:
                del store[p]
        for group in (self.dirs, self.fifos):
            group.difference_update({p for p in group if p == path or p.startswith(prefix)})

    def load(self, tree: _Tree) -> None:
        """Replace the whole tree by a copy of ``tree`` (restore, apply, reset)."""
        fresh = copy.deepcopy(tree)
        with self._lock:
            for name in ("files", "modes", "dirs", "links", "fifos", "sparse"):
                mine = getattr(self, name)
                mine.clear()
                mine.update(getattr(fresh, name))

    # -- internals --------------------------------------------------------------------

    def _alive(self) -> None:
        if self.killed:
            raise SandboxLost(f"sandbox {self._id} was killed")
        if self.closed:
            raise SandboxLost(f"sandbox {self._id} is closed")

    def _abs(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self._spec.workdir, path))

    def _tree(self) -> _Tree:
        return _Tree(self.files, self.modes, self.dirs, self.links, self.fifos, self.sparse)

    def _all_paths(self) -> Iterator[str]:
        yield from itertools.chain(self.files, self.sparse, self.fifos, self.links, self.dirs)

    def _entry(self, path: str) -> FileEntry:
        kind = self.kind(path)
        if kind == "dir":
            return FileEntry(path, 0, True, 0o755)
        if kind == "link":
            return FileEntry(path, self.size(path), False, 0o777, is_symlink=True)
        return FileEntry(path, self.size(path), False, self.modes.get(path, 0o644))


class FakeBackend:
    """Makes ``FakeSandbox``es; records what it was asked to do (``made``, ``restored``, ``applied``, ``resets``).

    ``create_delay`` slows every start; ``fail`` makes every ``create`` raise ``SandboxError(fail)``.
    ``applies_snapshots`` adds ``apply_snapshot`` (``SnapshotApplier``); ``resettable`` adds ``reset``
    (``ResettableBackend``), which takes ``reset_delay`` and refuses (returns False) when
    ``refuse_reset(sandbox)`` says so. ``handler`` is given to every sandbox it makes.
    """

    name = "fake"
    apply_snapshot: Callable[[FakeSandbox, SnapshotRef], None]
    reset: Callable[..., bool]

    def __init__(
        self,
        *,
        create_delay: float = 0.0,
        fail: str | None = None,
        applies_snapshots: bool = False,
        resettable: bool = False,
        reset_delay: float = 0.0,
        refuse_reset: Callable[[FakeSandbox], bool] | None = None,
        handler: Handler | None = None,
    ) -> None:
        self.create_delay, self.fail, self.handler = create_delay, fail, handler
        self.reset_delay, self.refuse_reset = reset_delay, refuse_reset
        self.made: list[FakeSandbox] = []
        self.restored: list[str] = []
        self.applied: list[tuple[str, str]] = []
        self.resets: list[str] = []
        self._lock = threading.Lock()
        if applies_snapshots:
            self.apply_snapshot = self._apply_snapshot
        if resettable:
            self.reset = self._reset

    def create(self, spec: SandboxSpec) -> FakeSandbox:
        return self._new(spec, None)

    def restore(self, ref: SnapshotRef) -> FakeSandbox:
        tree = _stored(ref)
        sandbox = self._new(ref.spec, ref)
        sandbox.load(tree)
        with self._lock:
            self.restored.append(ref.id)
        return sandbox

    def fork(self, ref: SnapshotRef, n: int) -> list[FakeSandbox]:
        if n < 1:
            raise SpecError(f"fork needs n >= 1, got {n}")
        return [self.restore(ref) for _ in range(n)]

    def close(self) -> None:
        with self._lock:
            made = list(self.made)
        for sandbox in made:
            sandbox.close()

    def kill(self, sandbox: FakeSandbox) -> None:
        sandbox.kill()

    def open_count(self) -> int:
        return sum(not s.closed for s in self.made)

    def _new(self, spec: SandboxSpec, origin: SnapshotRef | None) -> FakeSandbox:
        time.sleep(self.create_delay)
        if self.fail:
            raise SandboxError(self.fail)
        sandbox = FakeSandbox(spec=spec, backend=self, origin=origin, handler=self.handler)
        with self._lock:
            self.made.append(sandbox)
        return sandbox

    def _apply_snapshot(self, sandbox: FakeSandbox, ref: SnapshotRef) -> None:
        sandbox._alive()
        sandbox.load(_stored(ref))
        sandbox._origin = ref
        with self._lock:
            self.applied.append((sandbox.id, ref.id))

    def _reset(self, sandbox: FakeSandbox, timeout: float | None = None) -> bool:
        time.sleep(self.reset_delay)
        with self._lock:
            self.resets.append(sandbox.id)
        if sandbox.closed or sandbox.killed or (self.refuse_reset is not None and self.refuse_reset(sandbox)):
            return False
        sandbox.load(_pristine_tree(sandbox.spec))
        sandbox._origin = None
        return True


def _stored(ref: SnapshotRef) -> _Tree:
    with _snapshots_lock:
        tree = _snapshots.get(ref.id)
    if tree is None:
        raise SnapshotError(f"snapshot {ref.id} ({ref.kind.value}) was not made by a fake sandbox in this process")
    return tree


__all__ = ["FakeBackend", "FakeSandbox", "FakeShell", "Handler"]
