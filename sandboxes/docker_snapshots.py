"""Snapshots of Docker sandboxes: FAST (a diff blob) and IMAGE (``docker commit``).

What each kind captures:

* ``FAST``: every path of the container's root filesystem that differs from
  its base image (added, changed, deleted), with contents, mode, owner (when
  the restoring user may set it), mtime, symlinks and hard links; deleted
  base paths and directories that were deleted then re-created ("opaque"),
  so restore removes them too. NOT captured: the ``/tmp`` tmpfs and other
  mounts, ``/etc/hosts`` / ``hostname`` / ``resolv.conf`` (Docker writes
  those), running processes, memory, open sockets.
  The changed paths come from the container's overlay upper directory when
  this process can read it (local daemon, root: a few ms for any image
  size), and the host tars them from there itself, user extended attributes
  included: nothing the sandbox user runs has a say in what a snapshot
  holds. The container runs on meanwhile, so every path is opened beneath
  the upper dir with no symlink followed, typed by ``fstat`` of what was
  opened, and only regular files are read (``sandboxes.beneath``): a
  directory swapped for a symlink to a host directory, or a file swapped for
  a FIFO, is left out, never read through or waited on; the walk and pack
  together have a deadline (``HOST_PACK_TIMEOUT_S``), past which the
  snapshot is refused. Where the upper dir is not readable here (a remote daemon), the
  paths come from ``container.diff()`` (the daemon walks the whole image,
  about 1.5 s on fuse-overlayfs) and the agent (root, authenticated; see
  ``sandboxes.agent``) tars them inside the container; a sandbox without
  the trust boundary then refuses FAST snapshots. The blob is stored content-addressed under
  ``snapshot_dir`` (``<sha256>.tar``). Restore = a pristine container of the
  base image (or a warm one, ``apply``) + the blob; because the restored
  container's upper directory then holds exactly the snapshot's changes,
  its own FAST snapshots are again full diffs against the base image:
  lineages never grow a chain.
* ``IMAGE``: ``docker commit`` (container paused) of the whole writable
  layer into an image labelled ``agentenv.kind=snapshot`` that outlives the
  container. Captures the same files as FAST, plus the container config
  (env, workdir). NOT captured: tmpfs, mounts, processes. Every commit adds
  one layer; when an image reaches ``REBASE_AT`` layers (the overlay limit
  is about 127) the container is exported and re-imported as a single
  layer, re-applying env, workdir, user, entrypoint, cmd and labels.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker.errors

from sandboxes import labels
from sandboxes.beneath import Deadline, DeadlinePassed, Entry, open_dir_beneath, open_entry, read_fd, split
from sandboxes.errors import SnapshotError, SnapshotTooLarge, SpecError
from sandboxes.overlay import Keep, readable_upper, walk_upper, xattr_pax
from sandboxes.types import SnapshotKind, SnapshotRef

if TYPE_CHECKING:
    from sandboxes.docker_backend import DockerBackend, DockerSandbox

SNAPSHOT_REPOSITORY = "agentenv-snapshot"
REBASE_AT = 100
PACK_TIMEOUT_S = 300.0
HOST_PACK_TIMEOUT_S = 120.0  # the host-side walk and pack of the upper dir, whatever the sandbox does meanwhile
MANIFEST_NAME = ".agentenv-snapshot.json"  # same name as in agent.py
MAX_SNAPSHOT_BYTES = 1 << 30  # the blob is built in memory: a bigger one (a huge sparse file) is refused


def default_snapshot_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentenv" / "snapshots"


@dataclass(frozen=True)
class Changes:
    """Paths that differ from the base image (absolute, sorted)."""

    paths: list[str]
    deleted: list[str]
    opaque: list[str]


class DockerSnapshots:
    """Takes, restores and applies snapshots for one ``DockerBackend``."""

    def __init__(self, backend: DockerBackend, snapshot_dir: Path | None) -> None:
        self._backend = backend
        self.dir = Path(snapshot_dir) if snapshot_dir is not None else default_snapshot_dir()

    # -- entry points --------------------------------------------------------------------

    def take(self, sb: DockerSandbox, kind: SnapshotKind, *, tag: str | None = None) -> SnapshotRef:
        if kind is SnapshotKind.FAST:
            return self._take_fast(sb)
        if kind is SnapshotKind.IMAGE:
            return self._take_image(sb, tag)
        raise SpecError(f"snapshot kind must be a SnapshotKind, got {kind!r}")

    def restore(self, ref: SnapshotRef) -> DockerSandbox:
        self._check_backend(ref)
        if ref.kind is SnapshotKind.IMAGE:
            sb = self._backend.start(ref.spec, ref.location)
            sb.lineage = (ref.id, ref.depth)
            return sb
        blob, manifest = self._load(ref)
        sb = self._backend.start(ref.spec, ref.base_image)
        try:
            self._apply_blob(sb, ref, blob, manifest)
        except BaseException:
            sb.close()
            raise
        return sb

    def apply(self, sb: DockerSandbox, ref: SnapshotRef) -> None:
        """Apply a FAST snapshot onto a pristine sandbox of ``ref.base_image``."""
        self._check_backend(ref)
        if ref.kind is not SnapshotKind.FAST:
            raise SnapshotError(f"apply_snapshot needs a FAST snapshot, got {ref.kind.value} {ref.id}")
        blob, manifest = self._load(ref)
        self._apply_blob(sb, ref, blob, manifest)

    def remove(self, ref: SnapshotRef) -> None:
        """Delete a snapshot's image or blob (other refs to the same blob lose it too)."""
        if ref.kind is SnapshotKind.IMAGE:
            try:
                self._backend.client.images.remove(ref.location, force=True)
            except docker.errors.NotFound:
                pass
        else:
            Path(ref.location).unlink(missing_ok=True)

    # -- FAST --------------------------------------------------------------------------

    def _take_fast(self, sb: DockerSandbox) -> SnapshotRef:
        if not sb.has_agent:
            raise SnapshotError(f"sandbox {sb.id}: FAST snapshots need python3 in the image; use SnapshotKind.IMAGE")
        deadline = Deadline(HOST_PACK_TIMEOUT_S, f"FAST snapshot of sandbox {sb.id}")
        try:
            return self._take_fast_within(sb, deadline)
        except DeadlinePassed as exc:
            raise SnapshotError(str(exc)) from exc

    def _take_fast_within(self, sb: DockerSandbox, deadline: Deadline) -> SnapshotRef:
        changes = self.changes(sb, deadline)
        image_id = sb.facts.image_id
        manifest = {"base_image_id": image_id, "deleted": changes.deleted, "opaque": changes.opaque}
        upper = readable_upper(sb)
        if upper is not None:
            # The blob is held in memory here and by the restoring agent, inside the sandbox's memory limit.
            cap = min(MAX_SNAPSHOT_BYTES, (sb.spec.memory_mb << 20) // 4)
            blob = pack_upper(upper, changes.paths, manifest, sb.id, cap, deadline)
        elif not sb.trusted:
            raise SnapshotError(f"sandbox {sb.id}: no FAST snapshot without the host's view of its files or a trusted agent")
        else:
            head, blob = sb.agent_call(
                {"op": "pack", "paths": changes.paths, "manifest": manifest}, timeout=PACK_TIMEOUT_S
            )
            if head.get("unreadable"):
                blob = _append_from_archive(sb, blob, head["unreadable"])
        digest = hashlib.sha256(blob).hexdigest()
        path = self.dir / f"{digest}.tar"
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".tmp-", delete=False) as f:
                f.write(blob)
            os.replace(f.name, path)
        parent, depth = sb.lineage
        ref = SnapshotRef(
            id=f"fast-{digest[:24]}", kind=SnapshotKind.FAST, backend=self._backend.name,
            base_image=sb.base_image, location=str(path), spec=sb.spec, parent=parent, depth=depth + 1,
        )
        sb.lineage = (ref.id, ref.depth)
        return ref

    def changes(self, sb: DockerSandbox, deadline: Deadline | None = None) -> Changes:
        """What differs from the base image: from the overlay upper dir if readable, else ``diff``."""
        upper = readable_upper(sb)
        if upper is not None:
            paths, deleted, opaque = walk_upper(upper, deadline)
        else:
            paths, deleted, opaque = [], [], []
            for item in sb.container.diff() or []:
                (deleted if item["Kind"] == 2 else paths).append(item["Path"])
        keep = Keep(sb)
        return Changes(sorted(filter(keep, paths)), sorted(filter(keep, deleted)), sorted(filter(keep, opaque)))

    def _load(self, ref: SnapshotRef) -> tuple[bytes, dict[str, Any]]:
        try:
            blob = Path(ref.location).read_bytes()
        except OSError as exc:
            raise SnapshotError(f"snapshot {ref.id}: blob {ref.location} unreadable: {exc}") from exc
        digest = hashlib.sha256(blob).hexdigest()
        if not Path(ref.location).name.startswith(digest):
            raise SnapshotError(f"snapshot {ref.id}: blob {ref.location} is corrupt (sha256 {digest})")
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            first = tar.next()
            f = tar.extractfile(first) if first is not None and first.name == MANIFEST_NAME else None
            if f is None:
                raise SnapshotError(f"snapshot {ref.id}: blob {ref.location} has no manifest")
            manifest = json.loads(f.read())
        return blob, manifest

    def _apply_blob(self, sb: DockerSandbox, ref: SnapshotRef, blob: bytes, manifest: dict[str, Any]) -> None:
        if manifest.get("base_image_id") != sb.facts.image_id:
            raise SnapshotError(
                f"snapshot {ref.id} applies to image {manifest.get('base_image_id')}, "
                f"but sandbox {sb.id} runs {sb.facts.image_id} ({sb.base_image})"
            )
        head, _ = sb.agent_call({"op": "unpack"}, blob, timeout=PACK_TIMEOUT_S)
        if head.get("failed"):
            # The agent unpacks as root: a failure is a broken blob or a full disk, never a permission.
            raise SnapshotError(f"snapshot {ref.id}: sandbox {sb.id} could not apply {head['failed'][:5]}")
        sb.lineage = (ref.id, ref.depth)

    # -- IMAGE -------------------------------------------------------------------------

    def _take_image(self, sb: DockerSandbox, tag: str | None) -> SnapshotRef:
        snap_id = f"img-{secrets.token_hex(8)}"
        repo, _, version = (tag or f"{SNAPSHOT_REPOSITORY}:{snap_id}").rpartition(":")
        if not repo:
            repo, version = SNAPSHOT_REPOSITORY, version
        snap_labels = labels.owner_labels(self._backend.run_id, kind="snapshot")
        try:
            image = sb.container.commit(repository=repo, tag=version, conf={"Labels": snap_labels}, pause=True)
            if len(image.attrs["RootFS"]["Layers"]) >= REBASE_AT:
                image = self._flatten(sb, image, repo, version)
        except docker.errors.APIError as exc:
            if not sb.alive():
                raise sb._lost(f"commit failed: {exc}") from exc
            raise SnapshotError(f"sandbox {sb.id}: docker commit failed: {exc}") from exc
        parent, depth = sb.lineage
        ref = SnapshotRef(
            id=snap_id, kind=SnapshotKind.IMAGE, backend=self._backend.name, base_image=image.id,
            location=image.id, spec=sb.spec, parent=parent, depth=depth + 1,
        )
        sb.lineage = (ref.id, ref.depth)
        return ref

    def _flatten(self, sb: DockerSandbox, layered: Any, repo: str, version: str) -> Any:
        """Export the container's filesystem and import it as one layer with the same config."""
        cfg = layered.attrs.get("Config") or {}
        changes = [f"ENV {e.partition('=')[0]}={json.dumps(e.partition('=')[2])}" for e in cfg.get("Env") or []]
        changes += [f"WORKDIR {cfg.get('WorkingDir') or '/'}", f"USER {cfg.get('User') or '0'}"]
        if cfg.get("Entrypoint"):
            changes.append(f"ENTRYPOINT {json.dumps(cfg['Entrypoint'])}")
        if cfg.get("Cmd"):
            changes.append(f"CMD {json.dumps(cfg['Cmd'])}")
        changes += [f"LABEL {k}={json.dumps(v)}" for k, v in (cfg.get("Labels") or {}).items()]
        api = self._backend.client.api
        sb.container.pause()
        try:
            stream = sb.container.export(chunk_size=1 << 20)
            api.import_image_from_stream(stream, repository=repo, tag=version, changes=changes)
        finally:
            sb.container.unpause()
        flat = self._backend.client.images.get(f"{repo}:{version}")
        try:
            self._backend.client.images.remove(layered.id, noprune=False)
        except docker.errors.APIError:
            pass  # still used (tagged elsewhere or a container runs it): the reaper removes it later
        return flat

    def _check_backend(self, ref: SnapshotRef) -> None:
        if ref.backend != self._backend.name:
            raise SnapshotError(f"snapshot {ref.id} was made by backend {ref.backend!r}, not {self._backend.name!r}")


def pack_upper(
    upper: str, paths: list[str], manifest: dict[str, Any], sandbox_id: str, cap: int, deadline: Deadline
) -> bytes:
    """The FAST blob, tarred on the host from the upper dir (the files as the sandbox has them).

    The sandbox runs on while this reads its files, and its user may swap any
    entry it owns: every path is opened beneath ``upper`` with no symlink
    followed and typed by ``fstat`` of what was opened (``sandboxes.beneath``),
    so no host file is ever read and no FIFO or device is opened. A path whose
    parent is no longer a directory (or was not packed as one), or that is gone,
    is left out, as the walk would have left it out a moment later: the blob
    never holds a member beneath a symlink member, which a restore refuses.
    """
    buf = io.BytesIO()
    total = 0
    inodes: dict[tuple[int, int], str] = {}
    listed = set(paths)
    packed_dirs: set[str] = set()  # a listed parent not packed as a directory: its children are left out
    root = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    parent_rel, parent_fd = "", -1
    try:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            data = json.dumps(manifest).encode()
            info = tarfile.TarInfo(MANIFEST_NAME)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for path in sorted(paths):  # a parent sorts before its children
                deadline.check()
                rel_parent, name = split(path)
                parent_path = "/" + rel_parent
                if parent_path in listed and parent_path not in packed_dirs:
                    continue  # the parent was swapped for a symlink (or left out): a blob restore would refuse
                if parent_fd < 0 or rel_parent != parent_rel:
                    if parent_fd >= 0:
                        os.close(parent_fd)
                        parent_fd = -1
                    try:
                        parent_fd, parent_rel = open_dir_beneath(root, rel_parent), rel_parent
                    except OSError:
                        continue  # a parent swapped for a symlink (or a file) or removed since the walk
                entry = open_entry(parent_fd, name)
                if entry is None:
                    continue  # removed since the walk
                try:
                    arcname = path.lstrip("/")
                    ti = _tarinfo(entry, arcname, inodes)
                    if ti is None:
                        continue  # a socket: nothing a fresh sandbox could hold
                    if entry.fd is not None:
                        ti.pax_headers = {**ti.pax_headers, **xattr_pax(entry.fd)}
                    if ti.type == tarfile.DIRTYPE:
                        packed_dirs.add(path)
                    if ti.type == tarfile.REGTYPE:
                        total += ti.size
                        if total > cap:
                            raise SnapshotTooLarge(
                                f"sandbox {sandbox_id}: snapshot over {cap >> 20} MiB (a quarter of memory_mb, at most 1 GiB) at {path}"
                            )
                        assert entry.fd is not None
                        # as it is now: a file a racing daemon shrinks must not end the tar early
                        data = read_fd(entry.fd, ti.size, deadline)
                        ti.size = len(data)
                        tar.addfile(ti, io.BytesIO(data))
                    else:
                        tar.addfile(ti)
                finally:
                    if entry.fd is not None:
                        os.close(entry.fd)
    finally:
        if parent_fd >= 0:
            os.close(parent_fd)
        os.close(root)
    return buf.getvalue()


def _tarinfo(entry: Entry, arcname: str, inodes: dict[tuple[int, int], str]) -> tarfile.TarInfo | None:
    """A tar header for an entry opened beneath the upper dir (``TarFile.gettarinfo`` without a path lookup)."""
    st = entry.st
    ti = tarfile.TarInfo(arcname)
    ti.mode, ti.uid, ti.gid, ti.mtime = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime
    ti.uname = ti.gname = ""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        inode = (st.st_ino, st.st_dev)
        if st.st_nlink > 1 and inode in inodes and inodes[inode] != arcname:
            ti.type, ti.linkname = tarfile.LNKTYPE, inodes[inode]
        else:
            ti.type, ti.size = tarfile.REGTYPE, st.st_size
            inodes[inode] = arcname
    elif stat.S_ISDIR(mode):
        ti.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(mode):
        ti.type, ti.linkname = tarfile.SYMTYPE, entry.link or ""
    elif stat.S_ISFIFO(mode):
        ti.type = tarfile.FIFOTYPE
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        ti.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
        ti.devmajor, ti.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
    else:
        return None
    return ti


def _append_from_archive(sb: DockerSandbox, blob: bytes, paths: list[str]) -> bytes:
    """Add paths the sandbox user cannot read, fetched by the daemon with ``get_archive``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(blob)) as src, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
        for path in paths:
            try:
                stream, _ = sb.container.get_archive(path)
            except docker.errors.NotFound:
                continue
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as part:
                first = part.next()
                if first is None:
                    continue
                first.name = path.lstrip("/")
                dst.addfile(first, part.extractfile(first) if first.isreg() else None)
    return out.getvalue()


__all__ = ["Changes", "DockerSnapshots", "REBASE_AT", "SNAPSHOT_REPOSITORY", "default_snapshot_dir", "pack_upper"]
