"""Adversarial: what a hostile sandbox user can do with the gateway socket mounted into its sandbox.

Claims (docs/sandboxes.md, "The model gateway socket"): the network stays off;
the mounted folder is read-only and holds the socket only; the socket speaks
the model API of this episode's session and nothing else (no file, no other
session, no host service); garbage does not crash it or lose the record; once
the episode ends the socket is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from rollout.gateway import Session, ThreadedGateway
from rollout.policy.types import FinishReason, Generation
from rollout.tokenizer import build_tokenizer
from sandboxes.native_images import FORWARD_PORT, GATEWAY_SOCKET, INSTALL_DIR, ensure_native_image
from sandboxes.docker_backend import DockerBackend
from sandboxes.types import GATEWAY_MOUNT, SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


class Echo:
    name, version = "echo", 3

    async def generate(self, prompt, sampling, budget=None):
        return Generation("hello from the policy", (), (), FinishReason.STOP, 3)


PY_HTTP = r"""
import socket, sys
path = sys.argv[1]; body = sys.argv[2].encode()
s = socket.create_connection(("127.0.0.1", %d), timeout=20)
req = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
if path.startswith("GET "):
    req = path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
s.sendall(req)
out = b""
while True:
    d = s.recv(65536)
    if not d: break
    out += d
print(out.decode(errors="replace").split("\r\n")[0]); print(out.decode(errors="replace")[-300:])
""" % FORWARD_PORT


@pytest.fixture(scope="module")
def sandbox_with_gateway(docker_client, base_image):
    image = ensure_native_image(docker_client, "codex", base_image)
    folder = tempfile.mkdtemp(prefix="agentenv-gw-test-")
    os.chmod(folder, 0o755)
    session = Session("adv", Echo(), build_tokenizer())
    gateway = ThreadedGateway(session, uds=os.path.join(folder, GATEWAY_SOCKET))
    backend = DockerBackend(docker_client)
    sandbox = backend.create(SandboxSpec(image=image, gateway_dir=folder))
    sandbox.write_file("/tmp/http.py", PY_HTTP.encode())
    sandbox.exec(f"nohup {INSTALL_DIR}/bin/agentenv-gw-forward {FORWARD_PORT} >/tmp/fwd.log 2>&1 &", timeout=10)
    try:
        yield sandbox, session, gateway, folder
    finally:
        sandbox.close()
        gateway.close()
        shutil.rmtree(folder, ignore_errors=True)


def _sh(sandbox, cmd: str):
    return sandbox.exec(["bash", "-c", cmd], timeout=60)


def test_the_network_stays_off(sandbox_with_gateway) -> None:
    sandbox, *_ = sandbox_with_gateway
    ifaces = _sh(sandbox, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '").stdout.split()
    assert ifaces == ["lo"]
    r = _sh(sandbox, "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\"")
    assert r.exit_code != 0 and ("unreachable" in r.stderr.lower() or "network" in r.stderr.lower())


def test_the_mount_is_read_only_and_holds_only_the_socket(sandbox_with_gateway) -> None:
    sandbox, _, _, folder = sandbox_with_gateway
    assert _sh(sandbox, f"ls -A {GATEWAY_MOUNT}").stdout.split() == [GATEWAY_SOCKET]
    for attack in (f"touch {GATEWAY_MOUNT}/x", f"rm -f {GATEWAY_MOUNT}/{GATEWAY_SOCKET}", f"mv {GATEWAY_MOUNT}/{GATEWAY_SOCKET} /tmp/s",
                   f"ln -s /etc/shadow {GATEWAY_MOUNT}/y", f"mkdir {GATEWAY_MOUNT}/d"):
        assert _sh(sandbox, attack).exit_code != 0, attack
    assert os.listdir(folder) == [GATEWAY_SOCKET]  # nothing reached the host folder
    assert _sh(sandbox, f"test -S {GATEWAY_MOUNT}/{GATEWAY_SOCKET}").exit_code == 0


def test_the_socket_speaks_only_this_sessions_model_api(sandbox_with_gateway) -> None:
    sandbox, session, *_ = sandbox_with_gateway
    ok = _sh(sandbox, "python3 /tmp/http.py /v1/chat/completions '{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'")
    assert " 200 " in ok.stdout.splitlines()[0] and "hello from the policy" in ok.stdout
    n = len(session.calls)
    for path in ("GET /../../../../etc/passwd", "GET /v1/sessions", "GET /s/other/v1/models", "GET /docs", "GET /openapi.json"):
        r = _sh(sandbox, f"python3 /tmp/http.py '{path}' ''")
        assert " 404 " in r.stdout.splitlines()[0] and "root:" not in r.stdout, (path, r.stdout)
    for garbage in ("{broken", "[]", "{\"messages\": 5}", "{\"messages\": [{\"role\": \"user\", \"content\": {\"a\": 1}}]}"):
        r = _sh(sandbox, f"python3 /tmp/http.py /v1/messages '{garbage}'")
        assert " 400 " in r.stdout.splitlines()[0], (garbage, r.stdout)
    raw = _sh(sandbox, f"head -c 100000 /dev/urandom | python3 -c \"import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect('{GATEWAY_MOUNT}/{GATEWAY_SOCKET}'); s.sendall(sys.stdin.buffer.read()); s.settimeout(5); print(s.recv(100))\"")
    assert raw.exit_code in (0, 1)
    again = _sh(sandbox, "python3 /tmp/http.py /v1/chat/completions '{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"again\"}]}'")
    assert " 200 " in again.stdout.splitlines()[0]  # the gateway survived all of it
    assert len(session.calls) == n + 1  # only well-formed model calls are recorded


def test_the_socket_is_gone_when_the_episode_ends(docker_client, base_image) -> None:
    image = ensure_native_image(docker_client, "codex", base_image)
    folder = tempfile.mkdtemp(prefix="agentenv-gw-test-")
    os.chmod(folder, 0o755)
    gateway = ThreadedGateway(Session("gone", Echo(), build_tokenizer()), uds=os.path.join(folder, GATEWAY_SOCKET))
    sandbox = DockerBackend(docker_client).create(SandboxSpec(image=image, gateway_dir=folder))
    try:
        probe = f"python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{GATEWAY_MOUNT}/{GATEWAY_SOCKET}')\""
        assert _sh(sandbox, probe).exit_code == 0
        gateway.close()
        assert _sh(sandbox, probe).exit_code != 0
    finally:
        sandbox.close()
        shutil.rmtree(folder, ignore_errors=True)
