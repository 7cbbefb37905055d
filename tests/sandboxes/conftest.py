"""Fixtures for the sandbox backend contract (``test_contract.py``).

``backend`` is parametrized over every implementation: ``local`` (bubblewrap,
required: where it cannot run, each ``local`` case fails naming the probe's
reason instead of quietly testing plain subprocesses), ``local-plain`` (plain
subprocesses forced, the mode of hosts without bubblewrap) and ``docker``.
Select one with ``-k``: ``-k local`` runs both local modes, ``-m docker`` the
Docker one. Docker tests never skip: a missing daemon or a ``DockerBackend``
that does not import is a failure.

``fake`` is the in-memory ``sandboxes.testing.FakeBackend`` the unit tests use: it passes
every property it can have. A property it cannot (processes, pipes) carries
``@pytest.mark.not_modelled_by_fake(reason)`` in ``test_contract.py``; its ``[fake]`` case is
deselected at collection and listed, with the reason, in the session header.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxes.types import Sandbox, SandboxBackend, SandboxSpec

LOCAL_IMAGE = "agentenv-base:latest"  # recorded only: the local backend has no images

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "not_modelled_by_fake(reason): a contract property the in-memory FakeBackend cannot have"
    )


def _not_modelled(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("not_modelled_by_fake")
    callspec = getattr(item, "callspec", None)
    if mark is None or callspec is None or callspec.params.get("backend") != "fake":
        return None
    return str(mark.kwargs.get("reason") or mark.args[0])


_EXCLUDED: list[tuple[str, str]] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    excluded = [item for item in items if _not_modelled(item) is not None]
    if excluded:
        config.hook.pytest_deselected(items=excluded)
        items[:] = [item for item in items if _not_modelled(item) is None]
        _EXCLUDED.extend((item.name, _not_modelled(item) or "") for item in excluded)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    return [f"not modelled by the fake backend: {name}: {reason}" for name, reason in _EXCLUDED]


BACKENDS = [
    pytest.param("local", marks=pytest.mark.unit, id="local"),
    pytest.param("local-plain", marks=pytest.mark.unit, id="local-plain"),
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
    pytest.param("fake", marks=pytest.mark.unit, id="fake"),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxBackend]:
    made: Any
    if request.param == "fake":
        from sandboxes.testing import FakeBackend

        made = FakeBackend()
    elif request.param == "docker":
        from sandboxes.docker_backend import DockerBackend

        client = request.getfixturevalue("docker_client")
        request.getfixturevalue("base_image")  # built before the first sandbox, not inside a timed test
        made = DockerBackend(client, snapshot_dir=tmp_path / "docker-snapshots")
    else:
        from sandboxes.local_backend import LocalBackend

        made = LocalBackend(tmp_path / "local", use_bwrap=request.param == "local")  # "local": bubblewrap or a failure
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def make_spec(backend: SandboxBackend, request: pytest.FixtureRequest) -> Callable[..., SandboxSpec]:
    """``make_spec(**fields)``: a spec on the backend's image (the base image for Docker)."""
    image = request.getfixturevalue("base_image") if backend.name == "docker" else LOCAL_IMAGE

    def make(**fields: Any) -> SandboxSpec:
        return SandboxSpec(image=image, **fields)

    return make


@pytest.fixture
def spec(make_spec: Callable[..., SandboxSpec]) -> SandboxSpec:
    return make_spec()


@pytest.fixture
def sandbox(backend: SandboxBackend, spec: SandboxSpec) -> Iterator[Sandbox]:
    made = backend.create(spec)
    try:
        yield made
    finally:
        made.close()


def host_pids_with(token: str) -> list[int]:
    """Pids on this host whose command line contains ``token`` (zombies have none)."""
    needle = token.encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    pids.append(int(name))
        except OSError:
            continue
    return pids


@pytest.fixture
def host_pids() -> Callable[[str], list[int]]:
    return host_pids_with
