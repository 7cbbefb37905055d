"""Find and remove sandboxes whose owner is gone.

A process that dies with SIGKILL (or a Ray actor killed with ``ray.kill``)
runs no cleanup, so its containers outlive it. Every container we start is
labelled with its owner (host, pid, process start time, see ``labels``); the
reaper lists them and removes those whose owner no longer exists. An owner on
another host is never judged from here: its sandboxes are left alone unless
the caller asks for them by run id.

Snapshot images (``docker commit``) are meant to outlive their container, so
``gc`` keeps them unless ``images=True``.

``release_disk_mounts`` is the other half: the size-limited layer mounts of
``sandboxes.disk_limit`` (``disk_mb`` on fuse-overlayfs) whose container is
gone. ``docker rm`` unmounts them itself, so normally there are none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker
import docker.errors

from sandboxes import labels as L
from sandboxes.errors import DaemonUnavailable

if TYPE_CHECKING:
    from sandboxes.disk_limit import LimitMount


@dataclass(frozen=True)
class SandboxRecord:
    """One labelled container (or snapshot image) as the reaper sees it."""

    id: str
    name: str
    status: str
    run_id: str
    owner: str
    owner_alive: bool | None  # None: owner on another host, unknown
    age_s: float
    image: str
    kind: str = "sandbox"

    @property
    def orphaned(self) -> bool:
        return self.owner_alive is False


def _client(client: docker.DockerClient | None) -> docker.DockerClient:
    if client is not None:
        return client
    try:
        c = docker.from_env(timeout=60)
        c.ping()
        return c
    except docker.errors.DockerException as exc:
        raise DaemonUnavailable(f"cannot reach the Docker daemon: {exc}") from exc


def _record(obj_id: str, name: str, status: str, image: str, labels: dict[str, str], kind: str) -> SandboxRecord:
    owner = L.owner_from_labels(labels)
    try:
        age = time.time() - float(labels.get(L.CREATED_AT, "0"))
    except ValueError:
        age = 0.0
    return SandboxRecord(
        id=obj_id[:12],
        name=name,
        status=status,
        run_id=labels.get(L.RUN_ID, "?"),
        owner=f"{owner.host}:{owner.pid}" if owner else "?",
        # unreadable labels: the owner cannot be proven alive, and we made it
        owner_alive=owner.is_alive() if owner else False,
        age_s=age,
        image=image,
        kind=kind,
    )


def list_sandboxes(client: docker.DockerClient | None = None, *, images: bool = False) -> list[SandboxRecord]:
    """Every container we labelled (running or not), and snapshot images if asked."""
    client = _client(client)
    out: list[SandboxRecord] = []
    try:
        for c in client.api.containers(all=True, filters={"label": f"{L.MANAGED}=1"}):
            name = (c.get("Names") or ["?"])[0].lstrip("/")
            out.append(_record(c["Id"], name, c.get("State", "?"), c.get("Image", "?"), c.get("Labels") or {}, "sandbox"))
        if images:
            for im in client.api.images(filters={"label": f"{L.MANAGED}=1"}):
                tags = im.get("RepoTags") or ["<none>"]
                out.append(_record(im["Id"].split(":")[-1], tags[0], "image", tags[0], im.get("Labels") or {}, "snapshot"))
    except docker.errors.DockerException as exc:
        raise DaemonUnavailable(f"cannot list containers: {exc}") from exc
    return sorted(out, key=lambda r: (r.kind, r.run_id, -r.age_s))


def gc(
    client: docker.DockerClient | None = None,
    *,
    run_id: str | None = None,
    images: bool = False,
    dry_run: bool = False,
) -> list[SandboxRecord]:
    """Remove orphaned sandboxes (owner gone); return what was (or would be) removed.

    ``run_id`` narrows to one run; with it, sandboxes of that run whose owner is
    on another host are not touched either: only a proven-dead owner counts.
    """
    client = _client(client)
    doomed = [
        r
        for r in list_sandboxes(client, images=images)
        if r.orphaned and (run_id is None or r.run_id == run_id) and (images or r.kind == "sandbox")
    ]
    if dry_run:
        return doomed
    removed: list[SandboxRecord] = []
    for r in doomed:
        try:
            if r.kind == "sandbox":
                client.api.remove_container(r.id, force=True, v=True)
            else:
                client.api.remove_image(r.id, force=True)
            removed.append(r)
        except docker.errors.NotFound:
            removed.append(r)  # someone else removed it first: it is gone either way
        except docker.errors.APIError as exc:
            if "removal" in str(exc) and "in progress" in str(exc):
                removed.append(r)
            else:
                raise
    return removed


def release_disk_mounts(client: docker.DockerClient | None = None, *, dry_run: bool = False) -> list[LimitMount]:
    """Unmount disk-limit mounts whose container no longer exists; return them.

    Mounts of live containers (any owner's) are never touched. Reading the host's
    mounts asks the daemon nothing when there are none of ours.
    """
    from sandboxes.disk_limit import our_mounts, release_leaked

    if not our_mounts():
        return []
    return release_leaked(_client(client), dry_run=dry_run)


__all__ = ["SandboxRecord", "gc", "list_sandboxes", "release_disk_mounts"]
