"""Ray heads and nodes started with the ``ray`` CLI for one test, and stopped by their own temp dir.

Each head gets its own ``--temp-dir``, port and token; ``stop_session`` stops exactly the
processes whose command line names that directory (head, raylets, workers), so Ray
sessions of other processes on the machine are never touched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent  # the venv's bin: `ray` and the `python` a job's entrypoint runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_pids(needle: str) -> list[int]:
    """Pids of the processes whose command line contains ``needle`` (a session's temp dir)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(proc.name))
    return pids


def stop_session(needle: str) -> None:
    """SIGTERM, then SIGKILL, every process whose command line names ``needle``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(needle):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 15
        while session_pids(needle) and time.time() < deadline:
            time.sleep(0.5)


@dataclass
class Head:
    temp_dir: str
    gcs: str  # host:port of the GCS, for `ray start --address`
    dashboard: str  # http address for `ray job submit`
    env: dict[str, str]
    nodes: list[str] = field(default_factory=list)  # temp dirs of extra nodes

    def add_node(self, *, num_cpus: int, resources: dict[str, float]) -> str:
        """A second raylet on this machine; returns the needle naming its processes (``kill_node``)."""
        port = free_port()
        cmd = [
            str(BIN / "ray"), "start", f"--address={self.gcs}", f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}", f"--temp-dir={self.temp_dir}",
            f"--node-manager-port={port}", f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", "--disable-usage-stats",
        ]
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, f"ray start (node) failed:\n{out.stdout}\n{out.stderr}"
        needle = f"manager_port={port}"
        self.nodes.append(needle)
        return needle

    def kill_node(self, needle: str) -> list[int]:
        """SIGKILL the raylet (and agents) of one added node, as a lost machine would; returns the pids."""
        pids = session_pids(needle) + session_pids(needle.replace("_", "-"))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def stop(self) -> None:
        stop_session(self.temp_dir)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_head(*, num_cpus: int = 2, resources: dict[str, float] | None = None) -> Head:
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    port, dash = free_port(), free_port()
    # Ray >= 2.59 turns token auth on for local clusters; give this head its own token, so the
    # test neither depends on nor touches ~/.ray/auth_token
    token = Path(temp_dir) / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = os.environ | {
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(BIN / "ray"), "start", "--head", f"--num-cpus={num_cpus}", f"--port={port}", f"--dashboard-port={dash}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
        f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
        f"--resources={json.dumps(resources or {'docker_daemon': 2})}", "--disable-usage-stats",
    ]
    head = Head(temp_dir, f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", env)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if out.returncode != 0:
        head.stop()
        raise AssertionError(f"ray start failed:\n{out.stdout}\n{out.stderr}")
    return head


NO_AGENT_YET = "No available agent to submit job"


def submit_job(cmd: list[str], *, wait_for_agent_s: float = 120.0, **kwargs: Any) -> subprocess.CompletedProcess:
    """``ray job submit`` as ``subprocess.run``, retried while the head's job agent is not up yet.

    On a loaded machine the dashboard answers before its agent has registered, and the submission
    is refused ("No available agent to submit job, please try again later"): nothing was submitted,
    so trying again is safe. Any other outcome is returned as it is.
    """
    deadline = time.monotonic() + wait_for_agent_s
    while True:
        job = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
        if NO_AGENT_YET not in job.stdout + job.stderr or time.monotonic() > deadline:
            return job
        time.sleep(3.0)
