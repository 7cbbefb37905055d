"""The gateway's host-side bounds (issue 26), attacked over its real Unix socket: body size, connection
count, token, and token counting off the event loop."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from rollout.gateway import Session, ThreadedGateway
from rollout.gateway.app import MAX_BODY_BYTES, MAX_CONNECTIONS
from rollout.policy.types import FinishReason, Generation
from rollout.tokenizer import build_tokenizer

pytestmark = pytest.mark.unit
TOKEN = "t0ken-of-this-episode"
BODY = json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()


class Echo:
    name, version = "echo", 3

    async def generate(self, prompt, sampling, budget=None):  # noqa: ANN001, ANN201
        return Generation("hello", (), (), FinishReason.STOP, 3)


@pytest.fixture(scope="module")
def gateway() -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="agentenv-gw-bounds-")
    path = os.path.join(folder, "gw.sock")
    with ThreadedGateway(Session("bounds", Echo(), build_tokenizer()), uds=path, token=TOKEN):
        yield path


@pytest.fixture(scope="module")
def gateway_small_cap() -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="agentenv-gw-bounds-")
    path = os.path.join(folder, "gw.sock")
    with ThreadedGateway(Session("cap", Echo(), build_tokenizer(), max_prompt_tokens=1000), uds=path, token=TOKEN):
        yield path


def _request(path: str, route: str, body: bytes, *, token: str | None = TOKEN, declared: int | None = None) -> tuple[int, bytes]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(path)
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    head = (
        f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Connection: close\r\n"
        f"Content-Length: {declared if declared is not None else len(body)}\r\n\r\n"
    ).encode()
    s.sendall(head + body)
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return int(out.split(b" ", 2)[1]), out


def test_a_request_with_the_token_is_served(gateway: str) -> None:
    status, _ = _request(gateway, "/v1/messages", BODY)
    assert status == 200


def test_a_request_without_or_with_a_wrong_token_is_401(gateway: str) -> None:
    assert _request(gateway, "/v1/messages", BODY, token=None)[0] == 401
    assert _request(gateway, "/v1/messages", BODY, token="guess")[0] == 401
    assert _request(gateway, "/v1/messages/count_tokens", BODY, token=None)[0] == 401


def test_a_huge_declared_body_is_413_naming_the_limit_without_being_sent(gateway: str) -> None:
    status, out = _request(gateway, "/v1/messages", b"{", declared=768 << 20)  # only 1 byte ever sent
    assert status == 413 and b"MAX_BODY_BYTES" in out


def test_a_huge_chunked_body_is_refused_once_past_the_limit(gateway: str) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(gateway)
    s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    chunk = b"x" * (1 << 20)
    sent = 0
    try:
        while sent < 4 * MAX_BODY_BYTES:  # the attack streams far past the cap; the server answers and closes
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += len(chunk)
    except OSError:
        pass
    out = s.recv(65536)
    s.close()
    assert out.startswith(b"HTTP/1.1 413"), (sent, out[:200])
    assert sent < 4 * MAX_BODY_BYTES, "the server read the whole stream"


def test_connections_past_the_limit_are_refused_and_the_server_lives(gateway: str) -> None:
    held = []
    for _ in range(MAX_CONNECTIONS * 3):
        s = socket.socket(socket.AF_UNIX)
        s.connect(gateway)
        s.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode())
        held.append(s)  # each holds a request open, its body never sent
    time.sleep(0.5)
    refused = 0
    for s in held[MAX_CONNECTIONS:]:
        s.settimeout(5)
        try:
            refused += s.recv(100).startswith(b"HTTP/1.1 503")
        except OSError:
            pass
    for s in held:
        s.close()
    assert refused >= MAX_CONNECTIONS, refused
    time.sleep(0.5)
    assert _request(gateway, "/v1/messages", BODY)[0] == 200


def test_a_prompt_over_the_token_cap_is_400_naming_the_limit(gateway_small_cap: str) -> None:
    big = json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "word " * 5000}]}).encode()
    status, out = _request(gateway_small_cap, "/v1/messages", big)
    assert status == 400 and b"max_prompt_tokens" in out
    assert _request(gateway_small_cap, "/v1/messages", BODY)[0] == 200


def test_a_heavy_token_count_does_not_stall_other_requests(gateway: str) -> None:
    """The issue's 3.2 M-token count request: the event loop (which every session of a runner shares)
    answers another request while it is being counted (before: only after the count)."""
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "word " * 3_200_000}]}).encode()
    assert len(big) < MAX_BODY_BYTES
    sent = threading.Event()
    finished: dict[str, float] = {}

    def count() -> None:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(300)
        s.connect(gateway)
        s.sendall(
            f"POST /v1/messages/count_tokens HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Connection: close\r\nContent-Length: {len(big)}\r\n\r\n".encode() + big
        )
        sent.set()  # the whole body is with the server: counting 3.2 M tokens takes it seconds from here
        assert s.recv(100).startswith(b"HTTP/1.1 200")
        finished["count"] = time.monotonic()
        s.close()

    t = threading.Thread(target=count)
    t.start()
    assert sent.wait(120)
    time.sleep(0.2)  # the server has read the body and started counting
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(300)
    s.connect(gateway)
    s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n".encode())
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    finished["other"] = time.monotonic()
    s.close()
    t.join(300)
    assert "count" in finished, "the count request never finished"
    assert finished["other"] < finished["count"], f"the other request waited for the whole count: {finished}"
