"""In-container half of ``DockerBackend.reset``: run by the agent (root) for the sandbox user.

Why a separate module and not agent ops: the agent is copied into every
container and kept small; a reset needs a few things only twice per reset
(kill, clear scratch mounts, stat paths), so this source is sent to the
agent's ``helper`` op, which compiles it once per agent and calls ``run`` in
its own process (no interpreter start per call: that was two ``python3 -c``
starts, about 60 ms of CPU, per reset). It also runs as a script (``python3
-c`` with the request on stdin). It is stdlib-only (python 3.8+).

Input: one JSON object (``run``'s argument, or stdin)::

    {"kill": bool, "scratch": [dir, ...], "clear": bool, "stat": [path, ...], "list": [dir, ...]}

Output: one JSON object on stdout with ``procs`` (sandbox-user processes
other than the agent and this script still present), ``scratch`` (entries
left in each scratch dir), ``ipc`` (SysV IPC objects present; with ``clear``,
the caller's own are removed first), ``stat``
(path -> attributes with a sha256 of regular files, or null when missing, or
{"error": ...}) and ``list`` (dir -> sorted names, or {"error": ...}).

It never touches another user's processes: a signal is sent only to
processes whose real, effective or saved uid is the sandbox user's (``uid`` in
the request, set by the agent), never to root's (the container's init, its
idle main process and the agent itself). Nothing here decides a reset: the
host checks processes, files and scratch mounts itself afterwards
(``sandboxes/host_view.py``); this only does the work.
"""

import hashlib
import json
import os
import shutil
import signal
import stat
import sys
import time

KILL_WINDOW_S = 3.0


def our_processes(uid, skip):
    """(pid, state) of processes of ``uid`` except ``skip``; zombies included."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open("/proc/%s/status" % name) as f:
                text = f.read()
        except OSError:
            continue  # exited meanwhile
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        uids = [int(x) for x in fields.get("Uid", "").split()[:3]]
        if uid in uids:
            found.append((int(name), fields.get("State", "?").strip()[:1]))
    return found


def kill_all(uid, skip):
    """SIGKILL every process of ``uid`` but ``skip`` until none is left (zombies wait for init)."""
    end = time.monotonic() + KILL_WINDOW_S
    while time.monotonic() < end:
        left = our_processes(uid, skip)
        if not left:
            return []
        for pid, state in left:
            if state != "Z":
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.005)
    return our_processes(uid, skip)


def clear_dir(path):
    errors = []
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return errors
    for name in names:
        full = os.path.join(path, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
        except OSError as exc:
            errors.append("%s: %s" % (full, exc))
    return errors


IPC_RMID = 0
IPC_COLUMNS = {"shm": ("shmid", "uid"), "msg": ("msqid", "uid"), "sem": ("semid", "uid")}


def remove_ipc(uid):
    """Remove the SysV IPC objects ``uid`` owns (a killed PostgreSQL leaves its shared memory
    segment); the kernel refuses anyone else's. Errors are listed, never raised."""
    errors = []
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except (OSError, ImportError) as exc:
        return ["ctypes: %s" % exc]
    for kind, (id_col, uid_col) in IPC_COLUMNS.items():
        try:
            with open("/proc/sysvipc/" + kind) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        cols = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(cols, line.split()))
            if int(row.get(uid_col, -1)) != uid:
                continue
            ident = int(row[id_col])
            as_owner = os.geteuid() == 0  # root without CAP_SYS_ADMIN may not remove another uid's object
            if as_owner:
                os.seteuid(uid)
            try:
                if kind == "shm":
                    rc = libc.shmctl(ident, IPC_RMID, None)
                elif kind == "msg":
                    rc = libc.msgctl(ident, IPC_RMID, None)
                else:
                    rc = libc.semctl(ident, 0, IPC_RMID)
            finally:
                if as_owner:
                    os.seteuid(0)
            if rc != 0:
                errors.append("%s %d: errno %d" % (kind, ident, ctypes.get_errno()))
    return errors


def ipc_objects():
    count = 0
    for kind in ("shm", "msg", "sem"):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                count += max(len(f.read().splitlines()) - 1, 0)
        except OSError:
            continue
    return count


def describe(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"error": str(exc)}
    out = {"type": stat.S_IFMT(st.st_mode), "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid,
           "gid": st.st_gid, "size": st.st_size, "mtime": int(st.st_mtime)}
    try:
        if stat.S_ISLNK(st.st_mode):
            out["link"] = os.readlink(path)
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out["sha256"] = h.hexdigest()
    except OSError as exc:
        return {"error": str(exc)}
    return out


def run(req, skip):
    """The answer to ``req`` (see the module docstring); ``skip`` are pids never to kill or report."""
    uid = req.get("uid")
    if not uid:
        raise ValueError("the sandbox user is root (or unknown): nothing may be killed or cleared for it")
    procs = kill_all(uid, skip) if req.get("kill") else our_processes(uid, skip)
    scratch, scratch_errors = {}, []
    if req.get("clear"):
        scratch_errors += remove_ipc(uid)
    for d in req.get("scratch", []):
        if req.get("clear"):
            scratch_errors += clear_dir(d)
        try:
            scratch[d] = sorted(os.listdir(d))
        except FileNotFoundError:
            scratch[d] = []
    listing = {}
    for d in req.get("list", []):
        try:
            listing[d] = sorted(os.listdir(d))
        except OSError as exc:
            listing[d] = {"error": str(exc)}
    out = {"procs": procs, "scratch": scratch, "scratch_errors": scratch_errors, "ipc": ipc_objects(),
           "stat": {p: describe(p) for p in req.get("stat", [])}, "list": listing}
    return out


def main():
    req = json.loads(sys.stdin.read() or "{}")
    sys.stdout.write(json.dumps(run(req, {os.getpid(), os.getppid()})))  # this script and the agent


if __name__ == "__main__":
    main()
