"""A relocatable CPython from Debian trixie with a pinned Python native program (CLI) in a venv, for any task image.

kimi-cli 1.51.0 needs Python >= 3.12; the suite's images are Debian bookworm
(3.11), and the PostgreSQL image too. There is no registry to pull a newer
Python from and no python.org to download one, but the host's apt mirror
serves trixie (python3.13). So the CLI gets its own Python, living entirely
under ``/opt/agentenv-cli/<name>/`` in the sandbox:

* ``root/``: trixie's ``python3.13`` binary, its standard library and the
  shared libraries of ``usr/lib/x86_64-linux-gnu`` (trixie's glibc included);
* the binaries are patched (``patchelf``, run inside the trixie chroot) to
  start with trixie's own dynamic loader from ``root/`` and to search
  ``root/``'s library folder first (``DT_RPATH``, which also covers the
  extension modules they open), so nothing of the image's own glibc or
  libraries is mixed in, and nothing is set in the environment: the shell
  commands the CLI runs see the task image as it is, with its own Python;
* ``venv/``: a venv of that Python with the CLI installed by pip from a lock
  file that pins every distribution and its sha256 (``native_locks/``);
* ``/opt/agentenv-cli/bin/<name>``: the CLI's console script.

How it is made: ``debootstrap`` trixie from the host's mirror into a
temporary root, where ``/opt/agentenv-cli/<name>/root`` is a link to ``/``,
so the venv and the patched paths are created at the very paths they have in
the sandbox; pip runs in that chroot (it reaches PyPI, as the host does);
the needed parts are copied out and ``docker import``-ed as the image
``agentenv-cli-runtime-<name>:<hash>``, which holds only ``/opt/agentenv-cli``.
``sandboxes.native_images`` copies it onto each task image (``COPY --from``).
The hash covers the recipe, the lock file and the build steps, so a machine
builds it once; the Debian archive's state is not hashed (a trixie point
release changes python3.13's patch level, recorded in the image's labels).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from sandboxes.images import DEFAULT_SUITE, ImageBuildError, host_apt_mirror, image_exists
from sandboxes.types import NATIVE_INSTALL_DIR

# Image names, labels and in-sandbox paths keep their "cli" spelling from before the rename to "native", so the
# runtime images already built (tagged by content hash) stay valid. The lock files' text is part of that hash:
# their header comments are left as they were.
RUNTIME_REPOSITORY_PREFIX = "agentenv-cli-runtime-"
OPT = NATIVE_INSTALL_DIR
LOCK_DIR = Path(__file__).parent / "native_locks"
MULTIARCH = "usr/lib/x86_64-linux-gnu"
BUILD_STEPS_VERSION = "1"  # bump when the steps below change in a way the recipe does not show


@dataclass(frozen=True)
class PythonRecipe:
    """A native program (a CLI) that is a Python package, installed into its own relocatable Python."""

    name: str  # "kimi": the folder under OPT and the command OPT/bin/<name>
    package: str
    version: str
    lock: str  # file under native_locks/: "name==version --hash=sha256:..." per line, every dependency pinned
    console: str  # the console script the package installs
    suite: str = "trixie"
    python: str = "python3.13"
    debian: tuple[str, ...] = ("python3.13", "python3.13-venv", "patchelf")
    # (path in the trixie root, path under the venv): binaries the CLI looks for beside itself
    extra_binaries: tuple[tuple[str, str], ...] = ()

    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def home(self) -> str:
        return f"{OPT}/{self.name}"

    def lock_path(self) -> Path:
        return LOCK_DIR / self.lock

    def lock_text(self) -> str:
        path = self.lock_path()
        try:
            text = path.read_text()
        except OSError as exc:
            raise ImageBuildError(f"{path}: the lock file of {self.requirement()} cannot be read: {exc}") from exc
        pins = [line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("#")]
        if self.requirement() not in pins:
            raise ImageBuildError(f"{path}: expected a line pinning {self.requirement()}, found {len(pins)} pins without it")
        for line in text.splitlines():
            if line.strip() and not line.startswith("#") and "--hash=sha256:" not in line:
                raise ImageBuildError(f"{path}: every line needs --hash=sha256:...; this one has none: {line!r}")
        return text

    def content_hash(self) -> str:
        h = hashlib.sha256()
        blob = json.dumps([self.name, self.package, self.version, self.console, self.suite, self.python,
                           list(self.debian), [list(b) for b in self.extra_binaries], OPT, BUILD_STEPS_VERSION])
        for piece in (blob, self.lock_text()):
            h.update(piece.encode() + b"\0")
        return h.hexdigest()[:16]

    def tag(self) -> str:
        return f"{RUNTIME_REPOSITORY_PREFIX}{self.name}:{self.content_hash()}"


def _run(cmd: list[str], log: Callable[[str], None], env: dict[str, str] | None = None) -> str:
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise ImageBuildError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def _chroot_env(ca: bool) -> dict[str, str]:
    """What pip in the chroot needs of the host's set-up: its CA bundle (copied in), index and proxies."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    if ca:
        env["PIP_CERT"] = "/tmp/host-ca.crt"
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
                "http_proxy", "https_proxy", "no_proxy"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def _host_ca_bundle() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_python_runtime(
    client: docker.DockerClient, recipe: PythonRecipe, *, force: bool = False, log: Callable[[str], None] = lambda _m: None
) -> str:
    """The runtime image of ``recipe`` (only ``/opt/agentenv-cli``); built when its hash is missing."""
    tag = recipe.tag()
    if not force and image_exists(client, tag):
        log(f"{tag} is present (recipe hash unchanged)")
        return tag
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise ImageBuildError(f"building {tag} needs root (debootstrap and chroot)")
    lock = recipe.lock_text()
    home, py = recipe.home, recipe.python
    with tempfile.TemporaryDirectory(prefix=f"agentenv-cli-{recipe.name}-") as tmp:
        root = Path(tmp) / "root"
        _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(recipe.debian), recipe.suite, str(root),
              host_apt_mirror(DEFAULT_SUITE)], log)
        ca = _host_ca_bundle()
        if ca is not None:
            shutil.copyfile(ca, root / "tmp" / "host-ca.crt")
        if Path("/etc/resolv.conf").is_file():
            shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
        (root / "tmp" / "lock.txt").write_text(lock)
        (root / home.lstrip("/")).mkdir(parents=True)
        os.symlink("/", root / home.lstrip("/") / "root")  # the sandbox's paths, inside the chroot

        def chroot(*argv: str) -> str:
            return _run(["chroot", str(root), *argv], log, env=_chroot_env(ca is not None))

        chroot(f"{home}/root/usr/bin/{py}", "-m", "venv", f"{home}/venv")
        chroot(f"{home}/venv/bin/pip", "install", "-q", "--require-hashes", "-r", "/tmp/lock.txt")
        loader = f"{home}/root/{MULTIARCH}/ld-linux-x86-64.so.2"
        binaries = [f"/usr/bin/{py}", *(src for src, _ in recipe.extra_binaries)]
        for binary in binaries:
            # rpath first, then the interpreter: patchelf 0.18 writes a binary that crashes when asked
            # for both in one call (or in the other order) on Debian's python3.13.
            chroot("patchelf", "--force-rpath", "--set-rpath", f"{home}/root/{MULTIARCH}", binary)
            chroot("patchelf", "--set-interpreter", loader, binary)
        version = chroot(f"{home}/venv/bin/{recipe.console}", "--version").strip()
        versions = chroot("dpkg-query", "-W", "-f", "${Package}=${Version} ", py, "libc6").strip()
        log(f"{recipe.requirement()}: {version!r} on {versions}")

        stage = Path(tmp) / "stage"
        dest = stage / home.lstrip("/")
        (dest / "root" / "usr" / "bin").mkdir(parents=True)
        shutil.copy2(root / "usr" / "bin" / py, dest / "root" / "usr" / "bin" / py)
        for rel in (f"usr/lib/{py}", MULTIARCH):
            shutil.copytree(root / rel, dest / "root" / rel, symlinks=True)
        _drop_foreign_links(dest / "root", home)
        shutil.copytree(root / home.lstrip("/") / "venv", dest / "venv", symlinks=True)
        for src, target in recipe.extra_binaries:
            (dest / "venv" / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / src.lstrip("/"), dest / "venv" / target)
        (stage / OPT.lstrip("/") / "bin").mkdir(parents=True)
        os.symlink(f"../{recipe.name}/venv/bin/{recipe.console}", stage / OPT.lstrip("/") / "bin" / recipe.name)
        tarball = Path(tmp) / "runtime.tar"
        _run(["tar", "--numeric-owner", "-C", str(stage), "-cf", str(tarball), "."], log)
        repository, _, version_tag = tag.partition(":")
        labels = f'LABEL agentenv.cli="{recipe.requirement()}" agentenv.python="{versions}"'
        log(f"importing {tag}")
        try:
            client.api.import_image_from_file(str(tarball), repository=repository, tag=version_tag, changes=[labels])
        except docker.errors.DockerException as exc:
            raise ImageBuildError(f"docker import of {tag} failed: {exc}") from exc
    if not image_exists(client, tag):
        raise ImageBuildError(f"docker import reported success but {tag} is missing")
    return tag


def _drop_foreign_links(tree: Path, home: str) -> None:
    """Remove absolute links that would point into the task image's own files once relocated.

    (trixie's ``sitecustomize.py`` -> ``/etc/python3.13/...``, ``ssl/certs`` -> ``/etc/ssl/...``.)
    """
    for path in tree.rglob("*"):
        if path.is_symlink():
            target = os.readlink(path)
            if target.startswith("/") and not target.startswith(home + "/"):
                path.unlink()


__all__ = ["LOCK_DIR", "OPT", "RUNTIME_REPOSITORY_PREFIX", "PythonRecipe", "build_python_runtime"]
