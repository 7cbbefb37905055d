"""``agentenv serve`` processes started for one test: a free port, this checkout on ``PYTHONPATH``, a log file.

A server is up once ``GET /v1/models`` answers 200; a process that exits first, or a server that is not up
within the deadline, fails the test with the end of its log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from ray_heads import free_port

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


def start_serve(model: str, log: Path, *args: str) -> Served:
    """``python -m agentenv.cli serve MODEL --port PORT ARGS...`` from the checkout; output to ``log``."""
    port = free_port()
    out = open(log, "wb")  # noqa: SIM115 - the child holds it; closed when it exits
    proc = subprocess.Popen([sys.executable, "-m", "agentenv.cli", "serve", model, "--port", str(port), *args],
                            cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    out.close()
    return Served(proc, f"http://127.0.0.1:{port}", log)


def wait_up(server: Served, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{server.url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert server.proc.poll() is None, server.log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"agentenv serve at {server.url} did not come up within {timeout_s:.0f}s"
        time.sleep(0.2)


def stop(server: Served) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(30)
