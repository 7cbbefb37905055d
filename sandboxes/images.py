"""Images built offline: a bootstrapped Debian base, and environment Dockerfiles on top.

There is no image registry here, so nothing is pulled. The base image is made
by ``debootstrap`` from the apt mirror the host is configured with, imported
with ``docker import``, and tagged by the content hash of its recipe: a
recipe that has not changed is never rebuilt. ``build_dockerfile`` builds an
environment's folder on top of it, tagged by the hash of the folder's files
and of the base image id it starts from.

Usage::

    client = docker.from_env()
    tag = ensure_base_image(client)          # builds only if the hash is missing
    env_tag = build_dockerfile(client, Path("tasks/my_task/environment"))
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors
from pydantic import BaseModel, ConfigDict, Field

from sandboxes.errors import DaemonUnavailable, ImageNotFound, SandboxError

BASE_REPOSITORY = "agentenv-base"
LATEST = f"{BASE_REPOSITORY}:latest"
DEFAULT_SUITE = "bookworm"
ENV_REPOSITORY_PREFIX = "agentenv-env-"


class ImageBuildError(SandboxError, RuntimeError):
    """An image recipe or Dockerfile failed to build (the message holds the log tail)."""


class RootfsRecipe(BaseModel):
    """What goes into a bootstrapped image. Its hash is the image's tag."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repository: str = BASE_REPOSITORY
    suite: str = DEFAULT_SUITE
    variant: str = "minbase"
    packages: tuple[str, ...] = (
        "python3",
        "python3-pytest",
        "sqlite3",
        "git",
        "procps",
        "ca-certificates",
    )
    # Run inside the rootfs with chroot, as root, after the packages are in.
    setup: tuple[str, ...] = (
        "useradd --create-home --uid 1000 --shell /bin/bash agent",
        "mkdir -p /workspace && chown agent:agent /workspace",
        "git config --system user.email agent@agentenv.local",
        "git config --system user.name agent",
        "git config --system init.defaultBranch main",
        "git config --system --add safe.directory '*'",
    )
    # Paths removed after setup to keep the image small; none is needed at run time.
    prune: tuple[str, ...] = (
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
    )
    changes: tuple[str, ...] = (
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        "WORKDIR /",
        'CMD ["/bin/bash"]',
    )
    extra: dict[str, str] = Field(default_factory=dict, description="free-form, hashed (bump to force a rebuild)")

    def content_hash(self) -> str:
        blob = json.dumps(self.model_dump(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def tag(self) -> str:
        return f"{self.repository}:{self.content_hash()}"


def host_apt_mirror(suite: str = DEFAULT_SUITE) -> str:
    """The Debian mirror this host's apt is configured with (``AGENTENV_APT_MIRROR`` wins)."""
    override = os.environ.get("AGENTENV_APT_MIRROR")
    if override:
        return override
    texts: list[str] = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(path.read_text())
        except OSError:
            continue
    for text in texts:
        # deb822 stanzas: "URIs: ..." with "Suites: <suite> ..."
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and suite in suites.group(1).split() and "security" not in uris.group(1):
                return uris.group(1)
        # one-line format: "deb [opts] URI suite components"
        for line in text.splitlines():
            m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m and m.group(2) == suite and "security" not in m.group(1):
                return m.group(1)
    return "http://deb.debian.org/debian"


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.DockerException as exc:
        raise DaemonUnavailable(f"cannot reach the Docker daemon: {exc}") from exc


def _run(cmd: list[str], log: Callable[[str], None]) -> None:
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise ImageBuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")


def build_rootfs_image(
    client: docker.DockerClient,
    recipe: RootfsRecipe,
    *,
    force: bool = False,
    log: Callable[[str], None] = lambda _msg: None,
) -> str:
    """Bootstrap, set up and import ``recipe``; return its tag. Cached by hash."""
    tag = recipe.tag()
    if not force and image_exists(client, tag):
        log(f"{tag} is present (recipe hash unchanged)")
        _tag_latest(client, tag, recipe.repository)
        return tag
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise ImageBuildError("building a base image needs root (debootstrap and chroot)")
    mirror = host_apt_mirror(recipe.suite)
    with tempfile.TemporaryDirectory(prefix="agentenv-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        cmd = ["debootstrap", f"--variant={recipe.variant}"]
        if recipe.packages:
            cmd.append("--include=" + ",".join(recipe.packages))
        _run([*cmd, recipe.suite, str(root), mirror], log)
        for step in recipe.setup:
            _run(["chroot", str(root), "/bin/sh", "-c", step], log)
        for rel in recipe.prune:
            target = root / rel
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
        tarball = Path(tmp) / "rootfs.tar"
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(tarball), "."], log)
        repository, _, version = tag.partition(":")
        log(f"importing {tag}")
        try:
            client.api.import_image_from_file(
                str(tarball), repository=repository, tag=version, changes=list(recipe.changes)
            )
        except docker.errors.DockerException as exc:
            raise ImageBuildError(f"docker import of {tag} failed: {exc}") from exc
    if not image_exists(client, tag):
        raise ImageBuildError(f"docker import reported success but {tag} is missing")
    _tag_latest(client, tag, recipe.repository)
    return tag


def _tag_latest(client: docker.DockerClient, tag: str, repository: str) -> None:
    client.images.get(tag).tag(repository, "latest")


def ensure_base_image(
    client: docker.DockerClient | None = None,
    *,
    force: bool = False,
    log: Callable[[str], None] = lambda _msg: None,
) -> str:
    """The tag of the base image, building it first if its recipe hash is not present."""
    client = client or docker.from_env()
    return build_rootfs_image(client, RootfsRecipe(), force=force, log=log)


def base_image_tag() -> str:
    """The tag the current base recipe has (without building or checking anything)."""
    return RootfsRecipe().tag()


def context_hash(folder: Path, base_id: str) -> str:
    """Hash of every file under ``folder`` (path, mode, bytes) and the base image id."""
    h = hashlib.sha256(base_id.encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        h.update(rel.encode() + b"\0" + oct(path.stat().st_mode & 0o777).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def build_dockerfile(
    client: docker.DockerClient,
    folder: Path,
    *,
    name: str | None = None,
    force: bool = False,
    log: Callable[[str], None] = lambda _msg: None,
) -> str:
    """Build ``folder/Dockerfile`` (``FROM agentenv-base:latest``) on the base image.

    The tag is ``agentenv-env-<name>:<hash>`` where the hash covers the folder's
    files and the base image's id, so editing either rebuilds and nothing else does.
    Builds never pull: every ``FROM`` must already be local.
    """
    folder = folder.resolve()
    dockerfile = folder / "Dockerfile"
    if not dockerfile.is_file():
        raise ImageNotFound(f"{dockerfile}: no Dockerfile in the environment folder")
    base = ensure_base_image(client, log=log)
    base_id = client.images.get(base).id
    slug = re.sub(r"[^a-z0-9_.-]+", "-", (name or folder.parent.name or folder.name).lower()).strip("-.") or "env"
    tag = f"{ENV_REPOSITORY_PREFIX}{slug}:{context_hash(folder, base_id)}"
    if not force and image_exists(client, tag):
        log(f"{tag} is present (context hash unchanged)")
        return tag
    log(f"building {tag} from {dockerfile}")
    lines: list[str] = []
    try:
        for chunk in client.api.build(path=str(folder), tag=tag, rm=True, forcerm=True, pull=False, decode=True):
            if "stream" in chunk:
                lines.append(chunk["stream"])
                log(chunk["stream"].rstrip())
            if "error" in chunk:
                tail = "".join(lines)[-3000:]
                raise ImageBuildError(f"{dockerfile}: build failed: {chunk['error']}\n{tail}")
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"{dockerfile}: build failed: {exc}") from exc
    return tag


__all__ = [
    "BASE_REPOSITORY",
    "ImageBuildError",
    "LATEST",
    "RootfsRecipe",
    "base_image_tag",
    "build_dockerfile",
    "build_rootfs_image",
    "ensure_base_image",
    "host_apt_mirror",
]
