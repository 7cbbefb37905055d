"""Fixtures of the adversarial suites: one Docker backend per module, the base image built once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

#: The task folders' hidden tests are grading material, not tests of this repo.
collect_ignore = ["tasks"]


@pytest.fixture(scope="module")
def backend(docker_client: Any, base_image: str) -> Iterator[Any]:
    from sandboxes.docker_backend import DockerBackend

    backend = DockerBackend(docker_client)
    yield backend
    backend.close()
