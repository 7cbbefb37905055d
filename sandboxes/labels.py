"""Labels every container carries, so a reaper can tell whose it is.

An owner is (host, pid, process start time): the start time guards against a
pid reused by an unrelated process after the owner died.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass

PREFIX = "agentenv."
MANAGED = PREFIX + "managed"
RUN_ID = PREFIX + "run_id"
OWNER_PID = PREFIX + "owner_pid"
OWNER_HOST = PREFIX + "owner_host"
OWNER_START = PREFIX + "owner_start"
CREATED_AT = PREFIX + "created_at"
KIND = PREFIX + "kind"  # "sandbox" or "snapshot" (for images)

_RUN_ID = os.environ.get("AGENTENV_RUN_ID") or uuid.uuid4().hex[:12]


def current_run_id() -> str:
    """The run id of this process (``AGENTENV_RUN_ID`` or a random one)."""
    return _RUN_ID


def process_start_ticks(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name may hold spaces and parens: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start: str

    @classmethod
    def me(cls) -> Owner:
        pid = os.getpid()
        return cls(host=socket.gethostname(), pid=pid, start=process_start_ticks(pid) or "")

    def is_alive(self) -> bool | None:
        """True/False for an owner on this host; None when it lives elsewhere (unknown)."""
        if self.host != socket.gethostname():
            return None
        return process_start_ticks(self.pid) == self.start


def owner_labels(run_id: str | None = None, kind: str = "sandbox") -> dict[str, str]:
    me = Owner.me()
    return {
        MANAGED: "1",
        RUN_ID: run_id or current_run_id(),
        OWNER_PID: str(me.pid),
        OWNER_HOST: me.host,
        OWNER_START: me.start,
        CREATED_AT: f"{time.time():.3f}",
        KIND: kind,
    }


def owner_from_labels(labels: dict[str, str]) -> Owner | None:
    try:
        return Owner(host=labels[OWNER_HOST], pid=int(labels[OWNER_PID]), start=labels.get(OWNER_START, ""))
    except (KeyError, ValueError):
        return None
