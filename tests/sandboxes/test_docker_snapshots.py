"""Docker snapshots (FAST and IMAGE), long lineages, and the error paths of the backend."""

from __future__ import annotations

import io
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest

from sandboxes import labels
from sandboxes.docker_backend import DockerBackend, DockerSandbox
from sandboxes.docker_snapshots import REBASE_AT
from sandboxes.errors import DaemonUnavailable, ImageNotFound, SandboxLost, SnapshotError
from sandboxes.types import SandboxSpec, SnapshotKind, SnapshotRef

pytestmark = pytest.mark.docker


@pytest.fixture()
def backend(docker_client: docker.DockerClient, tmp_path: Path) -> Iterator[DockerBackend]:
    be = DockerBackend(docker_client, run_id=f"snap{uuid.uuid4().hex[:8]}", snapshot_dir=tmp_path / "blobs")
    yield be
    be.close()
    # IMAGE snapshots outlive containers by design: remove this test's, children first.
    images = docker_client.images.list(filters={"label": f"{labels.RUN_ID}={be.run_id}"})
    for image in sorted(images, key=lambda i: i.attrs["Created"], reverse=True):
        try:
            docker_client.images.remove(image.id, force=True)
        except docker.errors.APIError:
            pass


@pytest.fixture()
def spec(base_image: str) -> SandboxSpec:
    return SandboxSpec(image=base_image, memory_mb=256, pids=64)


def _populate(sb: DockerSandbox) -> None:
    sb.write_file("keep.txt", "v1")
    sb.write_file("bin/run.sh", "#!/bin/sh\necho ran\n", mode=0o750)
    sb.exec("ln -s keep.txt link && mkdir -p empty/dir && rm /home/agent/.bashrc && echo gone > /tmp/scratch")


def _check_state(sb: DockerSandbox) -> None:
    assert sb.read_file("keep.txt") == b"v1"
    assert sb.exec("./bin/run.sh").stdout == "ran\n"  # mode kept
    assert sb.exec("readlink link").stdout == "keep.txt\n"
    assert sb.exec("test -d empty/dir").exit_code == 0
    assert sb.exec("test -e /home/agent/.bashrc").exit_code == 1  # deletion of a base file kept
    assert sb.exec("test -e /tmp/scratch").exit_code == 1  # tmpfs is not captured
    assert sb.exec("stat -c %U keep.txt").stdout == "agent\n"


def test_fast_snapshot_restore_and_fork_are_independent(backend: DockerBackend, spec: SandboxSpec) -> None:
    origin = backend.create(spec)
    _populate(origin)
    ref = origin.snapshot()
    assert ref.kind is SnapshotKind.FAST and ref.backend == "docker" and Path(ref.location).is_file()
    assert SnapshotRef.from_dict(ref.to_dict()) == ref
    a, b = backend.fork(ref, 2)
    for sb in (a, b):
        _check_state(sb)
    a.write_file("keep.txt", "changed in a")
    a.exec("rm -r empty")
    origin.write_file("keep.txt", "changed in origin")
    assert b.read_file("keep.txt") == b"v1"
    assert b.exec("test -d empty/dir").exit_code == 0
    assert backend.restore(ref).read_file("keep.txt") == b"v1"


def test_apply_snapshot_onto_a_pristine_sandbox(backend: DockerBackend, spec: SandboxSpec) -> None:
    origin = backend.create(spec)
    _populate(origin)
    ref = origin.snapshot()
    warm = backend.create(spec)
    backend.apply_snapshot(warm, ref)
    _check_state(warm)
    other = backend.create(spec.model_copy(update={"image": "agentenv-base:latest"}))
    if other.facts.image_id != warm.facts.image_id:  # only when latest is another build
        with pytest.raises(SnapshotError):
            backend.apply_snapshot(other, ref)


def _fast_lineage(backend: DockerBackend, spec: SandboxSpec, cycles: int) -> None:
    """Each cycle restores the previous snapshot onto a fresh sandbox, changes one file, snapshots.

    Pristine sandboxes are made ahead in two threads (as the warm pool does), so the
    cycle itself is apply + exec + snapshot; container creation still bounds the pace.
    """
    sb = backend.create(spec)
    sb.write_file("base.txt", "x" * 10_000)
    ref = sb.snapshot()
    sizes = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        warm = [pool.submit(backend.create, spec) for _ in range(3)]
        for i in range(cycles):
            nxt = warm.pop(0).result()
            warm.append(pool.submit(backend.create, spec))
            backend.apply_snapshot(nxt, ref)
            sb.close()
            sb = nxt
            sb.write_file("counter.txt", str(i))
            ref = sb.snapshot()
            sizes.append(Path(ref.location).stat().st_size)
        for f in warm:
            f.result().close()
    assert ref.depth == cycles + 1
    assert sb.read_file("counter.txt") == str(cycles - 1).encode()
    assert len(sb.read_file("base.txt")) == 10_000
    assert max(sizes) < 2 * sizes[0], f"blob grew along the lineage: {sizes[0]} -> {max(sizes)} bytes"


def test_fast_lineage_of_20_cycles_never_grows(backend: DockerBackend, spec: SandboxSpec) -> None:
    _fast_lineage(backend, spec, 20)


@pytest.mark.slow
def test_fast_lineage_of_200_cycles_never_grows(backend: DockerBackend, spec: SandboxSpec) -> None:
    _fast_lineage(backend, spec, 200)  # ~100 s here: one fresh container per cycle


def test_image_snapshot_restores_files_and_config(backend: DockerBackend, spec: SandboxSpec, docker_client: docker.DockerClient) -> None:
    origin = backend.create(spec.model_copy(update={"env": {"TASK": "demo"}}))
    _populate(origin)
    ref = origin.snapshot(SnapshotKind.IMAGE)
    image = docker_client.images.get(ref.location)
    assert image.labels[labels.KIND] == "snapshot"
    origin.close()  # the image outlives its container
    restored = backend.restore(ref)
    _check_state(restored)
    assert restored.exec("echo $TASK").stdout == "demo\n"
    assert restored.snapshot().base_image == ref.location  # FAST on top diffs against the image


@pytest.fixture(scope="module")
def tiny_image(docker_client: docker.DockerClient, base_image: str) -> Iterator[str]:
    """A few-file image (sh, coreutils, libc; no python3): commits of it are cheap."""
    script = (
        "import os, tarfile\n"
        "files = ['/usr/bin/' + n for n in ('dash', 'sleep', 'cat', 'mkdir', 'chmod', 'dirname', 'timeout', 'find', 'stat', 'ls')]\n"
        "files += ['/usr/lib/x86_64-linux-gnu/' + n for n in ('libc.so.6', 'libm.so.6', 'libpcre2-8.so.0', 'libselinux.so.1')]\n"
        "files += ['/usr/lib64/ld-linux-x86-64.so.2']\n"
        "with tarfile.open('/rootfs.tar', 'w') as t:\n"
        "    for d in ('bin', 'lib', 'lib64', 'sbin', 'etc', 'tmp', 'workspace'):\n"
        "        t.add('/' + d, arcname=d, recursive=False)\n"
        "    for f in files:\n"
        "        real = os.path.realpath(f)\n"
        "        t.add(real, arcname=real.lstrip('/'))\n"
        "        if real != f:\n"
        "            t.add(f, arcname=f.lstrip('/'))\n"
        "    t.add('/usr/bin/dash', arcname='usr/bin/sh')\n"
    )
    maker = docker_client.containers.run(base_image, ["python3", "-c", script], user="0", detach=True)
    assert maker.wait(timeout=60)["StatusCode"] == 0, maker.logs()
    stream, _ = maker.get_archive("/rootfs.tar")
    raw = b"".join(stream)  # before remove: the daemon holds the container while it streams
    maker.remove(force=True)
    with tarfile.open(fileobj=io.BytesIO(raw)) as outer:
        member = outer.extractfile("rootfs.tar")
        assert member is not None
        data = member.read()
    tag = f"agentenv-test-tiny:{uuid.uuid4().hex[:8]}"
    repo, _, version = tag.partition(":")
    docker_client.api.import_image_from_data(data, repository=repo, tag=version, changes=['CMD ["sh"]', "ENV PATH=/usr/bin:/bin"])
    yield tag
    docker_client.images.remove(tag, force=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_image_lineage_past_the_rebase_depth_is_rebased(backend: DockerBackend, tiny_image: str, docker_client: docker.DockerClient) -> None:
    cycles = REBASE_AT + 30  # one rebase, then 30 more layers on the rebased image
    sb = backend.create(SandboxSpec(image=tiny_image, user="1000", tmpfs_mb=0, memory_mb=64, pids=32))
    assert not sb.has_agent  # tiny image: plain exec path, which keeps commits cheap
    layers = []
    for i in range(cycles):
        sb.write_file(f"f{i:03d}", str(i))
        ref = sb.snapshot(SnapshotKind.IMAGE)
        layers.append(len(docker_client.images.get(ref.location).attrs["RootFS"]["Layers"]))
        nxt = backend.restore(ref)
        sb.close()
        sb = nxt
    assert ref.depth == cycles
    assert max(layers) < REBASE_AT
    assert any(later < earlier for earlier, later in zip(layers, layers[1:])), f"never rebased: {layers}"
    names = sb.exec("ls /workspace").stdout.split()
    assert names == [f"f{i:03d}" for i in range(cycles)]
    assert sb.read_file(f"f{REBASE_AT + 10:03d}") == str(REBASE_AT + 10).encode()  # written after the rebase


# -- errors --------------------------------------------------------------------------------


def test_daemon_unreachable_raises_daemon_unavailable(tmp_path: Path) -> None:
    with pytest.raises(DaemonUnavailable):
        DockerBackend(base_url=f"unix://{tmp_path}/no-docker.sock")


def test_unknown_image_raises_image_not_found(backend: DockerBackend) -> None:
    with pytest.raises(ImageNotFound):
        backend.create(SandboxSpec(image=f"agentenv-no-such-image:{uuid.uuid4().hex[:8]}"))


def test_container_killed_from_outside_raises_sandbox_lost(
    backend: DockerBackend, spec: SandboxSpec, docker_client: docker.DockerClient
) -> None:
    sb = backend.create(spec)
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(sb.exec("sleep 60", timeout=60))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    time.sleep(0.5)
    docker_client.containers.get(sb.container_id).kill()
    worker.join(timeout=15)
    assert not worker.is_alive(), "exec hung after the container was killed"
    assert isinstance(outcome[0], SandboxLost), outcome
    with pytest.raises(SandboxLost):
        sb.read_file("/etc/passwd")
    assert not sb.alive()
    sb.close()  # idempotent on a dead container


def test_timeout_kills_the_whole_process_group(backend: DockerBackend, spec: SandboxSpec) -> None:
    sb = backend.create(spec)
    t0 = time.monotonic()
    r = sb.exec("sleep 101 & sleep 102 & sleep 103", timeout=1)
    assert r.timed_out and r.exit_code == 124
    assert time.monotonic() - t0 < 4
    left = sb.exec(["ps", "-eo", "args"]).stdout
    assert "sleep 10" not in left, left


def test_output_flood_is_truncated_and_returns_promptly(backend: DockerBackend, base_image: str) -> None:
    sb = backend.create(SandboxSpec(image=base_image, output_limit=64 * 1024))
    r = sb.exec("head -c 200000000 /dev/zero | tr '\\0' a; echo done >&2", timeout=60)
    assert r.truncated and r.exit_code == 0
    assert len(r.stdout) == 64 * 1024 and r.stderr == "done\n"


def test_tar_blob_is_content_addressed(backend: DockerBackend, spec: SandboxSpec) -> None:
    sb = backend.create(spec)
    sb.write_file("a.txt", "a")
    ref = sb.snapshot()
    data = Path(ref.location).read_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
    assert names[0] == ".agentenv-snapshot.json" and "workspace/a.txt" in names
    assert not any(n.startswith(("opt/agentenv", "tmp/", "etc/hosts")) for n in names), names
    Path(ref.location).write_bytes(data + b"\0" * 512)
    with pytest.raises(SnapshotError):
        backend.restore(ref)
