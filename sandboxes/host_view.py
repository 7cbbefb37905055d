"""What the host sees of a running container, without asking anything inside it.

Checks that decide whether a sandbox is clean (no process of the episode
left, scratch mounts empty, the agent's own files intact) must not rest on
an answer from inside the container: the architecture's trust rule. This
module reads them from where the sandbox user cannot write:

* processes: the container's cgroup (``cgroup.procs`` of its pids
  controller, found through ``/proc/<init>/cgroup``) and each member's
  ``/proc/<pid>/status`` on the host; where this process cannot read those
  (a remote daemon), ``docker top``, which the daemon answers from the host;
* scratch mounts (``/tmp`` tmpfs, ``/dev/shm``, ``/dev/mqueue``): listed
  through ``/proc/<init>/root``, the container's mount namespace as root
  sees it from outside; None where that is not readable here.

Usage::

    view = HostView(container)
    view.user_processes(0)        # [] when only root's processes run
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HostProc:
    """One process of the container as the host sees it."""

    pid: int  # in the host's PID namespace
    uids: tuple[int, ...]  # real, effective, saved, fs
    state: str  # one letter, as in /proc/<pid>/status
    cmd: str


class HostView:
    """Host-side reads of one container (``container`` is a docker SDK container)."""

    def __init__(self, container: Any, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> None:
        self._container = container
        self._proc = proc_root
        self._cgroup = cgroup_root

    def init_pid(self) -> int | None:
        pid = int(((self._container.attrs.get("State") or {}).get("Pid")) or 0)
        return pid or None

    def _procs_file(self) -> str | None:
        pid = self.init_pid()
        if pid is None:
            return None
        try:
            with open(f"{self._proc}/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "pids" in controllers.split(","):
                candidate = f"{self._cgroup}/pids{path}/cgroup.procs"
                if os.path.exists(candidate):
                    return candidate
        for line in lines:  # cgroup v2: one unified hierarchy
            if line.startswith("0::"):
                candidate = f"{self._cgroup}{line[3:]}/cgroup.procs"
                if os.path.exists(candidate):
                    return candidate
        return None

    def processes(self) -> list[HostProc]:
        """Every process of the container; ``docker top`` where the cgroup is not readable here."""
        procs_file = self._procs_file()
        if procs_file is None:
            return self._top()
        with open(procs_file) as f:
            pids = [int(x) for x in f.read().split()]
        out = []
        for pid in pids:
            proc = self._read(pid)
            if proc is not None:
                out.append(proc)
        return out

    def _read(self, pid: int) -> HostProc | None:
        try:
            with open(f"{self._proc}/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            with open(f"{self._proc}/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return None  # exited meanwhile
        uids = tuple(int(x) for x in fields.get("Uid", "").split())
        return HostProc(pid, uids, fields.get("State", "?").strip()[:1], cmd or fields.get("Name", "").strip())

    def _top(self) -> list[HostProc]:
        top = self._container.top(ps_args="-eo pid,ruid,euid,suid,stat,args")
        titles = [t.upper() for t in top.get("Titles") or []]
        out = []
        for row in top.get("Processes") or []:
            rec = dict(zip(titles, row))
            uids = tuple(int(rec[k]) for k in ("RUID", "EUID", "SUID") if str(rec.get(k, "")).isdigit())
            out.append(HostProc(int(rec.get("PID", 0)), uids, str(rec.get("STAT", "?"))[:1], str(rec.get("COMMAND", ""))))
        return out

    def user_processes(self, root_uid: int = 0) -> list[HostProc]:
        """Processes with any uid other than ``root_uid``: the sandbox user's (zombies included)."""
        return [p for p in self.processes() if any(u != root_uid for u in p.uids)]

    def scratch(self, paths: list[str]) -> dict[str, list[str]] | None:
        """Entries of each mount point, read from outside; None where the host cannot look."""
        pid = self.init_pid()
        if pid is None:
            return None
        root = f"{self._proc}/{pid}/root"
        out: dict[str, list[str]] = {}
        for path in paths:
            try:
                out[path] = sorted(os.listdir(root + path))
            except FileNotFoundError:
                out[path] = []
            except OSError:
                return None
        return out


__all__ = ["HostProc", "HostView"]
