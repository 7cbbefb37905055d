"""Running one command of a ``LocalBackend`` sandbox: deadline, output cap, bubblewrap.

Split out of ``local_backend`` because it is the part that talks to the kernel
(process groups, pipes, namespaces) and can be read and tested on its own.

``run_bounded`` is the one place where a command runs. It starts the command
in a new session (so it leads its own process group), feeds ``stdin``, keeps at
most ``limit`` bytes of each stream and drains and drops the rest (a flood never
fills memory and never blocks the writer), and on the deadline kills the whole
group with SIGKILL. Children that left the group (``setsid``, double fork) are
found by the marker variable every sandbox command carries in its environment
(``AGENTENV_SANDBOX_ID``) and killed too: best effort, since a process may
rewrite its own environment. Under bubblewrap the command is pid 1's child in
its own pid namespace, so killing bubblewrap kills everything, no marker needed.

Linux only: it reads ``/proc`` and relies on ``prlimit`` (util-linux) for rlimits
instead of ``preexec_fn``, which may deadlock a child forked from a threaded
process (Ray workers are threaded).
"""

from __future__ import annotations

import functools
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sandboxes.types import ExecResult

MARKER_VAR = "AGENTENV_SANDBOX_ID"
TIMEOUT_EXIT_CODE = 124
# After the command itself exits, how long we keep reading pipes still held open
# by its background children before returning (they keep running, without us).
_EXIT_GRACE_S = 0.25
_CHUNK = 1 << 16

# Host paths bound read-only into every bubblewrap sandbox; the names a sandbox's
# own top-level directories may not take (they would shadow or be shadowed).
SYSTEM_DIRS: tuple[str, ...] = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
RESERVED_TOP: frozenset[str] = frozenset((*SYSTEM_DIRS, "proc", "dev", "sys", "etc"))
_ETC_ALWAYS = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")
_ETC_NETWORK = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates")


@dataclass(frozen=True)
class Limits:
    """Per-process rlimits applied through ``prlimit``; ``None`` leaves one unset.

    ``address_space`` (RLIMIT_AS) bounds *virtual* memory per process, not the
    resident total of the sandbox: a runtime that reserves large virtual ranges
    (Go, JVM, many threads) may fail below the spec's memory, and ten processes
    may each use the full amount.
    """

    address_space: int | None = None
    file_size: int | None = None

    def argv(self, *, inside_bwrap: bool) -> list[str]:
        """The ``prlimit`` prefix, or nothing where prlimit is missing (or not visible to bwrap)."""
        prlimit = _which("prlimit")
        if prlimit is None or (inside_bwrap and prlimit.split("/")[1] not in SYSTEM_DIRS):
            return []
        opts = ["--core=0"]
        if self.address_space is not None:
            opts.append(f"--as={self.address_space}")
        if self.file_size is not None:
            opts.append(f"--fsize={self.file_size}")
        return [prlimit, *opts, "--"]


@functools.cache
def _which(program: str) -> str | None:
    return shutil.which(program)


@functools.cache
def _system_binds() -> tuple[str, ...]:
    args: list[str] = []
    for name in SYSTEM_DIRS:
        host = "/" + name
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    return tuple(args)


def bwrap_argv(
    *,
    fs_root: str,
    top_entries: Sequence[str],
    chdir: str,
    network: bool,
    hostname: str = "agentenv",
) -> list[str]:
    """The bubblewrap prefix for one command of a sandbox whose files live in ``fs_root``.

    The sandbox's root is a read-only tmpfs; each real top-level directory or
    file of ``fs_root`` (``top_entries``, already checked not to be symlinks or
    reserved names) is bound read-write at ``/<name>``, next to the host's
    system directories bound read-only. A write outside those entries fails
    with EROFS instead of silently vanishing at the end of the command.
    """
    bwrap = _which("bwrap") or "bwrap"
    args = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        hostname,
        "--die-with-parent",
        "--new-session",
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    if not network:
        args.insert(2, "--unshare-net")
    for path in _ETC_ALWAYS + (_ETC_NETWORK if network else ()):
        args += ["--ro-bind-try", path, path]
    for name in top_entries:
        args += ["--bind", os.path.join(fs_root, name), "/" + name]
    args += ["--remount-ro", "/", "--chdir", chdir, "--"]
    return args


@dataclass(frozen=True)
class BwrapProbe:
    """What probing bubblewrap on this host found: ``works``, and ``reason`` in words either way.

    ``reason`` names the cause when it does not work (``bwrap`` not on PATH, or
    bwrap's own error, e.g. "No permissions to create new namespace"), so a
    backend that falls back to plain subprocesses can say why.
    """

    works: bool
    reason: str
    bwrap: str | None = None  # the binary probed, when there is one


def _probe_bwrap() -> BwrapProbe:
    bwrap = _which("bwrap")
    if bwrap is None:
        return BwrapProbe(False, "bwrap is not on PATH (install the bubblewrap package)")
    if not os.path.isdir("/usr"):
        return BwrapProbe(False, "/usr is not a directory on this host: nothing to bind read-only", bwrap)
    probe = bwrap_argv(fs_root="/nonexistent", top_entries=(), chdir="/", network=False)
    try:
        done = subprocess.run([*probe, "/bin/sh", "-c", "exit 0"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return BwrapProbe(False, f"running {bwrap} failed: {exc}", bwrap)
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        why = said[-1] if said else "no message"
        return BwrapProbe(False, f"{bwrap} cannot make the sandbox's namespaces here (exit {done.returncode}: {why})", bwrap)
    return BwrapProbe(True, f"{bwrap} made user, pid, ipc, uts and network namespaces and a read-only root", bwrap)


@functools.cache
def probe_bwrap() -> BwrapProbe:
    """Whether bubblewrap can make the namespaces we need on this host, and why (probed once).

    It fails inside many containers (no unprivileged user namespaces, seccomp),
    so the answer is measured, not assumed from ``which bwrap``.
    """
    return _probe_bwrap()


def bwrap_works() -> bool:
    """``probe_bwrap().works``."""
    return probe_bwrap().works


def kill_marked(marker: str) -> int:
    """SIGKILL every process whose environment carries ``MARKER_VAR=marker``; count them.

    Catches what escaped the process group (``setsid``, daemons) on the
    plain-subprocess path. Processes of other users are unreadable and skipped.
    """
    needle = f"{MARKER_VAR}={marker}".encode()
    me = os.getpid()
    killed = 0
    for _ in range(3):  # a dying parent may fork once more; look again
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                    found += 1
                except OSError:
                    pass
        killed += found
        if not found:
            break
        time.sleep(0.02)
    return killed


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bounded(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    stdin: bytes | None,
    timeout: float,
    limit: int,
    marker: str | None = None,
) -> ExecResult:
    """Run ``argv`` to completion or to ``timeout`` seconds, whichever comes first.

    Exit codes follow the shell: ``128 + N`` for death by signal N, 124 on the
    deadline. Each stream keeps its first ``limit`` bytes (``truncated`` says
    whether anything was dropped) and is decoded as UTF-8 with replacement.
    Raises ``OSError`` only when the program cannot be started at all.
    """
    start = time.monotonic()
    deadline = start + timeout
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    truncated = False
    timed_out = False
    pending = memoryview(stdin or b"")
    sel = selectors.DefaultSelector()
    for fd in kept:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    if proc.stdin is not None:
        if pending:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > _EXIT_GRACE_S:
                break
            for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
                fd = int(key.fd)
                if fd not in kept:  # stdin is writable
                    try:
                        pending = pending[os.write(fd, pending[:_CHUNK]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the command stopped reading: drop the rest
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        assert proc.stdin is not None
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, _CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                room = limit - len(kept[fd])
                if len(chunk) > room:
                    truncated = True
                kept[fd] += chunk[: max(room, 0)]
    finally:
        sel.close()
        if timed_out:
            _kill_group(proc.pid)
            if marker is not None:
                kill_marked(marker)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            _kill_group(proc.pid)
            code = proc.wait()
    if timed_out:
        code = TIMEOUT_EXIT_CODE
    elif code < 0:
        code = 128 - code
    return ExecResult(
        exit_code=code,
        stdout=kept[out_fd].decode("utf-8", "replace"),
        stderr=kept[err_fd].decode("utf-8", "replace"),
        timed_out=timed_out,
        truncated=truncated,
        duration_s=time.monotonic() - start,
    )


__all__ = [
    "MARKER_VAR",
    "RESERVED_TOP",
    "TIMEOUT_EXIT_CODE",
    "BwrapProbe",
    "Limits",
    "bwrap_argv",
    "bwrap_works",
    "kill_marked",
    "probe_bwrap",
    "run_bounded",
]
