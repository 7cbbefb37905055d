"""The reaper against the real daemon: a SIGKILLed owner leaves nothing after one gc,
and a live owner's sandboxes are never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import docker
import pytest

from sandboxes import labels as L
from sandboxes.reaper import gc, list_sandboxes

pytestmark = pytest.mark.docker

CHILD = textwrap.dedent(
    """
    import sys, time, docker
    from sandboxes.docker_backend import DockerBackend
    from sandboxes.types import SandboxSpec
    backend = DockerBackend(run_id=sys.argv[2])
    sandboxes = [backend.create(SandboxSpec(image=sys.argv[1])) for _ in range(2)]
    print(" ".join(s.container_id for s in sandboxes), flush=True)
    time.sleep(600)
    """
)


def spawn_owner(image: str, run_id: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, image, run_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.strip():
        proc.kill()
        raise AssertionError(f"owner process failed: {proc.stderr.read() if proc.stderr else ''}")
    return proc, line.split()


def container_exists(client: docker.DockerClient, cid: str) -> bool:
    try:
        client.containers.get(cid)
        return True
    except docker.errors.NotFound:
        return False


def test_sigkilled_owner_is_reaped_and_live_owner_is_not(docker_client: docker.DockerClient, base_image: str) -> None:
    dead_run, live_run = f"reap-dead-{os.getpid()}", f"reap-live-{os.getpid()}"
    dead, dead_ids = spawn_owner(base_image, dead_run)
    live, live_ids = spawn_owner(base_image, live_run)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=10)
        records = {r.id: r for r in list_sandboxes(docker_client)}
        assert all(records[c[:12]].orphaned for c in dead_ids)
        assert not any(records[c[:12]].orphaned for c in live_ids)

        removed = gc(docker_client)
        assert {r.id for r in removed} >= {c[:12] for c in dead_ids}
        assert not any(container_exists(docker_client, c) for c in dead_ids), "one gc leaves nothing of a dead owner"
        assert all(container_exists(docker_client, c) for c in live_ids), "gc never touches a live owner"
        assert not gc(docker_client, run_id=live_run), "a live run has no orphans"
    finally:
        live.kill()
        live.wait(timeout=10)
        gc(docker_client)
    assert not any(container_exists(docker_client, c) for c in live_ids)


def test_unreadable_owner_labels_count_as_orphaned(docker_client: docker.DockerClient, base_image: str) -> None:
    c = docker_client.containers.create(
        base_image, ["sleep", "60"], labels={L.MANAGED: "1", L.RUN_ID: "broken", L.OWNER_PID: "not-a-pid"}
    )
    try:
        rec = {r.id: r for r in list_sandboxes(docker_client)}[c.id[:12]]
        assert rec.orphaned
        assert c.id[:12] in {r.id for r in gc(docker_client, run_id="broken")}
    finally:
        if container_exists(docker_client, c.id):
            c.remove(force=True)


def test_cli_ls_and_gc(docker_client: docker.DockerClient, base_image: str) -> None:
    run = f"reap-cli-{os.getpid()}"
    dead, ids = spawn_owner(base_image, run)
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=10)
    cli = [sys.executable, "-m", "agentenv.cli", "sandbox"]
    out = subprocess.run([*cli, "ls", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert ids[0][:12] in out.stdout
    out = subprocess.run([*cli, "gc", "--run", run], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "removed 2" in out.stdout
    assert not any(container_exists(docker_client, c) for c in ids)
