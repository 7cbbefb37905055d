"""Docker sandboxes: hardened containers driven through an in-container agent.

A sandbox is one container whose main process idles (``sleep infinity`` under
Docker's init, running as root so the sandbox user cannot kill it).
Before start, ``sandboxes/agent.py`` is copied in with ``put_archive``; after
start ONE ``docker exec`` runs it as root, and every command and file
operation goes through that channel (about 3 ms per command instead of tens
of ms per ``docker exec``), executed as the sandbox user.

The trust boundary: the container keeps only the capabilities the agent
needs to act for the sandbox user (``AGENT_CAPS``: SETUID, SETGID to run
commands as that user, KILL to end them, CHOWN, FOWNER, DAC_OVERRIDE to
restore any file on reset). Root's processes are the only ones holding them;
the sandbox user cannot gain them (``no-new-privileges``: no setuid binary,
no file capabilities), cannot signal, trace or read the fds of a root
process, and cannot write the agent's files. The channel is authenticated
(``sandboxes.channel``): a forged answer marks the sandbox ``compromised``,
and a compromised or untrusted sandbox (its user is root, or the agent runs
from paths that user may write) is never reset in place nor graded in place. Images without ``python3`` fall back to a plain
``docker exec`` per command (``timeout`` kills the process group) and archive
calls for files; FAST snapshots then are not available.

Secure by default (each can be loosened only through ``SandboxSpec``):
network ``none`` unless ``spec.network``; every capability dropped;
``no-new-privileges``; pids, memory (swap = 0 extra) and CPU limits; an init
process; the image's ``agent`` user when it has one. ``spec.disk_mb`` is
applied with ``storage_opt`` on drivers that support a per-container size
(overlay2 on xfs with pquota, btrfs, zfs, devicemapper), and on
fuse-overlayfs by a size-limited filesystem mounted on the container's layer
directory (``sandboxes.disk_limit``); where neither works the spec is refused
with ``SpecError``, never accepted silently. What this does NOT protect against: kernel exploits
(use ``runtime="runsc"`` for a gVisor tier), CPU-time side channels, and
anything the chosen runtime itself allows.
"""

from __future__ import annotations

import io
import json
import logging
import posixpath
import secrets
import tarfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests

from sandboxes import disk_limit, labels
from sandboxes.channel import AGENT_DIR, AGENT_PATH, AgentChannel, ChannelBroken, ChannelForged, agent_error
from sandboxes.disk_limit import DiskLimit
from sandboxes.docker_plain import PlainExec
from sandboxes.docker_reset import DEFAULT_RESET_TIMEOUT_S, quiesce_sandbox, reset_sandbox
from sandboxes.docker_snapshots import DockerSnapshots
from sandboxes.errors import (
    DaemonUnavailable,
    ImageNotFound,
    SandboxError,
    SandboxLost,
    SandboxTampered,
    SandboxTimeout,
    SpecError,
)
from sandboxes.types import (
    DEFAULT_EXEC_TIMEOUT_S,
    GATEWAY_MOUNT,
    READ_LIMIT,
    ExecResult,
    FileEntry,
    SandboxSpec,
    SnapshotKind,
    SnapshotRef,
)

log = logging.getLogger(__name__)

NAME = "docker"
CALL_GRACE_S = 10.0  # the agent enforces exec deadlines; this only bounds a stuck agent
FILE_TIMEOUT_S = 60.0
START_TIMEOUT_S = 30.0
PYTHON_PATHS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
QUOTA_DRIVERS = {"overlay2", "btrfs", "zfs", "devicemapper"}
# What the root agent needs to act for the sandbox user; nothing else (no MKNOD, NET_RAW, SYS_*).
AGENT_CAPS = ["SETUID", "SETGID", "KILL", "CHOWN", "FOWNER", "DAC_OVERRIDE"]
_AGENT_SOURCE = (Path(__file__).with_name("agent.py")).read_bytes()

T = TypeVar("T")


def daemon_call(what: str, fn: Callable[[], T]) -> T:
    """Run one Docker API call, turning transport failures into ``DaemonUnavailable``."""
    try:
        return fn()
    except docker.errors.ImageNotFound as exc:
        raise ImageNotFound(f"{what}: image not present locally (nothing is pulled): {exc}") from exc
    except (requests.exceptions.ConnectionError, ConnectionError) as exc:
        raise DaemonUnavailable(f"{what}: cannot reach the Docker daemon: {exc}") from exc
    except docker.errors.DockerException as exc:
        if not isinstance(exc, docker.errors.APIError):
            raise DaemonUnavailable(f"{what}: cannot reach the Docker daemon: {exc}") from exc
        raise


@dataclass
class ImageFacts:
    """What a sandbox needs to know about an image, probed once per image id."""

    image_id: str
    config: dict[str, Any]
    users: dict[str, tuple[int, int]]  # name -> (uid, gid) from /etc/passwd
    python: str | None
    dirs: dict[str, bool] = field(default_factory=dict)  # absolute path -> exists in the image

    def default_user(self, spec: SandboxSpec) -> str:
        if spec.user:
            return spec.user
        if "agent" in self.users:
            return "agent"
        return str(self.config.get("User") or "0")

    def ids_of(self, user: str) -> tuple[int, int]:
        name, _, group = user.partition(":")
        uid, gid = self.users.get(name, (int(name), 0) if name.isdigit() else (0, 0))
        return uid, int(group) if group.isdigit() else gid


class DockerSandbox:
    """One container. Thread-safe: the agent channel serialises calls.

    ``base_image`` is the image the container was created from: a FAST
    snapshot of it is the full diff against that image.
    """

    def __init__(
        self, backend: DockerBackend, container: Any, spec: SandboxSpec, facts: ImageFacts, base_image: str
    ) -> None:
        self._backend = backend
        self._container = container
        self._spec = spec
        self.facts = facts
        self.base_image = base_image
        self.user = facts.default_user(spec)
        self.lineage: tuple[str | None, int] = (None, 0)  # (parent snapshot id, depth)
        self.last_reset_refusal: str | None = None  # why the last ``reset`` refused, for logs and tests
        self.compromised: str | None = None  # set once an answer failed authentication; never cleared
        self.disk_limit: DiskLimit | None = None
        self._closed = False
        self._channel: AgentChannel | None = None
        self._plain: PlainExec | None = None
        uid, gid = facts.ids_of(self.user)
        self.user_ids = (uid, gid)
        # No boundary when the sandbox user is root: it could signal and trace the agent.
        self.untrusted: str | None = "the sandbox user is root" if uid == 0 else None
        if facts.python:
            self._channel = AgentChannel(
                backend.client.api, container.id, user="0:0", python=facts.python,
                sandbox_user=None if uid == 0 else (uid, gid), pids_limit=spec.pids,
            )
        else:
            self._plain = PlainExec(backend.client.api, container, user=self.user, lost=self._lost)

    # -- identity ---------------------------------------------------------------

    @property
    def id(self) -> str:
        return str(self._container.name)

    @property
    def container_id(self) -> str:
        return str(self._container.id)

    @property
    def spec(self) -> SandboxSpec:
        return self._spec

    @property
    def container(self) -> Any:
        return self._container

    @property
    def has_agent(self) -> bool:
        return self._channel is not None

    @property
    def trusted(self) -> bool:
        """Whether the trust boundary holds: an agent the sandbox user cannot reach, never forged."""
        return self._channel is not None and self.untrusted is None and self.compromised is None

    def alive(self) -> bool:
        """True while the container exists and runs."""
        if self._closed:
            return False
        try:
            self._container.reload()
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return False
        return bool(self._container.status == "running")

    # -- the Sandbox protocol -----------------------------------------------------

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        timeout = DEFAULT_EXEC_TIMEOUT_S if timeout is None else float(timeout)
        workdir = self.resolve(cwd or self._spec.workdir)
        if self._plain is not None:
            return self._plain.exec(cmd, timeout=timeout, cwd=workdir, env=env, stdin=stdin, limit=self._spec.output_limit)
        req = {
            "op": "exec",
            "cmd": cmd if isinstance(cmd, str) else list(cmd),
            "cwd": workdir,
            "env": dict(env or {}),
            "timeout": timeout,
            "limit": self._spec.output_limit,
        }
        try:
            head, body = self.agent_call(req, stdin or b"", timeout=timeout + CALL_GRACE_S, retry=False)
        except _AgentRestarted as exc:
            # The command killed the agent (``kill -9 -1`` as the sandbox user, or the
            # OOM killer's choice): a bad command is data, not a crash.
            return ExecResult(exit_code=137, stdout="", stderr=f"sandbox agent died during the command: {exc}\n")
        n = int(head["stdout_len"])
        return ExecResult(
            exit_code=int(head["exit_code"]),
            stdout=body[:n].decode(errors="replace"),
            stderr=body[n:].decode(errors="replace"),
            timed_out=bool(head["timed_out"]),
            truncated=bool(head["truncated"]),
            duration_s=float(head["duration_s"]),
            oom_killed=bool(head["oom_killed"]),
        )

    def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        path = self.resolve(path)
        cap = READ_LIMIT if limit is None else int(limit)
        if self._plain is not None:
            return self._plain.read_file(path, limit=cap)
        _, body = self.agent_call({"op": "read_file", "path": path, "limit": cap}, timeout=FILE_TIMEOUT_S)
        return body

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        path = self.resolve(path)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if self._plain is not None:
            self._plain.write_file(path, raw, mode=mode, owner=self.facts.ids_of(self.user))
            return
        self.agent_call({"op": "write_file", "path": path, "mode": mode}, raw, timeout=FILE_TIMEOUT_S)

    def list_files(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        path = self.resolve(path)
        if self._plain is not None:
            return self._plain.list_files(path, recursive=recursive)
        _, body = self.agent_call({"op": "list_files", "path": path, "recursive": recursive}, timeout=FILE_TIMEOUT_S)
        return [FileEntry(**e) for e in json.loads(body)]

    def snapshot(self, kind: SnapshotKind = SnapshotKind.FAST, *, tag: str | None = None) -> SnapshotRef:
        if self._closed:
            raise self._lost("snapshot() after close()")
        try:
            return self._backend.snapshots.take(self, kind, tag=tag)
        except docker.errors.NotFound as exc:
            raise self._lost(f"the container vanished during the snapshot: {exc.explanation}") from exc

    def reset(self, timeout: float | None = None) -> bool:
        """Back to the base image's pristine state in place; see ``DockerBackend.reset``."""
        return self._backend.reset(self, timeout=timeout)

    def quiesce(self, timeout: float | None = None) -> str | None:
        """Kill the episode's processes and empty scratch mounts, keeping the files; see ``quiesce_sandbox``."""
        return quiesce_sandbox(self, DEFAULT_RESET_TIMEOUT_S if timeout is None else timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._channel is not None:
            self._channel.close()
        try:
            self._container.remove(force=True)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            pass  # already gone, or the daemon is: the reaper finds it by its labels
        if self.disk_limit is not None:
            self.disk_limit.release()  # a no-op after a remove that worked: Docker unmounts it
        self._backend._forget(self)

    # -- plumbing used by the backend and the snapshot code ---------------------------

    def resolve(self, path: str) -> str:
        """An absolute, normalised path; relative ones are taken from the workdir."""
        return posixpath.normpath(posixpath.join(self._spec.workdir, path))

    def open_agent(self) -> None:
        if self._channel is None:
            return
        try:
            ping = self._channel.open(timeout=START_TIMEOUT_S)
        except ChannelForged as exc:
            self._mark_compromised(str(exc))
            raise SandboxTampered(f"sandbox {self.id}: agent start: {exc}") from exc
        except ChannelBroken as exc:
            raise self._lost(f"agent did not start: {exc}") from exc
        except docker.errors.APIError as exc:
            raise self._lost(f"cannot exec the agent: {exc}") from exc
        if self.untrusted is None and ping.get("untrusted_paths"):
            self.untrusted = f"the agent runs from paths the sandbox user may write: {ping['untrusted_paths'][:5]}"
            log.warning("sandbox %s: %s", self.id, self.untrusted)
        if self.untrusted is None and ping.get("user_uid") != self.user_ids[0]:
            self.untrusted = f"the agent did not take the sandbox user (uid {ping.get('user_uid')})"

    def _mark_compromised(self, why: str) -> None:
        if self.compromised is None:
            self.compromised = why
            log.warning("sandbox %s is compromised: %s", self.id, why)

    def agent_call(
        self, req: Mapping[str, Any], payload: bytes = b"", *, timeout: float, retry: bool = True
    ) -> tuple[dict[str, Any], bytes]:
        """One request to the agent; raise the typed error of a failed answer.

        A broken channel in a running container means only the agent died: it is
        restarted, and the request repeated when ``retry`` (file operations are
        idempotent; commands are not, so ``exec`` gets ``_AgentRestarted``).
        """
        if self._closed:
            raise SandboxLost(f"sandbox {self.id} is closed")
        assert self._channel is not None
        if self.compromised is not None:
            raise SandboxTampered(f"sandbox {self.id} is compromised ({self.compromised}); it takes no more requests")
        for attempt in (0, 1):
            try:
                head, body = self._channel.call(req, payload, timeout=timeout)
                break
            except ChannelForged as exc:
                self._mark_compromised(str(exc))
                raise SandboxTampered(f"sandbox {self.id}: {exc}") from exc
            except ChannelBroken as exc:
                if not self.alive():
                    raise self._lost(str(exc)) from exc
                if exc.timed_out and req.get("op") != "exec":
                    self._restart_agent()
                    raise SandboxTimeout(f"sandbox {self.id}: {req.get('op')} passed its {timeout:.0f}s deadline") from exc
                self._restart_agent()
                if not retry or attempt:
                    raise _AgentRestarted(str(exc)) from exc
        if not head.get("ok"):
            raise agent_error(head, f"sandbox {self.id}: {req.get('op')} {req.get('path', '')}".rstrip())
        return head, body

    def _restart_agent(self) -> None:
        assert self._channel is not None
        self._channel.close()
        self.open_agent()

    def _lost(self, why: str) -> SandboxLost:
        state = "closed" if self._closed else self._container.status
        return SandboxLost(f"sandbox {self.id} (container {self.container_id[:12]}, state {state}) is lost: {why}")


class _AgentRestarted(SandboxError):
    """Internal: the agent died mid-request and was restarted."""


class DockerBackend:
    """Makes Docker sandboxes. ``close()`` removes every container it still holds.

    Usage::

        backend = DockerBackend()
        sb = backend.create(SandboxSpec(image="agentenv-base:latest"))
        print(sb.exec("echo hi").stdout)
        ref = sb.snapshot()                      # FAST by default
        a, b = backend.fork(ref, 2)              # independent copies
        backend.close()
    """

    name = NAME

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        run_id: str | None = None,
        snapshot_dir: Path | None = None,
        base_url: str | None = None,
    ) -> None:
        """``client`` wins over ``base_url``; with neither, the environment's daemon (``DOCKER_HOST``)."""
        if client is None:
            if base_url is not None:
                client = daemon_call(base_url, lambda: docker.DockerClient(base_url=base_url, timeout=120))
            else:
                client = daemon_call("docker.from_env", lambda: docker.from_env(timeout=120))
        self.client = client
        info = daemon_call("docker info", self.client.info)
        self.storage_driver = str(info.get("Driver", ""))
        self.run_id = run_id or labels.current_run_id()
        self.snapshots = DockerSnapshots(self, snapshot_dir)
        self._facts: dict[str, ImageFacts] = {}
        self._live: dict[str, DockerSandbox] = {}
        self._lock = threading.Lock()

    # -- the backend protocol --------------------------------------------------------

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        return self.start(spec, spec.image)

    def restore(self, ref: SnapshotRef) -> DockerSandbox:
        return self.snapshots.restore(ref)

    def fork(self, ref: SnapshotRef, n: int) -> list[DockerSandbox]:
        """``n`` independent sandboxes at ``ref`` (started in parallel)."""
        if n < 1:
            raise SpecError(f"fork: n must be >= 1, got {n}")
        with ThreadPoolExecutor(max_workers=min(n, 4)) as pool:
            futures = [pool.submit(self.restore, ref) for _ in range(n)]
            made, errors = [], []
            for f in futures:
                try:
                    made.append(f.result())
                except Exception as exc:  # collect, then undo the ones that worked
                    errors.append(exc)
        if errors:
            for sb in made:
                sb.close()
            raise errors[0]
        return made

    def apply_snapshot(self, sandbox: DockerSandbox, ref: SnapshotRef) -> None:
        """Bring a pristine sandbox of ``ref.base_image`` to the FAST snapshot ``ref``."""
        self.snapshots.apply(sandbox, ref)

    def reset(self, sandbox: DockerSandbox, timeout: float | None = None) -> bool:
        """Bring a live sandbox back to its base image's pristine state without a new container.

        True only when exact (no sandbox-user process but the agent; every changed path
        byte-identical to the base image's; scratch mounts empty; lineage reset: the full
        guarantee is in ``sandboxes/docker_reset.py``). False, never an exception, when
        anything cannot be restored by the sandbox user or checked (``last_reset_refusal``
        says why): the caller must then destroy it. A pristine snapshot is not re-applied.
        """
        return reset_sandbox(sandbox, DEFAULT_RESET_TIMEOUT_S if timeout is None else timeout)

    def close(self) -> None:
        with self._lock:
            live = list(self._live.values())
        for sb in live:
            sb.close()

    def __enter__(self) -> DockerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- making containers -------------------------------------------------------------

    def start(self, spec: SandboxSpec, image: str) -> DockerSandbox:
        """Create, prepare and start a container of ``image`` shaped by ``spec``."""
        image_obj = daemon_call(f"image {image}", lambda: self.client.images.get(image))
        name = f"agentenv-{self.run_id}-{secrets.token_hex(4)}"
        kwargs: dict[str, Any] = dict(
            image=image_obj.id,
            entrypoint=["sleep"],
            command=["infinity"],
            name=name,
            user="0:0",  # only the idle main process; commands run as the sandbox user
            working_dir=spec.workdir,
            environment=dict(spec.env),
            labels=labels.owner_labels(self.run_id),
            network_mode=None if spec.network else "none",
            cap_drop=["ALL"],
            cap_add=list(AGENT_CAPS),
            security_opt=["no-new-privileges"],
            pids_limit=spec.pids,
            mem_limit=f"{spec.memory_mb}m",
            memswap_limit=f"{spec.memory_mb}m",
            nano_cpus=int(spec.cpus * 1e9),
            init=True,
            detach=True,
        )
        if spec.runtime:
            kwargs["runtime"] = spec.runtime
        if spec.tmpfs_mb > 0:
            kwargs["tmpfs"] = {"/tmp": f"rw,exec,nosuid,nodev,size={spec.tmpfs_mb}m,mode=1777"}
        if spec.gateway_dir is not None:  # a model gateway's socket folder, read-only (issue 16)
            kwargs["volumes"] = {str(spec.gateway_dir): {"bind": GATEWAY_MOUNT, "mode": "ro"}}
        if spec.disk_mb is not None and self.storage_driver in QUOTA_DRIVERS:
            kwargs["storage_opt"] = {"size": f"{spec.disk_mb}M"}
        known = self._facts.get(image_obj.id)
        if known is not None and known.ids_of(known.default_user(spec))[0] == 0:
            del kwargs["cap_add"]  # a root sandbox user would hold them: no boundary, so no capabilities
        container = daemon_call(f"create {image}", lambda: self.client.containers.create(**kwargs))
        limit: DiskLimit | None = None
        try:
            facts = self._image_facts(image_obj, container, spec.workdir)
            if "cap_add" in kwargs and facts.ids_of(facts.default_user(spec))[0] == 0:
                container.remove(force=True)
                del kwargs["cap_add"]
                container = daemon_call(f"create {image}", lambda: self.client.containers.create(**kwargs))
                facts = self._image_facts(image_obj, container, spec.workdir)
            if spec.disk_mb is not None and self.storage_driver not in QUOTA_DRIVERS:
                limit = disk_limit.attach(container, spec.disk_mb)  # SpecError where it cannot be enforced
            sb = DockerSandbox(self, container, spec, facts, base_image=image)
            sb.disk_limit = limit
            archive = self._prepare_archive(sb)
            daemon_call("put_archive", lambda: container.put_archive("/", archive))
            daemon_call(f"start {name}", container.start)
            container.reload()
            sb.open_agent()
        except BaseException:
            try:
                container.remove(force=True)
            except docker.errors.DockerException:
                pass
            if limit is not None:
                limit.release()
            raise
        with self._lock:
            self._live[sb.id] = sb
        return sb

    def _forget(self, sb: DockerSandbox) -> None:
        with self._lock:
            self._live.pop(sb.id, None)

    def _image_facts(self, image: Any, container: Any, workdir: str) -> ImageFacts:
        """Users, python3 and the workdir of an image, read once from a created container."""
        facts = self._facts.get(image.id)
        if facts is None:
            users: dict[str, tuple[int, int]] = {}
            passwd = read_archive_file(container, "/etc/passwd")
            for line in (passwd or b"").decode(errors="replace").splitlines():
                parts = line.split(":")
                if len(parts) >= 4 and parts[2].isdigit() and parts[3].isdigit():
                    users[parts[0]] = (int(parts[2]), int(parts[3]))
            python = next((p for p in PYTHON_PATHS if path_exists(container, p)), None)
            facts = ImageFacts(image.id, dict(image.attrs.get("Config") or {}), users, python)
            self._facts[image.id] = facts
        if workdir not in facts.dirs:
            facts.dirs[workdir] = path_exists(container, workdir)
        return facts

    def _prepare_archive(self, sb: DockerSandbox) -> bytes:
        """The tar put before start: the agent, and the workdir owned by the user if missing."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            if sb.facts.python:
                tar.addfile(_tar_dir(AGENT_DIR.lstrip("/"), 0o755, (0, 0)))
                info = tarfile.TarInfo(AGENT_PATH.lstrip("/"))
                info.size, info.mode = len(_AGENT_SOURCE), 0o644
                tar.addfile(info, io.BytesIO(_AGENT_SOURCE))
            if not sb.facts.dirs.get(sb.spec.workdir) and sb.spec.workdir != "/":
                tar.addfile(_tar_dir(sb.spec.workdir.lstrip("/"), 0o755, sb.facts.ids_of(sb.user)))
        return buf.getvalue()


def _tar_dir(name: str, mode: int, owner: tuple[int, int]) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    info.uid, info.gid = owner
    return info


def path_exists(container: Any, path: str) -> bool:
    """Whether ``path`` exists in a (created or running) container, via a HEAD on its archive."""
    api = container.client.api
    res = api.head(api._url("/containers/{0}/archive", container.id), params={"path": path})
    return bool(res.status_code == 200)


def read_archive_file(container: Any, path: str) -> bytes | None:
    """One regular file's bytes through ``get_archive``; None when it is missing."""
    try:
        stream, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.next()
        f = tar.extractfile(member) if member is not None else None
        return f.read() if f is not None else None


__all__ = ["DockerBackend", "DockerSandbox", "ImageFacts", "daemon_call"]
