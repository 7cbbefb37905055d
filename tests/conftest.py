"""Session fixtures shared by every test folder.

Docker tests never skip: if the daemon is unreachable the fixture fails, so a
CI machine without Docker goes red instead of quietly green.
"""

from __future__ import annotations

import docker
import pytest


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:  # pragma: no cover - CI must have Docker
        pytest.fail(f"Docker daemon unreachable ({exc}); docker tests never skip", pytrace=False)
    return client


@pytest.fixture(scope="session")
def base_image(docker_client: docker.DockerClient) -> str:
    """Tag of the offline-built base image (built here if its recipe hash is missing)."""
    from sandboxes.images import ensure_base_image

    return ensure_base_image(docker_client)
