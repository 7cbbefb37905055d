"""Sandbox images with a native agent program (a real harness CLI) in them, built offline from PyPI wheels.

There is no registry and no npm here, but two CLIs ship as binaries inside wheels:

* ``claude``: Claude Code, bundled in ``claude-agent-sdk`` (glibc, no Node);
* ``codex``: the static (musl) Codex CLI in ``openai-codex-cli-bin``.

``ensure_native_image(client, program, base)`` puts the binary in a layer on top of
``base`` (a task's image: the suite base, or the PostgreSQL image), together
with ``agentenv-gw-forward``, the in-sandbox forwarder from 127.0.0.1 to the
gateway's Unix socket (``GATEWAY_MOUNT``; see docs/sandboxes.md). The tag
``agentenv-cli-<program>:<hash>`` hashes the pinned version, the wheel's sha256
(pinned here too: a different file under the same version is refused), the
forwarder and the base image id, so a warm machine never downloads or builds,
and a changed input always rebuilds. Wheels are cached under
``$AGENTENV_CACHE_DIR/wheels`` (pip's own client downloads them).

A third is a Python package: ``kimi`` (kimi-cli 1.51.0) needs Python >= 3.12,
newer than the task images' own. Its recipe is a ``PythonRecipe``: a
relocatable trixie Python with the CLI in a venv, built once into a runtime
image (``sandboxes.native_runtime``) and copied onto each task image from there.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from sandboxes.native_runtime import OPT, PythonRecipe, build_python_runtime
from sandboxes.errors import SandboxError
from sandboxes.images import ImageBuildError, image_exists
from sandboxes import types
from sandboxes.types import GATEWAY_MOUNT

# The image names and labels keep their "cli" spelling from before the rename to "native": a tag is a content
# hash under this prefix, so images already built stay valid (and are found) after the rename.
NATIVE_REPOSITORY_PREFIX = "agentenv-cli-"
GATEWAY_SOCKET = types.GATEWAY_SOCKET
FORWARD_PORT = types.GATEWAY_FORWARD_PORT  # where the program finds the gateway inside the sandbox (loopback only)
INSTALL_DIR = OPT


@dataclass(frozen=True)
class WheelRecipe:
    """One pinned native program shipped as a binary in a wheel: which wheel, its sha256, and which of its files go into the image."""

    name: str
    package: str
    version: str
    wheel: str  # exact file name on PyPI
    sha256: str
    members: tuple[tuple[str, str], ...]  # (path in the wheel, path under INSTALL_DIR)
    binary: str  # the command, under INSTALL_DIR

    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


RECIPES: dict[str, WheelRecipe | PythonRecipe] = {
    "claude": WheelRecipe(
        "claude", "claude-agent-sdk", "0.2.189", "claude_agent_sdk-0.2.189-py3-none-manylinux_2_17_x86_64.whl",
        "b26a6a30a4e2cb025a6f5c95e1ce4469b38fcc51015c392f627bea7c948d67ad", (("claude_agent_sdk/_bundled/claude", "bin/claude"),), "bin/claude",
    ),
    "codex": WheelRecipe(
        "codex", "openai-codex-cli-bin", "0.163.0", "openai_codex_cli_bin-0.163.0-py3-none-manylinux_2_17_x86_64.whl",
        "76db41fb07fdf9ddacbe892b48d21dfde270031ec0f5666b5e558114355f006d", (("codex_cli_bin/bin/codex", "bin/codex"), ("codex_cli_bin/codex-path/rg", "bin/rg")), "bin/codex",
    ),
    # kimi's Grep tool looks for rg in kimi_cli/deps/bin before downloading one: trixie's, patched like the Python
    "kimi": PythonRecipe(
        "kimi", "kimi-cli", "1.51.0", "kimi-cli-1.51.0.txt", "kimi",
        debian=("python3.13", "python3.13-venv", "patchelf", "ripgrep"),
        extra_binaries=(("/usr/bin/rg", "lib/python3.13/site-packages/kimi_cli/deps/bin/rg"),),
    ),
}

# The forwarder: loopback TCP in the sandbox -> the gateway's Unix socket. It carries bytes only; the
# gateway behind the socket serves this episode's session and nothing else.
FORWARDER = f'''#!/usr/bin/env python3
"""agentenv-gw-forward: 127.0.0.1:PORT -> {GATEWAY_MOUNT}/{GATEWAY_SOCKET} (bytes only)."""
import socket, sys, threading
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else {FORWARD_PORT}
PATH = "{GATEWAY_MOUNT}/{GATEWAY_SOCKET}"

def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

def serve(client):
    try:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        up.connect(PATH)
    except OSError:
        client.close()
        return
    threading.Thread(target=pipe, args=(up, client), daemon=True).start()
    pipe(client, up)

srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", PORT))
srv.listen(64)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


def wheel_cache() -> Path:
    return Path(os.environ.get("AGENTENV_CACHE_DIR", Path.home() / ".cache" / "agentenv")) / "wheels"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(recipe: WheelRecipe, log: Callable[[str], None] = lambda _m: None) -> Path:
    """The recipe's wheel from the cache, else downloaded by pip (no dependencies); sha256-checked."""
    folder = wheel_cache()
    path = folder / recipe.wheel
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        log(f"downloading {recipe.requirement()}")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--platform", "manylinux_2_17_x86_64", "--python-version", "3.12", "-d", str(folder), recipe.requirement()]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.is_file():
            raise ImageBuildError(f"pip download {recipe.requirement()} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    digest = _sha256(path)
    if digest != recipe.sha256:
        raise ImageBuildError(f"{path}: sha256 {digest}, expected {recipe.sha256} (the pinned {recipe.requirement()})")
    return path


def native_image_tag(client: docker.DockerClient, program: str, base: str) -> str:
    recipe = _recipe(program)
    base_id = client.images.get(base).id
    if isinstance(recipe, PythonRecipe):
        pieces: tuple[str, ...] = (recipe.requirement(), recipe.tag())
    else:
        pieces = (recipe.requirement(), recipe.sha256, repr(recipe.members))
    h = hashlib.sha256()
    for piece in (*pieces, FORWARDER, base_id, INSTALL_DIR):
        h.update(piece.encode() + b"\0")
    return f"{NATIVE_REPOSITORY_PREFIX}{program}:{h.hexdigest()[:16]}"


def _recipe(program: str) -> WheelRecipe | PythonRecipe:
    try:
        return RECIPES[program]
    except KeyError:
        raise SandboxError(f"program: expected one of {sorted(RECIPES)}, got {program!r}") from None


def ensure_native_image(
    client: docker.DockerClient, program: str, base: str, *, force: bool = False, log: Callable[[str], None] = lambda _m: None
) -> str:
    """``base`` plus the pinned native program and the forwarder; built only when its content hash is missing.

    Concurrent callers in one process (a runner's first episodes) wait for one build.
    """
    recipe = _recipe(program)
    tag = native_image_tag(client, program, base)
    if not force and image_exists(client, tag):
        log(f"{tag} is present (content hash unchanged)")
        return tag
    with _BUILD_LOCKS.setdefault(tag, threading.Lock()):
        if not force and image_exists(client, tag):
            return tag
        _build(client, recipe, tag, base, log)
    return tag


_BUILD_LOCKS: dict[str, threading.Lock] = {}


def _build(client: docker.DockerClient, recipe: WheelRecipe | PythonRecipe, tag: str, base: str, log: Callable[[str], None]) -> None:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        lines = [f"FROM {base}"]
        if isinstance(recipe, PythonRecipe):
            runtime = build_python_runtime(client, recipe, log=log)
            lines.append(f"COPY --from={runtime} {INSTALL_DIR}/ {INSTALL_DIR}/")
            label = f'LABEL agentenv.cli="{recipe.requirement()}" agentenv.runtime="{runtime}"'
        else:
            _add_wheel_members(tar, recipe, fetch_wheel(recipe, log))
            label = f'LABEL agentenv.cli="{recipe.requirement()}" agentenv.wheel_sha256="{recipe.sha256}"'
        fwd = FORWARDER.encode()
        info = tarfile.TarInfo("files/bin/agentenv-gw-forward")
        info.size, info.mode = len(fwd), 0o755
        tar.addfile(info, io.BytesIO(fwd))
        lines += [f"COPY files/ {INSTALL_DIR}/", label]
        dockerfile = ("\n".join(lines) + "\n").encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    context.seek(0)
    log(f"building {tag} ({recipe.requirement()} on {base})")
    try:
        for chunk in client.api.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True, pull=False, decode=True):
            if "error" in chunk:
                raise ImageBuildError(f"{tag}: build failed: {chunk['error']}")
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"{tag}: build failed: {exc}") from exc


def _add_wheel_members(tar: tarfile.TarFile, recipe: WheelRecipe, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for member, target in recipe.members:
            info = tarfile.TarInfo(f"files/{target}")
            data = zf.read(member)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))


__all__ = ["NATIVE_REPOSITORY_PREFIX", "FORWARD_PORT", "GATEWAY_SOCKET", "INSTALL_DIR", "RECIPES", "WheelRecipe",
           "native_image_tag", "ensure_native_image", "fetch_wheel"]
