"""``agentenv sandbox gc`` reaches the snapshot blobs: stale ones go, with a table of what went."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentenv.cli.sandbox import app

pytestmark = pytest.mark.docker  # the same command also reaps containers: it asks the daemon

DAY = 86400.0


def _blob(dir: Path, tag: str, idle_s: float) -> Path:
    path = dir / f"{hashlib.sha256(tag.encode()).hexdigest()}.tar"
    path.write_bytes(b"x" * 1000)
    t = time.time() - idle_s
    os.utime(path, (t, t))
    return path


def test_gc_removes_stale_blobs_and_prints_them(tmp_path: Path) -> None:
    old, fresh, kept = _blob(tmp_path, "old", 10 * DAY), _blob(tmp_path, "fresh", DAY), _blob(tmp_path, "kept", 10 * DAY)
    args = ["gc", "--run", "no-such-run", "--snapshots-dir", str(tmp_path), "--snapshots-max-age", "7d", "--keep", kept.stem]
    dry = CliRunner().invoke(app, [*args, "--dry-run"], env={"COLUMNS": "200"})
    assert dry.exit_code == 0, dry.output
    assert "would remove 1 (1000 B)" in dry.output and old.exists()
    out = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert old.name[:16] in out.output and "older than 7d" in out.output
    assert "removed 1 (1000 B), kept 2" in out.output
    assert not old.exists() and fresh.exists() and kept.exists()


def test_gc_refuses_a_bad_duration(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["gc", "--snapshots-dir", str(tmp_path), "--snapshots-max-age", "soon"])
    assert out.exit_code != 0 and "duration" in out.output
