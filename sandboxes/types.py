"""The sandbox contract: specs, results, snapshot references and the two protocols.

A *sandbox* is one isolated place where an agent's commands run: a Docker
container (``DockerBackend``) or a private directory with subprocesses
(``LocalBackend``). A *backend* makes sandboxes: ``create`` from a spec,
``restore`` from a snapshot, ``fork`` N independent copies of a snapshot.

Two promises hold for every backend, and the contract tests check both:

* nothing hangs without a deadline: ``exec`` kills the command and all its
  children when ``timeout`` passes and returns ``timed_out=True``; every other
  call raises ``SandboxTimeout`` past its own deadline;
* a sandbox that died under us raises ``SandboxLost`` (never a bare
  ``docker.errors.*`` or ``OSError`` from the transport).

Snapshots come in two kinds (see ``SnapshotKind``); both capture files, neither
captures running processes.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_EXEC_TIMEOUT_S = 60.0
DEFAULT_OUTPUT_LIMIT = 1 << 20  # bytes kept per stream; the rest is drained and dropped
READ_LIMIT = 64 << 20  # the most ``read_file`` returns unless the caller passes a larger ``limit``


GATEWAY_MOUNT = "/run/agentenv-gateway"  # where ``SandboxSpec.gateway_dir`` appears inside the sandbox
GATEWAY_SOCKET = "gw.sock"  # the gateway's Unix socket, in GATEWAY_MOUNT
GATEWAY_FORWARD_PORT = 8787  # where a native program finds the gateway inside the sandbox (loopback only)
# Where the native programs live in their images (sandboxes.native_images); the path keeps its "cli" spelling, which
# is hashed into the images' tags, so images built before the rename to "native" stay valid.
NATIVE_INSTALL_DIR = "/opt/agentenv-cli"


class SandboxSpec(BaseModel):
    """What a sandbox is made of. Loaded from task files, so it is pydantic.

    ``user=None`` means "the image's non-root user ``agent`` if it has one,
    else the image's default user". ``network=False`` (the default) gives the
    container no network interface but loopback. ``runtime`` is handed to the
    engine as is (``runsc`` for gVisor, ``kata``): the isolation tier is the
    runtime's, not ours.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(min_length=1, description="image reference, e.g. agentenv-base:latest")
    cpus: float = Field(default=1.0, gt=0, le=256, description="CPU quota in cores")
    memory_mb: int = Field(default=1024, ge=16, description="memory limit (MiB); swap is not added")
    pids: int = Field(default=256, ge=8, description="max processes/threads in the sandbox")
    disk_mb: int | None = Field(default=None, ge=16, description="writable-layer size (MiB), enforced or refused (SpecError), never ignored")
    network: bool = Field(default=False, description="give the sandbox a network (off by default)")
    user: str | None = Field(default=None, description="user to run as; None = 'agent' if present")
    workdir: str = Field(default="/workspace", description="absolute working directory, created if missing")
    env: dict[str, str] = Field(default_factory=dict, description="environment for every command")
    runtime: str | None = Field(default=None, description="container runtime name (runc, runsc, kata)")
    tmpfs_mb: int = Field(default=256, ge=0, description="size of the /tmp tmpfs; 0 keeps /tmp on the image fs")
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, ge=1024, description="bytes kept per stream per exec")
    gateway_dir: str | None = Field(
        default=None,
        description="host folder holding a model gateway's Unix socket, bind-mounted read-only at GATEWAY_MOUNT "
        "(off by default; the network stays off: see docs/sandboxes.md, 'The model gateway socket')",
    )

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"workdir must be an absolute path, got {v!r}")
        return v.rstrip("/") or "/"

    def key(self) -> str:
        """A stable string naming this spec, used to key warm pools and caches."""
        return self.model_dump_json()


@dataclass(frozen=True)
class ExecResult:
    """What one command did.

    ``exit_code`` follows the shell: 0..255 from the process, ``128 + N`` when
    it died of signal N, ``124`` when it was killed for passing its deadline
    (then ``timed_out`` is true). ``truncated`` is true when either stream was
    longer than the spec's ``output_limit`` and its tail was dropped.
    ``oom_killed`` is true when the kernel's OOM killer ended a process of this
    command (memory limit reached).
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class FileEntry:
    """One entry of ``Sandbox.list_files``; ``path`` is absolute inside the sandbox."""

    path: str
    size: int
    is_dir: bool
    mode: int
    is_symlink: bool = False


class SnapshotKind(str, enum.Enum):
    """How a snapshot is taken; both capture files only, never processes.

    * ``IMAGE``: ``docker commit`` of the whole writable layer into an image
      that outlives every container (can be tagged and pushed). Slow (the
      container is paused and a layer written) but durable. Long lineages are
      re-based (flattened) before the overlay layer limit is reached.
    * ``FAST``: the set of paths that differ from the sandbox's base image
      (added, changed, deleted), packed as one tar blob held by the backend.
      Restoring starts from a pristine container of the base image (warm when
      a pool has one) and applies the blob. Every fast snapshot is a full
      diff against the base image, so lineages never grow a chain.
    """

    IMAGE = "image"
    FAST = "fast"


@dataclass(frozen=True)
class SnapshotRef:
    """A handle on a snapshot. Plain data: it pickles and round-trips JSON.

    ``base_image`` is the image the snapshot's diff applies to (for ``IMAGE``
    snapshots it is the committed image itself). ``location`` is backend
    specific: an image id for ``IMAGE``, a blob path for ``FAST``.
    """

    id: str
    kind: SnapshotKind
    backend: str
    base_image: str
    location: str
    spec: SandboxSpec
    parent: str | None = None
    depth: int = 0
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "backend": self.backend,
            "base_image": self.base_image,
            "location": self.location,
            "spec": self.spec.model_dump(),
            "parent": self.parent,
            "depth": self.depth,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> SnapshotRef:
        raw = dict(data)
        raw["kind"] = SnapshotKind(raw["kind"])
        raw["spec"] = SandboxSpec.model_validate(raw["spec"])
        return cls(**raw)  # type: ignore[arg-type]


@runtime_checkable
class Sandbox(Protocol):
    """One live sandbox. Not thread-safe across calls unless the backend says so."""

    @property
    def id(self) -> str: ...

    @property
    def spec(self) -> SandboxSpec: ...

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a shell string, or an argv list run without a shell).

        ``timeout`` defaults to ``DEFAULT_EXEC_TIMEOUT_S``; when it passes the
        command's whole process group is killed and ``timed_out`` is set.
        ``cwd`` defaults to the spec's workdir; ``env`` is added on top of the
        spec's env.
        """
        ...

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        """Bytes of a file; ``SandboxFileNotFound`` if missing.

        ``limit`` (bytes; None = the backend's own cap, ``READ_LIMIT``) refuses a larger file
        with ``SandboxFileTooLarge`` before reading it, so a huge file cannot exhaust memory.
        """
        ...

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Create or replace a file, creating parent directories.

        ``mode=None`` keeps the mode of a file that exists (an edit must not strip a
        script's execute bit) and gives a new file 0644.
        """
        ...

    def list_files(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        """Entries under a directory, sorted by path."""
        ...

    def snapshot(self, kind: SnapshotKind = SnapshotKind.FAST, *, tag: str | None = None) -> SnapshotRef:
        """Capture the files of this sandbox; see ``SnapshotKind``."""
        ...

    def close(self) -> None:
        """Destroy the sandbox. Idempotent; never raises for an already-dead one."""
        ...


@runtime_checkable
class SandboxBackend(Protocol):
    """Makes sandboxes. ``name`` is recorded on every ``SnapshotRef`` it makes."""

    name: str

    def create(self, spec: SandboxSpec) -> Sandbox: ...

    def restore(self, ref: SnapshotRef) -> Sandbox: ...

    def fork(self, ref: SnapshotRef, n: int) -> Sequence[Sandbox]: ...

    def close(self) -> None:
        """Destroy every sandbox this backend made and still holds."""
        ...


@runtime_checkable
class Quiescable(Protocol):
    """A sandbox that can stop everything of an episode but its files, in place (grading in place)."""

    def quiesce(self, timeout: float | None = None) -> str | None:
        """None once nothing of the episode runs and the scratch mounts are empty, else why not."""
        ...


@runtime_checkable
class ResettableBackend(Protocol):
    """A backend that can bring a released sandbox back to its image's pristine state in place."""

    def reset(self, sandbox: Sandbox, timeout: float | None = None) -> bool:
        """True only when exact; False (never an exception) means: destroy it."""
        ...


@runtime_checkable
class SnapshotApplier(Protocol):
    """A backend that can bring a pristine warm sandbox to a FAST snapshot without a new one."""

    def apply_snapshot(self, sandbox: Sandbox, ref: SnapshotRef) -> None: ...


@runtime_checkable
class LabelledBackend(Protocol):
    """A backend on a container engine whose sandboxes carry ``run_id``'s owner labels (see ``sandboxes.labels``).

    A pool sweeps the run's leftover sandboxes of a dead worker through ``client`` (``sandboxes.reaper.gc``).
    """

    client: Any
    run_id: str


def runs_images(backend: object) -> bool:
    """Whether ``backend`` starts sandboxes from images, so a task's image must be built first.

    The local backend runs commands on the host's file system under bubblewrap (or plainly), with
    no image: building one there would need a Docker daemon it does not have.
    """
    return getattr(backend, "name", "") != "local"


__all__ = [
    "GATEWAY_FORWARD_PORT",
    "GATEWAY_MOUNT",
    "GATEWAY_SOCKET",
    "NATIVE_INSTALL_DIR",
    "DEFAULT_EXEC_TIMEOUT_S",
    "LabelledBackend",
    "Quiescable",
    "ResettableBackend",
    "SnapshotApplier",
    "DEFAULT_OUTPUT_LIMIT",
    "READ_LIMIT",
    "ExecResult",
    "FileEntry",
    "Sandbox",
    "SandboxBackend",
    "SandboxSpec",
    "SnapshotKind",
    "SnapshotRef",
    "runs_images",
]
