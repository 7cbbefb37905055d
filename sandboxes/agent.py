"""The in-container agent: one long-lived process that runs commands and moves files.

Why it exists: a plain ``docker exec`` costs tens of milliseconds (an HTTP
round trip, a runc exec, a new process). This program is started once per
container, through ONE ``docker exec`` with stdin attached, and then answers
requests over its stdin/stdout. A round trip is then two pipe hops, well
under five milliseconds.

It is stdlib-only and copied into the container before start
(``/opt/agentenv/agent.py``, root-owned), so any image with ``python3``
(3.9+) works.

The trust boundary (see docs/sandboxes.md): the agent runs as root with only
the capabilities the container was given (SETUID, SETGID, KILL, CHOWN,
FOWNER, DAC_OVERRIDE), never as the sandbox user. Commands run as the sandbox
user (``Popen(user=..., group=..., extra_groups=...)``), file operations the
model asks for run with the sandbox user's effective ids (``seteuid``: the
real and saved uid stay 0), so the kernel refuses the sandbox user every
signal, ``ptrace`` and ``/proc/<agent>/fd`` access to this process. Every
frame after the ``hello`` carries a keyed BLAKE2b MAC over a per-direction
sequence number, the frame header and the payload; the key arrives in the
``hello`` over stdin and lives only in this process's memory. Bytes that did
not come from this process are rejected by the host.

Framing, both directions: ``struct(">IQ")`` = header length, payload length;
then a UTF-8 JSON header; then the raw payload bytes; then (after ``hello``)
a ``MAC_SIZE``-byte tag. Requests carry ``{"op": ...}``; answers carry
``{"ok": true, ...}`` or ``{"ok": false, "error": <code>, "message": ...}``
with codes ``not_found``, ``permission``, ``is_a_directory``,
``not_a_directory``, ``not_regular``, ``too_large``, ``os_error``,
``bad_request``, ``internal`` (the client maps them to ``sandboxes.errors``).
The agent never writes anything unsolicited to stdout: ``sys.stdout`` is
pointed at stderr so a stray print cannot corrupt the protocol.

What it does NOT protect against: a sandbox user that is root (uid 0: the
host then marks the sandbox untrusted: no in-place grading, no reset), a
kernel exploit, and the OOM killer picking the agent (commands get
``oom_score_adj`` 1000 so it prefers them).
"""

import errno
import hashlib
import hmac
import io
import json
import os
import pwd
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
SEQ = struct.Struct(">Q")
MAC_SIZE = 16
CHUNK = 1 << 16
READ_LIMIT = 64 << 20  # sandboxes.types.READ_LIMIT
KILL_WINDOW_S = 2.0
REAP_WAIT_S = 5.0  # the longest a command waits for a killed bomb's slots to free (loaded hosts are slow)
YOUNG_S = 0.1  # an earlier command's process born this recently may be a bomb still growing
SETTLE_S = 0.3  # the longest a command waits for such processes to show what they are
CLK_TCK = os.sysconf("SC_CLK_TCK")
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


class Session:
    """What the ``hello`` set: the MAC key, the sandbox user, and the sequence numbers."""

    key = None
    uid = None
    gid = None
    groups = ()
    env: dict = {}
    pids_limit = 0
    recv_seq = 0
    send_seq = 0


def mac(direction, seq, head_frame, payload):
    h = hashlib.blake2b(key=Session.key, digest_size=MAC_SIZE, person=direction)
    h.update(SEQ.pack(seq))
    h.update(head_frame)
    h.update(payload)
    return h.digest()


def send(fd, header, payload=b""):
    head = json.dumps(header).encode()
    frame = FRAME.pack(len(head), len(payload)) + head
    tag = b""
    if Session.key is not None:
        tag = mac(b"answer", Session.send_seq, frame, payload)
        Session.send_seq += 1
    write_all(fd, frame + payload + tag)


class as_user:
    """File operations with the sandbox user's effective ids (real and saved uid stay 0).

    The kernel checks file access against the effective (fs) ids, so the model's
    reads and writes get exactly the sandbox user's permissions and ownership,
    while signals and ptrace still need a real or saved uid of 0.
    """

    def __enter__(self):
        if Session.uid:
            os.setgroups(list(Session.groups))
            os.setegid(Session.gid)
            os.seteuid(Session.uid)
        return self

    def __exit__(self, *exc):
        if Session.uid:
            os.seteuid(0)
            os.setegid(0)
            os.setgroups([])
        return False


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


def user_stats():
    """(pid, the fields of /proc/pid/stat after the name) of every process of the sandbox user."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat("/proc/" + name).st_uid != Session.uid:
                continue
            with open("/proc/%s/stat" % name, "rb") as f:
                raw = f.read()
        except OSError:
            continue  # exited meanwhile
        yield int(name), raw[raw.rindex(b")") + 2 :].split()  # comm may hold spaces and parentheses


def user_processes():
    """{pid: (ppid, start ticks, session id)} of every process of the sandbox user (zombies left out)."""
    return {pid: (int(rest[1]), int(rest[19]), int(rest[3])) for pid, rest in user_stats() if rest[0] != b"Z"}


PIDS_FILES = ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids.current")


def pids_in_use():
    """Tasks the container's pids limit counts now (zombies and threads too), or None."""
    for path in PIDS_FILES:
        try:
            with open(path) as f:
                return int(f.read())
        except (OSError, ValueError):
            continue
    return None


class Command:
    """What tells one command's processes from the rest: when it started, and the sessions before it.

    Every command runs in a session of its own; what it starts stays in that session or, through
    ``setsid``, makes new ones, none of which existed before it. An earlier job's descendants keep
    that job's session even once orphaned, so they are never taken for this command's.
    """

    def __init__(self):
        self.born = 0
        before = user_processes() if Session.uid else {}
        self.old_pids = set(before)  # start times tick every 10 ms: a process seen now is never this command's
        self.old_sessions = {sid for _, _, sid in before.values()}

    def mine(self, procs):
        return [pid for pid, (_, started, sid) in procs.items()
                if started >= self.born and sid not in self.old_sessions and pid not in self.old_pids]

    def not_mine(self, procs):
        mine = set(self.mine(procs))
        return [pid for pid in procs if pid not in mine]


def start_ticks_of(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read()
        return int(raw[raw.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def kill_command(proc, command):
    """SIGKILL the command's group and everything it started, until none is left (fork bombs)."""

    def victims(procs):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.poll()
        return command.mine(procs) if Session.uid else []

    kill_until_gone(victims)


def over_pids_share(share):
    """Whether the container uses at least 1/``share`` of its pids limit (threads count too)."""
    if not Session.uid or not Session.pids_limit:
        return False
    used = pids_in_use()
    if used is None:
        used = len(user_processes())
    return used * share >= Session.pids_limit


def over_pids_half():
    return over_pids_share(2)


LEFTOVER_SHARE = 4  # what earlier commands left goes once it holds this share of the pids limit


def leftovers_too_many(victims):
    return len(victims) * LEFTOVER_SHARE >= Session.pids_limit


def signal_as_user(sig):
    """``kill(-1, sig)`` from a child with only the sandbox user's ids: every process of that user at
    once (the kernel holds off forks while it walks the task list), never root's. False when the
    child cannot be forked (the pids limit is reached), or there is no separate sandbox user."""
    if not Session.uid:
        return False
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(Session.gid, Session.gid, Session.gid)
            os.setresuid(Session.uid, Session.uid, Session.uid)
            os.kill(-1, sig)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return True


INIT_PID_NAMESPACE_INODE = 0xEFFFFFFC  # the kernel's PROC_PID_INIT_INO: the host's own pid namespace


def in_own_pid_namespace():
    """Whether this agent runs in a pid namespace of its own (a container's), not the host's."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino != INIT_PID_NAMESPACE_INODE
    except OSError:
        return False


def signal_everyone_but_init(sig):
    """``kill(-1, sig)`` as root: every process of this pid namespace but init and the agent, in one
    go. Only where that namespace is the sandbox's own, and only for SIGSTOP / SIGCONT: what a bomb
    at the pids limit leaves, when not even one child can be forked to do it as the sandbox user.
    Root processes (a ``docker exec``) are paused for as long as the kill pass takes."""
    if not Session.uid or os.geteuid() != 0 or not in_own_pid_namespace():
        return False
    try:
        os.kill(-1, sig)
    except OSError:
        return False
    return True


def stop_every_user_process():
    """Stop every sandbox-user process in one go; the function that resumes them, or None."""
    if signal_as_user(signal.SIGSTOP):
        return lambda: signal_as_user(signal.SIGCONT) or signal_everyone_but_init(signal.SIGCONT)
    if signal_everyone_but_init(signal.SIGSTOP):
        return lambda: signal_everyone_but_init(signal.SIGCONT)
    return None


def kill_until_gone(select):
    """SIGKILL ``select(user_processes())`` until it is empty (a bomb cannot regrow); how many went.

    Each pass first stops every sandbox-user process in one go, so none forks while the victims
    are picked and killed, then lets the survivors (the current command's) go on. When a bomb
    holds the pids limit, the child that stops them as the sandbox user cannot be forked; the
    agent then stops everything in the sandbox's pid namespace itself: killing the victims of a
    snapshot while the rest run on frees slots the bomb refills as fast (a loaded host never
    catches up).
    """
    killed = 0
    end = time.monotonic() + KILL_WINDOW_S
    while time.monotonic() < end:
        resume = stop_every_user_process()
        try:
            victims = select(user_processes())
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        finally:
            if resume is not None:
                resume()
        if not victims:
            break
        killed = max(killed, len(victims))
        time.sleep(0.002)
    return killed


def bomb_note(killed, whose):
    if not killed:
        return b""
    return ("\nagentenv: killed %d processes %s: the sandbox was at half its pids limit (%d)\n"
            % (killed, whose, Session.pids_limit)).encode()


def user_zombies():
    """How many of the sandbox user's processes are dead and not yet reaped: their pids still count."""
    return sum(rest[0] == b"Z" for _, rest in user_stats())


def wait_for_reaping(end, busy):
    """After a kill: wait, until ``end``, while the sandbox is at half its pids limit only because
    what was killed is not reaped yet (init reaps it; a loaded host takes its time), so that what
    runs next can fork and is not taken for the bomb. ``busy()`` true stops the wait: live
    processes that make it more than zombies (a bomb regrown, or the running command's own)."""
    while over_pids_half() and time.monotonic() < end and user_zombies() and not busy():
        time.sleep(0.005)


def uptime_ticks():
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) * CLK_TCK


def settle_young_leftovers():
    """Before a command: wait while earlier commands' processes are young (born in the last
    ``YOUNG_S``) and the sandbox is under a quarter of its pids limit.

    A background job started a moment ago may be a bomb in its first milliseconds, too small to
    tell yet; it grows from there to the limit faster than a running command's watch looks, so the
    command could not even fork. Waiting lets it show what it is: it ages (an ordinary background
    job, which costs the next command at most ``YOUNG_S``), ends, or crosses the quarter, and the
    clearing takes it. Bounded by ``SETTLE_S``.
    """
    if not Session.uid or not Session.pids_limit:
        return
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end and not over_pids_share(LEFTOVER_SHARE):
        try:
            young = uptime_ticks() - YOUNG_S * CLK_TCK
        except (OSError, ValueError, IndexError):
            return
        if not any(started >= young for _, started, _ in user_processes().values()):
            return
        time.sleep(0.01)


def clear_runaway_before():
    """Before a command: everything earlier commands left goes if it holds a quarter of the pids
    limit in processes, or the sandbox is at half the limit (threads count there)."""
    settle_young_leftovers()
    if not over_pids_share(LEFTOVER_SHARE):
        return b""
    if not over_pids_half() and not leftovers_too_many(user_processes()):
        return b""
    killed = 0
    end = time.monotonic() + REAP_WAIT_S
    while True:
        killed = max(killed, kill_until_gone(list))
        wait_for_reaping(end, lambda: bool(user_processes()))
        if not over_pids_half() or not user_processes() or time.monotonic() >= end:
            break  # else something outlived the kill (a bomb regrown): again
    return bomb_note(killed, "left running by earlier commands")


def watch_runaway(command, proc):
    """During and after a command: kill what earlier commands left running once it holds a quarter
    of the pids limit (a bomb still growing is caught with room to spare) or the sandbox is at half;
    if the sandbox is still at half once what was killed is reaped, this command is the bomb: kill
    everything it started."""
    if not over_pids_share(LEFTOVER_SHARE):
        return b""
    note = b""
    if over_pids_half() or leftovers_too_many(command.not_mine(user_processes())):
        killed = kill_until_gone(command.not_mine)
        note = bomb_note(killed, "left running by earlier commands")
        if killed:  # their zombies are no sign of this command: wait, unless it holds a quarter itself
            wait_for_reaping(time.monotonic() + REAP_WAIT_S,
                             lambda: leftovers_too_many(command.mine(user_processes())))
    if over_pids_half():
        note += bomb_note(kill_until_gone(command.mine), "this command started")
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    return note


def op_exec(req, payload):
    cmd = req["cmd"]
    argv = [SHELL, "-c", cmd] if isinstance(cmd, str) else list(cmd)
    cwd = req.get("cwd") or "/"
    if not os.path.isdir(cwd):
        raise Fail("not_found", "working directory %s does not exist" % cwd)
    env = dict(os.environ)
    env.update(Session.env)
    env.update(req.get("env") or {})
    limit = int(req.get("limit", 1 << 20))
    timeout = float(req.get("timeout", 60.0))
    start = time.monotonic()
    before = oom_kills()
    ids = {"user": Session.uid, "group": Session.gid, "extra_groups": list(Session.groups)} if Session.uid else {}
    cleared = clear_runaway_before()  # a bomb an earlier command left may not even let this one fork
    command = Command()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, start_new_session=True,
            stdin=subprocess.PIPE if payload else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **ids,
        )
    except OSError as exc:
        code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
        msg = ("cannot run %r: %s\n" % (argv[0], exc)).encode()
        return {"ok": True, "exit_code": code, "timed_out": False, "truncated": False,
                "oom_killed": False, "duration_s": time.monotonic() - start, "stdout_len": 0}, msg
    prefer_for_oom(proc.pid)
    born = start_ticks_of(proc.pid)
    command.born = 0 if born is None else born
    notes = [cleared]
    out = run_io(proc, payload, start + timeout, limit, command, notes)
    timed_out, truncated, bufs = out
    notes.append(watch_runaway(command, proc))
    note = b"".join(notes)
    if note:
        bufs[1].extend(note)
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


WATCH_EVERY_S = 0.05  # how often a running command's pids use is looked at
WATCH_LEFTOVERS_EVERY_S = 0.01  # ... while earlier commands' processes run beside it (a bomb may grow)


def run_io(proc, stdin_data, deadline, limit, command, notes):
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
    every = WATCH_LEFTOVERS_EVERY_S if command.old_pids else WATCH_EVERY_S
    next_watch = time.monotonic() + every if Session.pids_limit else float("inf")
    try:
        while open_pipes:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > POST_EXIT_DRAIN_S:
                break  # a background child keeps the pipe open: stop listening
            if not timed_out and now >= deadline:
                timed_out = True
                kill_command(proc, command)
                deadline = now + 1.0  # drain what is left, briefly
            elif timed_out and now >= deadline:
                break
            if Session.pids_limit and now >= next_watch:
                notes.append(watch_runaway(command, proc))
                next_watch = now + every
            wait = min(deadline, exited_at + POST_EXIT_DRAIN_S if exited_at else deadline, next_watch) - now
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
                kill_command(proc, command)
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
    """A regular file's bytes, refused before reading when over ``limit`` (a FIFO never blocks)."""
    path = req["path"]
    limit = READ_LIMIT if req.get("limit") is None else int(req["limit"])  # 0: only "exists and is a file"
    with as_user():
        if os.path.isdir(path):
            raise Fail("is_a_directory", "%s is a directory" % path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Fail("not_regular", "%s is not a regular file" % path)
        if st.st_size > limit:
            raise Fail("too_large", "%s is %d bytes, over the %d-byte read limit" % (path, st.st_size, limit))
        os.set_blocking(fd, True)
        parts, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        data = b"".join(parts)
        if len(data) > limit:  # grew while we read
            raise Fail("too_large", "%s grew past the %d-byte read limit" % (path, limit))
        return {"ok": True}, data
    finally:
        os.close(fd)


def op_write_file(req, payload):
    """Create or replace a file as the sandbox user; ``mode`` None keeps an existing file's mode."""
    path = req["path"]
    mode = req.get("mode")
    with as_user():
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644 if mode is None else int(mode))
        try:
            write_all(fd, payload)
            if mode is not None:
                try:
                    os.fchmod(fd, int(mode))
                except PermissionError:
                    pass  # writable but not ours: keep its mode
        finally:
            os.close(fd)
    return {"ok": True}, b""


def _entry(path, st):
    return {"path": path, "size": st.st_size, "is_dir": stat.S_ISDIR(st.st_mode),
            "mode": stat.S_IMODE(st.st_mode), "is_symlink": stat.S_ISLNK(st.st_mode)}


def op_list_files(req, payload):
    with as_user():
        return _list_files(req)


def _list_files(req):
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


def add_as_it_is_now(tar, path, arcname):
    """``tar.add(path, recursive=False)``, but a regular file is read first and stored at the length
    read: one that a process shrinks between the stat and the read (a daemon racing the snapshot)
    would otherwise end the tar with "unexpected end of data"."""
    ti = tar.gettarinfo(path, arcname=arcname)
    if ti is None:
        return  # a socket: nothing a fresh sandbox could hold
    if not ti.isreg():
        tar.addfile(ti)
        return
    with open(path, "rb") as f:
        data = f.read(ti.size)
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))


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
                add_as_it_is_now(tar, path, path.lstrip("/"))
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


XATTR_PREFIX = "SCHILY.xattr."
# The same as sandboxes.overlay.INTERNAL_XATTRS (this file is copied into containers alone, so it
# cannot import it; a test keeps the two equal).
INTERNAL_XATTRS = ("trusted.overlay.", "user.overlay.", "user.fuseoverlayfs.", "security.", "system.")


def _user_xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return []
    return [n for n in names if not n.startswith(INTERNAL_XATTRS)]


def sync_xattrs(path, m):
    """Make ``path``'s extended attributes exactly the member's (an episode's own ones go)."""
    want = {k[len(XATTR_PREFIX) :]: v for k, v in m.pax_headers.items() if k.startswith(XATTR_PREFIX)}
    for name in _user_xattrs(path):
        if name not in want:
            os.removexattr(path, name, follow_symlinks=False)
    for name, value in want.items():
        if not name.startswith(INTERNAL_XATTRS):
            raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
            os.setxattr(path, name, raw, follow_symlinks=False)


def _real_parent(path):
    """Refuse a member whose parent is reached through a symlink (a write would land elsewhere)."""
    parent = os.path.dirname(path)
    if os.path.realpath(parent) != os.path.normpath(parent):
        raise OSError(errno.ELOOP, "parent of %s is a symlink" % path)


def _extract_one(tar, m, path, dir_times):
    _real_parent(path)
    if m.isdir():
        if not os.path.isdir(path):
            _remove(path)
            os.makedirs(path, mode=0o700)
        if os.geteuid() == 0:
            try:
                os.lchown(path, m.uid, m.gid)
            except OSError:
                pass
        sync_xattrs(path, m)
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
        if os.geteuid() == 0:
            os.lchown(path, m.uid, m.gid)
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
    sync_xattrs(path, m)
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
    out = ns["run"](dict(req["request"], uid=Session.uid), {os.getpid()})
    return {"ok": True}, json.dumps(out).encode()


def op_hello(req, payload):
    """Set the MAC key and the sandbox user; only ever the first request."""
    if Session.key is not None:
        raise Fail("bad_request", "hello after the session started")
    Session.key = bytes.fromhex(req["key"])
    user = req.get("user") or {}
    if os.getuid() == 0 and int(user.get("uid", 0)):
        Session.uid, Session.gid = int(user["uid"]), int(user["gid"])
        try:
            pw = pwd.getpwuid(Session.uid)
            home, name = pw.pw_dir, pw.pw_name
            groups = os.getgrouplist(name, Session.gid)
        except KeyError:
            home, name, groups = "/", str(Session.uid), [Session.gid]
        Session.groups = tuple(groups)
        Session.env = {"HOME": home, "USER": name, "LOGNAME": name}
    Session.pids_limit = int(req.get("pids_limit") or 0)
    return {"ok": True}, b""


def untrusted_paths():
    """Paths this process runs from that the sandbox user could change (then no boundary holds)."""
    out = []
    if not Session.uid:
        return out
    for path in [sys.executable, os.path.abspath(__file__), os.path.dirname(os.path.abspath(__file__))] + sys.path:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid == Session.uid or st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid in Session.groups):
            out.append(path)
    return out


def op_ping(req, payload):
    return {"ok": True, "pid": os.getpid(), "uid": os.getuid(), "user_uid": Session.uid,
            "python": sys.version.split()[0], "untrusted_paths": untrusted_paths()}, b""


OPS = {
    "hello": op_hello,
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
    errno.ELOOP: "permission",
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
            frame = read_exact(0, FRAME.size)
            head_len, payload_len = FRAME.unpack(frame)
            head = read_exact(0, head_len)
            payload = read_exact(0, payload_len)
            if Session.key is not None:
                tag = read_exact(0, MAC_SIZE)
                if not hmac.compare_digest(tag, mac(b"request", Session.recv_seq, frame + head, payload)):
                    return  # not from the host: stop answering; the host sees EOF
                Session.recv_seq += 1
            req = json.loads(head)
        except (EOFError, ValueError):
            return
        if Session.key is None and req.get("op") != "hello":
            return  # the first request must set the key
        header, body = handle(req, payload)
        try:
            send(out_fd, header, body)
        except BrokenPipeError:
            return  # the host side hung up: nobody is left to answer



if __name__ == "__main__":
    main()
