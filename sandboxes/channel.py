"""Host side of the agent protocol, over the hijacked socket of one ``docker exec``.

``AgentChannel`` starts ``python3 /opt/agentenv/agent.py`` once with stdin
attached (``exec_create(stdin=True)`` + ``exec_start(socket=True)``) and then
sends framed requests (see ``sandboxes.agent``). Docker multiplexes the
exec's stdout and stderr onto the socket with 8-byte stream headers when no
TTY is used; the reader takes them apart, keeps stdout for the protocol and
a short tail of stderr for error messages.

The channel is authenticated: ``open`` sends a fresh random key in the
first frame (``hello``, over the exec's stdin, which only this process and
the agent hold), and from then on every frame in each direction carries a
keyed BLAKE2b tag over its direction, a sequence number, header and
payload. An answer whose tag does not verify (bytes some other process
managed to write, a replayed or reordered frame) raises ``ChannelForged``:
the sandbox is then never trusted again. The agent itself runs as root, not
as the sandbox user (see ``sandboxes.agent``).

Every call has a deadline: the socket timeout is re-armed from it before each
``recv``/``send``, so a dead or stuck agent costs at most that long. A closed
socket or a missed deadline marks the channel broken (``ChannelBroken``); the
sandbox decides whether that means the container is gone (``SandboxLost``) or
only the agent (restart it). One lock serialises callers: a request and its
answer are never interleaved with another thread's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

import docker

from sandboxes.errors import (
    SandboxError,
    SandboxFileNotFound,
    SandboxFileTooLarge,
    SandboxPermissionError,
    SpecError,
)

AGENT_DIR = "/opt/agentenv"
AGENT_PATH = AGENT_DIR + "/agent.py"
FRAME = struct.Struct(">IQ")
SEQ = struct.Struct(">Q")
MAC_SIZE = 16  # sandboxes.agent.MAC_SIZE
STREAM_HEADER = struct.Struct(">BxxxL")
STDERR_TAIL = 4096

ERROR_CLASSES: Mapping[str, type[SandboxError]] = {
    "not_found": SandboxFileNotFound,
    "permission": SandboxPermissionError,
    "bad_request": SpecError,
    "too_large": SandboxFileTooLarge,
}


class ChannelBroken(Exception):
    """The agent's stream ended or missed its deadline; the channel is unusable."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ChannelForged(ChannelBroken):
    """An answer failed authentication: something other than our agent wrote it."""


def _tag(key: bytes, direction: bytes, seq: int, frame: bytes, payload: bytes) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=MAC_SIZE, person=direction)
    h.update(SEQ.pack(seq))
    h.update(frame)
    h.update(payload)
    return h.digest()


def agent_error(header: Mapping[str, Any], what: str) -> SandboxError:
    """The ``sandboxes.errors`` exception for an agent's error answer."""
    code = str(header.get("error", "internal"))
    cls = ERROR_CLASSES.get(code, SandboxError)
    return cls(f"{what}: {header.get('message', code)} ({code})")


class AgentChannel:
    """One running agent in one container. ``call`` is thread-safe.

    Usage::

        ch = AgentChannel(client.api, container_id, user="agent")
        ch.open(deadline_s=10)
        header, payload = ch.call({"op": "ping"}, timeout=5)
    """

    def __init__(
        self,
        api: docker.APIClient,
        container_id: str,
        *,
        user: str,
        python: str = "python3",
        sandbox_user: tuple[int, int] | None = None,
        pids_limit: int = 0,
    ) -> None:
        """``user`` runs the agent (``0:0`` for the trust boundary); ``sandbox_user`` (uid, gid) is who
        its commands and file operations run as (None: as the agent itself)."""
        self._api = api
        self._container_id = container_id
        self._user = user
        self._python = python
        self._sandbox_user = sandbox_user
        self._pids_limit = pids_limit
        self._key: bytes | None = None
        self._send_seq = 0
        self._recv_seq = 0
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._holder: Any = None  # the SDK's socket wrapper; keeps the HTTP response alive
        self._stdout = bytearray()
        self._stderr_tail = bytearray()

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    @property
    def stderr_tail(self) -> str:
        return self._stderr_tail.decode(errors="replace")

    def open(self, *, timeout: float = 15.0) -> dict[str, Any]:
        """Start the agent and check it answers a ping; returns the ping answer."""
        with self._lock:
            self._close_locked()
            exec_id = self._api.exec_create(
                self._container_id,
                [self._python, "-I", "-S", AGENT_PATH],
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                user=self._user,
                workdir="/",
            )["Id"]
            holder = self._api.exec_start(exec_id, socket=True)
            raw = getattr(holder, "_sock", holder)
            if not isinstance(raw, socket.socket):
                holder.close()
                raise SandboxError(f"docker transport {type(holder).__name__} gives no raw socket")
            self._holder, self._sock = holder, raw
            self._stdout.clear()
            self._stderr_tail.clear()
            self._key, self._send_seq, self._recv_seq = None, 0, 0
            deadline = time.monotonic() + timeout
            key = secrets.token_bytes(32)
            user = {"uid": self._sandbox_user[0], "gid": self._sandbox_user[1]} if self._sandbox_user else {}
            hello = {"op": "hello", "key": key.hex(), "user": user, "pids_limit": self._pids_limit}
            answer, _ = self._call_locked(hello, b"", deadline, key=key)
            if not answer.get("ok"):
                self._close_locked()
                raise ChannelBroken(f"agent refused the hello: {answer.get('message')}")
            header, _ = self._call_locked({"op": "ping"}, b"", deadline)
            return header

    def close(self) -> None:
        """Close the socket; the agent sees EOF on stdin and exits."""
        with self._lock:
            self._close_locked()

    def call(
        self, header: Mapping[str, Any], payload: bytes = b"", *, timeout: float
    ) -> tuple[dict[str, Any], bytes]:
        """Send one request, wait for its answer until ``timeout`` seconds pass."""
        with self._lock:
            if self._sock is None:
                raise ChannelBroken("agent channel is closed")
            return self._call_locked(header, payload, time.monotonic() + timeout)

    # -- internals (lock held) ------------------------------------------------

    def _call_locked(
        self,
        header: Mapping[str, Any],
        payload: bytes,
        deadline: float,
        *,
        key: bytes | None = None,
    ) -> tuple[dict[str, Any], bytes]:
        """One request and its answer; the hello goes untagged and its answer is the first tagged one."""
        try:
            head = json.dumps(header).encode()
            frame = FRAME.pack(len(head), len(payload)) + head
            self._send(frame, deadline)
            if payload:
                self._send(payload, deadline)
            if self._key is not None:
                self._send(_tag(self._key, b"request", self._send_seq, frame, payload), deadline)
                self._send_seq += 1
            elif key is not None:
                self._key = key  # the agent tags from its answer to the hello on
            raw_frame = self._read(FRAME.size, deadline)
            head_len, payload_len = FRAME.unpack(raw_frame)
            raw_head = self._read(head_len, deadline)
            body = self._read(payload_len, deadline)
            if self._key is not None:
                tag = self._read(MAC_SIZE, deadline)
                want = _tag(self._key, b"answer", self._recv_seq, raw_frame + raw_head, body)
                if not hmac.compare_digest(tag, want):
                    raise ChannelForged(
                        f"answer #{self._recv_seq} to {header.get('op')!r} failed authentication: "
                        "bytes not written by the agent reached the channel"
                    )
                self._recv_seq += 1
            answer = json.loads(raw_head)
        except ChannelBroken:
            self._close_locked()
            raise
        except (ValueError, struct.error) as exc:
            self._close_locked()
            raise ChannelForged(f"answer to {header.get('op')!r} is not a frame of ours: {exc}") from exc
        return answer, body

    def _send(self, data: bytes, deadline: float) -> None:
        assert self._sock is not None
        view = memoryview(data)
        while view:
            self._sock.settimeout(self._remaining(deadline, "send"))
            try:
                sent = self._sock.send(view[: 1 << 20])
            except TimeoutError:
                raise ChannelBroken("agent did not accept input before the deadline", timed_out=True) from None
            except OSError as exc:
                raise ChannelBroken(f"agent socket failed on send: {exc}") from exc
            view = view[sent:]

    def _read(self, n: int, deadline: float) -> bytes:
        """``n`` bytes of the agent's stdout, taking docker's stream frames apart."""
        while len(self._stdout) < n:
            kind, size = STREAM_HEADER.unpack(self._recv_exact(STREAM_HEADER.size, deadline))
            data = self._recv_exact(size, deadline)
            if kind == 1:
                self._stdout += data
            elif kind == 2:
                self._stderr_tail = (self._stderr_tail + data)[-STDERR_TAIL:]
        out = bytes(self._stdout[:n])
        del self._stdout[:n]
        return out

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        assert self._sock is not None
        buf = bytearray()
        while len(buf) < n:
            self._sock.settimeout(self._remaining(deadline, "answer"))
            try:
                chunk = self._sock.recv(min(n - len(buf), 1 << 20))
            except TimeoutError:
                raise ChannelBroken("agent did not answer before the deadline", timed_out=True) from None
            except OSError as exc:
                raise ChannelBroken(f"agent socket failed: {exc}") from exc
            if not chunk:
                raise ChannelBroken("agent stream ended (EOF)" + self._stderr_note())
            buf += chunk
        return bytes(buf)

    def _remaining(self, deadline: float, what: str) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ChannelBroken(f"agent {what} deadline passed", timed_out=True)
        return left

    def _stderr_note(self) -> str:
        tail = self.stderr_tail.strip()
        return f"; agent stderr: {tail[-500:]}" if tail else ""

    def _close_locked(self) -> None:
        if self._sock is not None:
            for closer in (lambda: self._sock.shutdown(socket.SHUT_RDWR), self._sock.close, self._holder.close):  # type: ignore[union-attr]
                try:
                    closer()
                except OSError:
                    pass
        self._sock = None
        self._holder = None


__all__ = ["AGENT_DIR", "AGENT_PATH", "AgentChannel", "ChannelBroken", "ChannelForged", "agent_error"]
