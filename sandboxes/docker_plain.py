"""The fallback transport for images without ``python3``: one ``docker exec`` per call.

Slower (tens of ms per call) but needs only a POSIX shell and coreutils or
busybox in the image. Deadlines: the command runs under ``timeout -s KILL``,
which puts itself and the command in a new process group and kills that
whole group; the host also stops reading at the deadline plus a grace.
Files go through ``cat`` run as the sandbox user (never ``put_archive``,
which would write as root and bypass the user's permissions).
"""

from __future__ import annotations

import shlex
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import docker

from sandboxes.errors import SandboxError, SandboxFileNotFound, SandboxFileTooLarge, SandboxLost, SandboxPermissionError
from sandboxes.types import ExecResult, FileEntry

GRACE_S = 10.0
STREAM_HEADER = struct.Struct(">BxxxL")


class PlainExec:
    """Runs commands with ``docker exec`` and maps file operations onto shell commands."""

    def __init__(self, api: docker.APIClient, container: Any, *, user: str, lost: Callable[[str], SandboxLost]) -> None:
        self._api = api
        self._container = container
        self._user = user
        self._lost = lost

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float,
        cwd: str,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        limit: int,
    ) -> ExecResult:
        inner = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        argv = ["timeout", "-s", "KILL", f"{max(timeout, 0.001):.3f}", *inner]
        start = time.monotonic()
        code, out, err, truncated = self.run_raw(argv, cwd=cwd, env=env, stdin=stdin, limit=limit, deadline=start + timeout + GRACE_S)
        duration = time.monotonic() - start
        timed_out = code == 137 and duration >= timeout
        return ExecResult(
            exit_code=124 if timed_out else code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=timed_out,
            truncated=truncated,
            duration_s=duration,
        )

    def run_raw(
        self,
        argv: list[str],
        *,
        cwd: str = "/",
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        limit: int = 1 << 30,
        deadline: float | None = None,
    ) -> tuple[int, bytes, bytes, bool]:
        """Run ``argv``; return exit code, stdout, stderr (each capped at ``limit``), truncated."""
        deadline = deadline if deadline is not None else time.monotonic() + 60.0
        try:
            exec_id = self._api.exec_create(
                self._container.id, argv, stdin=stdin is not None, user=self._user, workdir=cwd,
                environment=dict(env or {}),
            )["Id"]
            holder = self._api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as exc:
            raise self._lost(f"docker exec failed: {exc}") from exc
        sock: socket.socket = getattr(holder, "_sock", holder)
        bufs = [bytearray(), bytearray()]
        truncated = False
        try:
            if stdin is not None:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.sendall(stdin)
                sock.shutdown(socket.SHUT_WR)
            pending = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(f"docker exec of {argv[4:] or argv} gave no end of output before its deadline")
                sock.settimeout(left)
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                pending += chunk
                while len(pending) >= 8:
                    kind, size = STREAM_HEADER.unpack_from(pending)
                    if len(pending) < 8 + size:
                        break
                    data, pending = pending[8 : 8 + size], pending[8 + size :]
                    buf = bufs[0 if kind == 1 else 1]
                    room = limit - len(buf)
                    truncated |= len(data) > room
                    buf += data[: max(room, 0)]
        except OSError as exc:
            raise self._lost(f"docker exec stream failed: {exc}") from exc
        finally:
            holder.close()
        code = self._api.exec_inspect(exec_id).get("ExitCode")
        return (code if code is not None else 137), bytes(bufs[0]), bytes(bufs[1]), truncated

    def _checked(self, argv: list[str], path: str, stdin: bytes | None = None) -> bytes:
        code, out, err, _ = self.run_raw(argv, stdin=stdin)
        if code != 0:
            msg = err.decode(errors="replace").strip()
            if "No such file" in msg or "not found" in msg:
                raise SandboxFileNotFound(f"{path}: {msg}")
            if "ermission denied" in msg or "Read-only" in msg:
                raise SandboxPermissionError(f"{path}: {msg}")
            raise SandboxError(f"{path}: {argv[0]} exited {code}: {msg}")
        return out

    def read_file(self, path: str, *, limit: int) -> bytes:
        code, out, err, truncated = self.run_raw(["cat", "--", path], limit=limit + 1)
        if code != 0:
            return self._checked(["cat", "--", path], path)  # the same error, classified
        if truncated or len(out) > limit:
            raise SandboxFileTooLarge(f"{path}: over the {limit}-byte read limit")
        return out

    def write_file(self, path: str, data: bytes, *, mode: int | None, owner: tuple[int, int]) -> None:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && { [ -z "$2" ] || chmod "$2" "$1" 2>/dev/null || true; }'
        self._checked(["/bin/sh", "-c", script, "sh", path, "" if mode is None else f"{mode:o}"], path, stdin=data)

    def list_files(self, path: str, *, recursive: bool) -> list[FileEntry]:
        depth = "" if recursive else "-maxdepth 1"
        script = f"cd -- {shlex.quote(path)} && find . -mindepth 1 {depth} -exec stat -c '%s|%f|%n' {{}} +"
        out = self._checked(["/bin/sh", "-c", script], path)
        entries = []
        for line in out.decode(errors="replace").splitlines():
            size, raw_mode, name = line.split("|", 2)
            mode = int(raw_mode, 16)
            kind = mode & 0o170000
            full = path.rstrip("/") + "/" + name[2:]
            entries.append(FileEntry(full, int(size), kind == 0o040000, mode & 0o7777, kind == 0o120000))
        return sorted(entries, key=lambda e: e.path)


__all__ = ["PlainExec"]
