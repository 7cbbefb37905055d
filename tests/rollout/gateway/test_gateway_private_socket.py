"""The gateway socket is the episode's alone (issue 26): with ``owner=`` it and its folder belong to the
sandbox user (0600 / 0700), the sandbox reaches it and must present the episode's token, and no other
host user can connect (before: a 0666 socket in a 0755 folder under /tmp, reachable by any host user)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile

import pytest

from rollout.gateway import Session, ThreadedGateway
from rollout.policy.types import FinishReason, Generation
from rollout.tokenizer import build_tokenizer
from sandboxes.native_images import GATEWAY_SOCKET
from sandboxes.docker_backend import DockerBackend
from sandboxes.types import GATEWAY_MOUNT, SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]
TOKEN = "episode-token-0123"
NOBODY = 65534

PROBE = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1])
auth = ("Authorization: Bearer " + sys.argv[2] + "\r\n") if sys.argv[2] else ""
s.sendall(("GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + "Connection: close\r\n\r\n").encode())
print(s.recv(100).split(b"\r\n")[0].decode())
"""


class Echo:
    name, version = "echo", 3

    async def generate(self, prompt, sampling, budget=None):  # noqa: ANN001, ANN201
        return Generation("hi", (), (), FinishReason.STOP, 1)


def _connects_as(uid: int, path: str) -> bool:
    """Whether a host process of ``uid`` can connect to the socket at ``path``."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            code = 0
        except OSError:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("private", [True, False], ids=["owner", "no-owner"])
def test_the_socket_is_the_sandbox_users_alone(docker_client, base_image, private: bool) -> None:  # noqa: ANN001
    folder = tempfile.mkdtemp(prefix="agentenv-gw-priv-")
    os.chmod(folder, 0o755)
    sandbox = DockerBackend(docker_client).create(SandboxSpec(image=base_image, gateway_dir=folder))
    path = os.path.join(folder, GATEWAY_SOCKET)
    owner = sandbox.user_ids if private else None
    gateway = ThreadedGateway(Session("priv", Echo(), build_tokenizer()), uds=path, token=TOKEN, owner=owner)
    try:
        sandbox.write_file("/tmp/probe.py", PROBE)
        inside = f"{GATEWAY_MOUNT}/{GATEWAY_SOCKET}"
        ok = sandbox.exec(["python3", "/tmp/probe.py", inside, TOKEN], timeout=60)
        assert ok.stdout.strip() == "HTTP/1.1 200 OK", ok
        refused = sandbox.exec(["python3", "/tmp/probe.py", inside, ""], timeout=60)
        assert refused.stdout.strip() == "HTTP/1.1 401 Unauthorized", refused
        if private:
            st_dir, st_sock = os.stat(folder), os.stat(path)
            uid, gid = sandbox.user_ids
            assert (st_dir.st_uid, stat.S_IMODE(st_dir.st_mode)) == (uid, 0o700)
            assert (st_sock.st_uid, stat.S_IMODE(st_sock.st_mode)) == (uid, 0o600)
        assert _connects_as(NOBODY, path) is (not private), "another host user's reach of the socket"
    finally:
        sandbox.close()
        gateway.close()
        shutil.rmtree(folder, ignore_errors=True)
