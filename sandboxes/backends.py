"""The one place a sandbox backend is chosen by name: ``make_backend("docker" | "local", run_id=...)``.

Configs (``backend: docker``), CLI flags (``--backend local``) and workers all
come here, so a new backend is added once and an unknown name fails the same
way everywhere, naming the known ones::

    backend = make_backend("local")
    sandbox = backend.create(SandboxSpec(image="python:3.12-slim"))

The backend modules are imported only when chosen (the Docker SDK is not
needed by a run on the local backend).
"""

from __future__ import annotations

import difflib
from typing import Literal

from sandboxes.errors import UnknownBackend
from sandboxes.types import SandboxBackend

__all__ = ["BACKENDS", "BackendName", "make_backend"]

BackendName = Literal["docker", "local"]
BACKENDS: tuple[str, ...] = ("docker", "local")


def make_backend(name: str, *, run_id: str | None = None) -> SandboxBackend:
    """A new backend of kind ``name``; ``run_id`` labels the containers it makes (Docker; the reaper reads it).

    The caller owns the backend and closes it. An unknown name raises ``UnknownBackend``.
    """
    if name == "docker":
        from sandboxes.docker_backend import DockerBackend

        return DockerBackend(run_id=run_id)
    if name == "local":
        from sandboxes.local_backend import LocalBackend

        return LocalBackend()
    close = difflib.get_close_matches(str(name), BACKENDS, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownBackend(f"backend: expected one of {'|'.join(BACKENDS)}, got {name!r}{hint}")
