"""DockerBackend against the real daemon: exec, files, hardening config, agent recovery."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from sandboxes import labels
from sandboxes.docker_backend import DockerBackend, DockerSandbox
from sandboxes.errors import SandboxFileNotFound
from sandboxes.types import Sandbox, SandboxSpec

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def backend(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerBackend]:
    be = DockerBackend(docker_client, run_id=f"t{uuid.uuid4().hex[:8]}", snapshot_dir=tmp_path_factory.mktemp("snaps"))
    yield be
    be.close()
    left = docker_client.containers.list(all=True, filters={"label": f"{labels.RUN_ID}={be.run_id}"})
    assert not left, f"backend.close() left containers: {[c.name for c in left]}"


@pytest.fixture()
def sb(backend: DockerBackend, base_image: str) -> Iterator[DockerSandbox]:
    sandbox = backend.create(SandboxSpec(image=base_image, memory_mb=256, pids=64))
    yield sandbox
    sandbox.close()


def test_sandbox_satisfies_protocol(sb: DockerSandbox) -> None:
    assert isinstance(sb, Sandbox)
    assert sb.alive()
    assert sb.id.startswith("agentenv-")


def test_exec_shell_argv_exit_codes_and_streams(sb: DockerSandbox) -> None:
    r = sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
    r = sb.exec(["printf", "%s|", "a b", "$HOME"])  # argv: no shell expansion
    assert r.stdout == "a b|$HOME|"
    assert sb.exec("kill -TERM $$").exit_code == 128 + 15
    assert sb.exec(["no-such-binary"]).exit_code == 127


def test_exec_cwd_env_stdin(sb: DockerSandbox) -> None:
    assert sb.exec("pwd").stdout.strip() == "/workspace"
    sb.exec("mkdir -p sub")
    assert sb.exec("pwd", cwd="sub").stdout.strip() == "/workspace/sub"
    assert sb.exec("echo $FOO", env={"FOO": "bar"}).stdout == "bar\n"
    assert sb.exec("wc -c", stdin=b"x" * 300_000).stdout.strip() == "300000"
    with pytest.raises(SandboxFileNotFound):
        sb.exec("true", cwd="/does/not/exist")


def test_files_round_trip_binary_mode_and_listing(sb: DockerSandbox) -> None:
    blob = bytes(range(256)) * 1000
    sb.write_file("deep/dir/data.bin", blob, mode=0o755)
    assert sb.read_file("/workspace/deep/dir/data.bin") == blob
    sb.write_file("deep/note.txt", "héllo")
    assert sb.exec("cat deep/note.txt").stdout == "héllo"
    assert sb.exec(["./deep/dir/data.bin"]).exit_code != 127  # executable bit applied (content is garbage)
    flat = sb.list_files("deep")
    assert [e.path for e in flat] == ["/workspace/deep/dir", "/workspace/deep/note.txt"]
    deep = sb.list_files("/workspace/deep", recursive=True)
    entry = {e.path: e for e in deep}["/workspace/deep/dir/data.bin"]
    assert (entry.size, entry.mode, entry.is_dir) == (len(blob), 0o755, False)
    with pytest.raises(SandboxFileNotFound):
        sb.list_files("missing")


def test_container_is_hardened_and_labelled(sb: DockerSandbox, backend: DockerBackend, docker_client: docker.DockerClient) -> None:
    attrs = docker_client.api.inspect_container(sb.container_id)
    host = attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["NetworkMode"] == "none"
    assert host["PidsLimit"] == 64
    assert host["Memory"] == host["MemorySwap"] == 256 * 1024 * 1024
    assert host["NanoCpus"] == 1_000_000_000
    assert host["Init"] is True
    assert "/tmp" in host["Tmpfs"]
    assert attrs["Config"]["Labels"][labels.RUN_ID] == backend.run_id
    assert attrs["Config"]["Labels"][labels.KIND] == "sandbox"
    assert attrs["Name"].lstrip("/").startswith(f"agentenv-{backend.run_id}-")


def test_exec_round_trip_is_fast(sb: DockerSandbox, docker_client: docker.DockerClient) -> None:
    """What makes a round trip fast, asserted as shape, not time: every command goes over the one in-container
    agent (no new ``docker exec`` per command, the same agent pid), answers in order and in full. Its timing
    against ``exec_run`` is ``benches/sandbox.py``'s ``exec_roundtrip`` row (no time thresholds in tests)."""
    sb.exec(["true"])
    pid = sb.agent_call({"op": "ping"}, timeout=5)[0]["pid"]
    execs_before = list(docker_client.api.inspect_container(sb.container_id).get("ExecIDs") or [])
    results = [sb.exec(["sh", "-c", f"echo {i}; echo err{i} >&2"]) for i in range(30)]
    assert [(r.exit_code, r.stdout, r.stderr) for r in results] == [(0, f"{i}\n", f"err{i}\n") for i in range(30)]
    assert all(not r.timed_out and not r.truncated and 0.0 <= r.duration_s < 60 for r in results)
    execs_after = list(docker_client.api.inspect_container(sb.container_id).get("ExecIDs") or [])
    assert execs_after == execs_before, "a command went through a new docker exec instead of the agent channel"
    assert sb.agent_call({"op": "ping"}, timeout=5)[0]["pid"] == pid and sb.trusted


def test_the_sandbox_user_cannot_kill_the_agent(sb: DockerSandbox) -> None:
    pid = sb.agent_call({"op": "ping"}, timeout=5)[0]["pid"]
    r = sb.exec("kill -9 -1; kill -STOP -1; echo survived")  # every process the user may signal but itself
    assert r.stdout == "survived\n"
    assert sb.exec("echo back").stdout == "back\n"
    assert sb.agent_call({"op": "ping"}, timeout=5)[0]["pid"] == pid  # the same agent, never restarted
    assert sb.trusted


def test_agent_killed_from_outside_is_restarted(sb: DockerSandbox) -> None:
    sb.container.exec_run(["pkill", "-9", "-f", "/opt/agentenv/agent.py"], user="0:0")
    r = sb.exec("echo after")  # the first call finds the channel broken and restarts the agent
    assert r.stdout == "after\n" or r.exit_code == 137
    assert sb.exec("echo back").stdout == "back\n"
    assert sb.alive()


def test_image_without_python_falls_back_to_plain_exec(
    backend: DockerBackend, base_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    maker = docker_client.containers.run(base_image, ["sh", "-c", "rm -f /usr/bin/python3*"], detach=True)
    maker.wait(timeout=60)
    image = maker.commit(repository="agentenv-test-nopython", tag=uuid.uuid4().hex[:8])
    maker.remove(force=True)
    try:
        sb = backend.create(SandboxSpec(image=image.id, tmpfs_mb=0))
        try:
            assert not sb.has_agent
            r = sb.exec("echo hi; exit 4")
            assert (r.exit_code, r.stdout) == (4, "hi\n")
            r = sb.exec("sleep 30", timeout=1)
            assert r.timed_out and r.exit_code == 124 and r.duration_s < 10
            sb.write_file("x/y.txt", b"data\n")
            assert sb.read_file("x/y.txt") == b"data\n"
            assert [e.path for e in sb.list_files("x")] == ["/workspace/x/y.txt"]
            with pytest.raises(SandboxFileNotFound):
                sb.read_file("nope")
        finally:
            sb.close()
    finally:
        docker_client.images.remove(image.id, force=True)
