"""The in-container agent: one long-lived process that runs commands and moves files.

Why it exists: a plain ``docker exec`` costs tens of milliseconds (an HTTP
round trip, a runc exec, a new process). This program is started once per
container, through ONE ``docker exec`` with stdin attached, and then answers
requests over its stdin/stdout. A round trip is then two pipe hops, well
under five milliseconds.

It is stdlib-only and copied into the container before start
(``/opt/agentenv/agent.py``), so any image with ``python3`` (3.8+) works.

Framing, both directions: ``struct(">IQ")`` = header length, payload length;
then a UTF-8 JSON header; then the raw payload bytes. Requests carry
``{"op": ...}``; answers carry ``{"ok": true, ...}`` or
``{"ok": false, "error": <code>, "message": ...}`` with codes ``not_found``,
``permission``, ``is_a_directory``, ``not_a_directory``, ``os_error``,
``bad_request``, ``internal`` (the client maps them to ``sandboxes.errors``).
The agent never writes anything unsolicited to stdout: ``sys.stdout`` is
pointed at stderr so a stray print cannot corrupt the protocol.

What it does NOT protect against: it runs as the sandbox user, so that user
can kill it (the client then restarts it); the OOM killer prefers the
command's processes (``oom_score_adj`` 1000) but may still pick the agent.
"""

import errno
import io
import json
import os
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import time

FRAME = struct.Struct(">IQ")
CHUNK = 1 << 16
MANIFEST_NAME = ".agentenv-snapshot.json"
POST_EXIT_DRAIN_S = 0.2  # read what background children still write after the command exits
SHELL = "/bin/sh"  # like LocalBackend: one shell language on every backend; and dash starts fast
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")


class Fail(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def read_exact(fd, n):
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def send(fd, header, payload=b""):
    head = json.dumps(header).encode()
    write_all(fd, FRAME.pack(len(head), len(payload)) + head + payload)


def oom_kills():
    """The memory cgroup's OOM-kill counter (v1 oom_control or v2 memory.events), or None."""
    for path in OOM_FILES:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def prefer_for_oom(pid):
    """Make the OOM killer pick the command, not the agent (raising is unprivileged).

    Written right after spawn rather than in a ``preexec_fn``: that would force
    ``fork`` over ``vfork`` and cost about a millisecond per command. Children
    the command forks after this inherit the score.
    """
    try:
        with open("/proc/%d/oom_score_adj" % pid, "w") as f:
            f.write("1000")
    except OSError:
        pass


def kill_group(proc):
    """SIGKILL the command's group until it is empty (a fork bomb keeps adding members).

    The command itself is reaped here; its orphans are reaped by the container's
    init, so ``killpg`` stops finding the group once every member is gone.
    """
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        proc.poll()
        time.sleep(0.002)


def op_exec(req, payload):
    cmd = req["cmd"]
    argv = [SHELL, "-c", cmd] if isinstance(cmd, str) else list(cmd)
    cwd = req.get("cwd") or "/"
    if not os.path.isdir(cwd):
        raise Fail("not_found", "working directory %s does not exist" % cwd)
    env = dict(os.environ)
    env.update(req.get("env") or {})
    limit = int(req.get("limit", 1 << 20))
    timeout = float(req.get("timeout", 60.0))
    start = time.monotonic()
    before = oom_kills()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, start_new_session=True,
            stdin=subprocess.PIPE if payload else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
    except OSError as exc:
        code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
        msg = ("cannot run %r: %s\n" % (argv[0], exc)).encode()
        return {"ok": True, "exit_code": code, "timed_out": False, "truncated": False,
                "oom_killed": False, "duration_s": time.monotonic() - start, "stdout_len": 0}, msg
    prefer_for_oom(proc.pid)
    out = run_io(proc, payload, start + timeout, limit)
    timed_out, truncated, bufs = out
    if timed_out:
        exit_code = 124
    else:
        rc = proc.returncode
        exit_code = 128 - rc if rc < 0 else rc
    after = oom_kills()
    oom = before is not None and after is not None and after > before
    stdout, stderr = bytes(bufs[0]), bytes(bufs[1])
    header = {"ok": True, "exit_code": exit_code, "timed_out": timed_out, "truncated": truncated,
              "oom_killed": oom, "duration_s": time.monotonic() - start, "stdout_len": len(stdout)}
    return header, stdout + stderr


def run_io(proc, stdin_data, deadline, limit):
    """Pump stdin/stdout/stderr until the command is done or its deadline passes."""
    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    old_wakeup = signal.set_wakeup_fd(wake_w)
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    bufs = (bytearray(), bytearray())
    truncated = False
    for i, pipe in enumerate((proc.stdout, proc.stderr)):
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe.fileno(), selectors.EVENT_READ, i)
    pending = memoryview(stdin_data or b"")
    if proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "in")
    timed_out = False
    exited_at = None
    open_pipes = 2
    try:
        while open_pipes:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > POST_EXIT_DRAIN_S:
                break  # a background child keeps the pipe open: stop listening
            if not timed_out and now >= deadline:
                timed_out = True
                kill_group(proc)
                deadline = now + 1.0  # drain what is left, briefly
            elif timed_out and now >= deadline:
                break
            wait = min(deadline, exited_at + POST_EXIT_DRAIN_S if exited_at else deadline) - now
            for key, _ in sel.select(max(wait, 0.0)):
                tag = key.data
                if tag == "wake":
                    try:
                        os.read(wake_r, 512)
                    except BlockingIOError:
                        pass
                elif tag == "in":
                    try:
                        pending = pending[os.write(key.fd, pending[:CHUNK]) :]
                    except (BrokenPipeError, OSError):
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(key.fd)
                        proc.stdin.close()
                else:
                    try:
                        chunk = os.read(key.fd, CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(key.fd)
                        open_pipes -= 1
                        continue
                    room = limit - len(bufs[tag])
                    if len(chunk) > room:
                        truncated = True
                    bufs[tag].extend(chunk[: max(room, 0)])
        if proc.poll() is None:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                timed_out = True
                kill_group(proc)
                proc.wait()
    finally:
        signal.set_wakeup_fd(old_wakeup)
        sel.close()
        for fd in (wake_r, wake_w):
            os.close(fd)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return timed_out, truncated, bufs


def op_read_file(req, payload):
    path = req["path"]
    if os.path.isdir(path):
        raise Fail("is_a_directory", "%s is a directory" % path)
    with open(path, "rb") as f:
        return {"ok": True}, f.read()


def op_write_file(req, payload):
    path = req["path"]
    mode = int(req.get("mode", 0o644))
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, payload)
        try:
            os.fchmod(fd, mode)
        except PermissionError:
            pass  # writable but not ours: keep its mode
    finally:
        os.close(fd)
    return {"ok": True}, b""


def _entry(path, st):
    return {"path": path, "size": st.st_size, "is_dir": stat.S_ISDIR(st.st_mode),
            "mode": stat.S_IMODE(st.st_mode), "is_symlink": stat.S_ISLNK(st.st_mode)}


def op_list_files(req, payload):
    root = req["path"]
    if not os.path.isdir(root):
        os.stat(root)  # raises not_found / permission
        raise Fail("not_a_directory", "%s is not a directory" % root)
    entries = []
    if req.get("recursive"):
        for dirpath, dirs, files in os.walk(root, onerror=_raise):
            for name in dirs + files:
                full = os.path.join(dirpath, name)
                entries.append(_entry(full, os.lstat(full)))
    else:
        for item in os.scandir(root):
            entries.append(_entry(item.path, item.stat(follow_symlinks=False)))
    entries.sort(key=lambda e: e["path"])
    return {"ok": True}, json.dumps(entries).encode()


def _raise(exc):
    raise exc


def op_pack(req, payload):
    """Tar ``paths`` (each non-recursively; parents first) after a manifest member."""
    buf = io.BytesIO()
    unreadable, missing = [], []
    manifest = json.dumps(req.get("manifest") or {}).encode()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        for path in sorted(req["paths"]):
            try:
                tar.add(path, arcname=path.lstrip("/"), recursive=False)
            except FileNotFoundError:
                missing.append(path)
            except PermissionError:
                unreadable.append(path)
    return {"ok": True, "unreadable": unreadable, "missing": missing}, buf.getvalue()


def _remove(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def op_unpack(req, payload):
    """Apply a ``pack`` blob: deletions and opaque dirs first, then every member."""
    failed = []
    dir_times = []
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as tar:
        members = tar.getmembers()
        manifest = {}
        if members and members[0].name == MANIFEST_NAME:
            manifest = json.loads(tar.extractfile(members[0]).read())
            members = members[1:]
        for path in manifest.get("deleted", []):
            _guard(failed, path, _remove, path)
        for path in manifest.get("opaque", []):
            if os.path.isdir(path):
                for name in os.listdir(path):
                    _guard(failed, path, _remove, os.path.join(path, name))
        for m in members:
            path = "/" + m.name.lstrip("/")
            _guard(failed, path, _extract_one, tar, m, path, dir_times)
    for path, mode, mtime in reversed(dir_times):
        try:
            os.chmod(path, mode)
            os.utime(path, (mtime, mtime))
        except OSError:
            pass  # an existing system directory we do not own
    return {"ok": True, "failed": failed}, b""


def _guard(failed, path, fn, *args):
    try:
        fn(*args)
    except OSError as exc:
        failed.append("%s: %s" % (path, exc))


def _extract_one(tar, m, path, dir_times):
    if m.isdir():
        if not os.path.isdir(path):
            _remove(path)
            os.makedirs(path, mode=0o700)
        dir_times.append((path, m.mode, m.mtime))
        return
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent)
    _remove(path)
    if os.path.lexists(path):
        # fuse-overlayfs: unlinking a file that was renamed over a lower-layer file uncovers
        # the lower one instead of whiting it out (PostgreSQL replaces its files that way)
        _remove(path)
    if m.issym():
        os.symlink(m.linkname, path)
        return
    if m.islnk():
        os.link("/" + m.linkname.lstrip("/"), path)
        return
    if m.isfifo():
        os.mkfifo(path, m.mode)
    elif m.isreg():
        src = tar.extractfile(m)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            while True:
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                write_all(fd, chunk)
        finally:
            os.close(fd)
    else:
        return  # devices cannot be made without capabilities; never in a snapshot of ours
    if os.geteuid() == 0:
        try:
            os.lchown(path, m.uid, m.gid)
        except OSError:
            pass
    os.chmod(path, m.mode)
    os.utime(path, (m.mtime, m.mtime))


_HELPERS: dict = {}  # sha256 of a helper's source -> its namespace, compiled once per agent


def op_helper(req, payload):
    """Run a stdlib helper module (its source is the payload) in this process: ``run(request, skip)``.

    Saves an interpreter start per call; the host sends only code it ships
    (``sandboxes/reset_helper.py``). Compiled once per source, by its sha256.
    """
    import hashlib

    digest = hashlib.sha256(payload).hexdigest()
    ns = _HELPERS.get(digest)
    if ns is None:
        ns = {"__name__": "agentenv_helper"}
        exec(compile(payload.decode(), "<helper %s>" % digest[:12], "exec"), ns)  # noqa: S102 - host-shipped code
        _HELPERS[digest] = ns
    out = ns["run"](req["request"], {os.getpid()})
    return {"ok": True}, json.dumps(out).encode()


def op_ping(req, payload):
    return {"ok": True, "pid": os.getpid(), "uid": os.getuid(), "python": sys.version.split()[0]}, b""


OPS = {
    "ping": op_ping,
    "exec": op_exec,
    "read_file": op_read_file,
    "write_file": op_write_file,
    "list_files": op_list_files,
    "pack": op_pack,
    "unpack": op_unpack,
    "helper": op_helper,
}

ERRNO_CODES = {
    errno.ENOENT: "not_found",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EROFS: "permission",
    errno.EISDIR: "is_a_directory",
    errno.ENOTDIR: "not_a_directory",
}


def handle(req, payload):
    try:
        op = OPS.get(req.get("op"))
        if op is None:
            raise Fail("bad_request", "unknown op %r" % (req.get("op"),))
        return op(req, payload)
    except Fail as exc:
        return {"ok": False, "error": exc.code, "message": str(exc)}, b""
    except OSError as exc:
        code = ERRNO_CODES.get(exc.errno, "os_error")
        return {"ok": False, "error": code, "message": str(exc)}, b""
    except (KeyError, TypeError, ValueError) as exc:
        return {"ok": False, "error": "bad_request", "message": repr(exc)}, b""
    except Exception as exc:  # the agent must survive anything one request does
        return {"ok": False, "error": "internal", "message": repr(exc)}, b""


def main():
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints go to stderr, never into the protocol stream
    sys.stdout = sys.stderr
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through set_wakeup_fd
    # SIGPIPE stays ignored here (Python's default): writing a command's stdin after the command
    # exited must raise BrokenPipeError in run_io, not kill the agent. Children get SIG_DFL back
    # through Popen(restore_signals=True).
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    while True:
        try:
            head_len, payload_len = FRAME.unpack(read_exact(0, FRAME.size))
            req = json.loads(read_exact(0, head_len))
            payload = read_exact(0, payload_len)
        except EOFError:
            return
        header, body = handle(req, payload)
        try:
            send(out_fd, header, body)
        except BrokenPipeError:
            return  # the host side hung up: nobody is left to answer



if __name__ == "__main__":
    main()
