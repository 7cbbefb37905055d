"""Fixtures of the sweep tests: one in-process Ray (2 CPUs, no dashboard) per module, and the Docker base image."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def local_ray(base_image: str) -> Any:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, resources={"docker_daemon": 2})
    try:
        yield ray
    finally:
        ray.shutdown()
