"""SandboxPool on the real daemon: warm acquire, background reset, fork, sweep of a crashed run."""

from __future__ import annotations

import os
import signal

import docker
import pytest
from test_reaper import container_exists, spawn_owner

from sandboxes.docker_backend import DockerBackend
from sandboxes.pool import SandboxPool
from sandboxes.types import SandboxSpec, SnapshotKind

pytestmark = pytest.mark.docker


def test_pool_hands_out_pristine_sandboxes_and_forks(docker_client: docker.DockerClient, base_image: str) -> None:
    backend = DockerBackend(docker_client)
    try:
        with SandboxPool(backend, SandboxSpec(image=base_image), size=2, max_size=6) as pool:
            pool.warm(timeout=120)
            sb = pool.acquire(timeout=60)
            assert sb.exec("ls -A /workspace").stdout == "", "acquired sandboxes are pristine"
            sb.write_file("/workspace/state.txt", "branch-point")
            ref = sb.snapshot(SnapshotKind.FAST)
            sb.write_file("/workspace/state.txt", "after")
            forks = pool.fork(ref, 2, timeout=120)
            for i, f in enumerate(forks):
                assert f.read_file("/workspace/state.txt") == b"branch-point"
                f.write_file("/workspace/state.txt", f"fork{i}")
            assert [f.read_file("/workspace/state.txt") for f in forks] == [b"fork0", b"fork1"]
            pool.release(sb)
            pool.warm(timeout=120)
            # the released container may come back (reset in place) or be replaced; never dirty
            for fresh in [pool.acquire(timeout=60) for _ in range(2)]:
                assert fresh.exec("ls -A /workspace").stdout == "", "a released sandbox never comes back dirty"
            # the low-level list does not inspect each container: a background recycle may remove one meanwhile
            held = [c["Id"] for c in docker_client.api.containers(all=True, filters={"label": f"agentenv.run_id={backend.run_id}"})]
        after = docker_client.api.containers(all=True, filters={"label": f"agentenv.run_id={backend.run_id}"})
        assert held and not after, "closing the pool removes every container it held"
    finally:
        backend.close()


def test_pool_sweeps_its_runs_leftovers_at_start(docker_client: docker.DockerClient, base_image: str) -> None:
    run = f"pool-sweep-{os.getpid()}"
    crashed, ids = spawn_owner(base_image, run)
    crashed.send_signal(signal.SIGKILL)
    crashed.wait(timeout=10)
    assert all(container_exists(docker_client, c) for c in ids)
    backend = DockerBackend(docker_client, run_id=run)
    try:
        with SandboxPool(backend, SandboxSpec(image=base_image), size=0, max_size=1):
            assert not any(container_exists(docker_client, c) for c in ids), "leftovers of a dead owner of this run are swept"
    finally:
        backend.close()
