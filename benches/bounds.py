"""Benchmark: the cost of the host-side bounds of issue 26, each against the unbounded way, in the same run.

    python -m benches.bounds [--rounds 7] [--files 2000] [--json runs/bench_bounds.json]

* ``fast_pack``: packing a live sandbox's changes on the host, beneath the upper dir with no symlink
  followed (``docker_snapshots.pack_upper``) vs the old path-based ``lstat`` + ``open`` pack
  (``_old_pack`` below: the code before the fix, kept here only as the baseline), on the same
  container after writing ``--files`` files (about 10 MB) in nested directories.
* ``fast_pack_frozen``: the old pack inside ``docker pause`` / ``unpause`` (the other way to stop the
  race: a frozen container) vs the same old pack unfrozen: what freezing would cost instead.
* ``fast_snapshot``: a whole FAST ``snapshot()`` (walk + pack + store), for scale.
* ``sqlite_dump``: the graded SQLite dump in a subprocess under a deadline (``db_state``) vs
  ``db_canon.dump`` in this process, on a 5,000-row database.

Rounds are interleaved (ours, baseline, ours, ...) so the ratio survives a noisy machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sqlite3
import statistics
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker

from agentenv.verifiers import db_canon
from agentenv.verifiers.db_state import AgentStateError, DbStateVerifier
from sandboxes.beneath import Deadline
from sandboxes.docker_backend import DockerBackend
from sandboxes.docker_snapshots import pack_upper
from sandboxes.images import ensure_base_image
from sandboxes.overlay import Keep, readable_upper, walk_upper, xattr_pax
from sandboxes.types import SandboxSpec


def _old_pack(upper: str, paths: list[str]) -> bytes:
    """The FAST pack before issue 26 (path lookups, follows a swapped-in symlink): the baseline only."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(paths):
            host = os.path.join(upper, path.lstrip("/"))
            try:
                ti = tar.gettarinfo(host, arcname=path.lstrip("/"))
            except FileNotFoundError:
                continue
            if ti is None:
                continue
            ti.uname = ti.gname = ""
            ti.pax_headers = {**ti.pax_headers, **xattr_pax(host)}
            if ti.isreg():
                with open(host, "rb") as f:
                    data = f.read(ti.size)
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
            else:
                tar.addfile(ti)
    return buf.getvalue()


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _pair(rounds: int, ours: Callable[[], object], base: Callable[[], object]) -> tuple[list[float], list[float]]:
    a, b = [], []
    ours(), base()  # warm caches on both sides
    for _ in range(rounds):
        a.append(_timed(ours))
        b.append(_timed(base))
    return a, b


def _row(name: str, ours: list[float], base: list[float], note: str) -> dict[str, Any]:
    o, b = statistics.median(ours) * 1000, statistics.median(base) * 1000
    return {"metric": name, "ours_ms": round(o, 2), "baseline_ms": round(b, 2), "ratio": round(o / b, 3) if b else None, "note": note}


def bench_fast(rounds: int, files: int) -> list[dict[str, Any]]:
    client = docker.from_env(timeout=300)
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as tmp:
        be = DockerBackend(client, run_id=f"bnd{uuid.uuid4().hex[:8]}", snapshot_dir=Path(tmp))
        try:
            sb = be.create(SandboxSpec(image=ensure_base_image(client), memory_mb=1024, pids=64))
            script = (
                "import os\n"
                f"for i in range({files}):\n"
                "    d = f'/workspace/tree/d{i % 50}/e{i % 7}'\n"
                "    os.makedirs(d, exist_ok=True)\n"
                "    open(f'{d}/f{i}.bin', 'wb').write(os.urandom(5000))\n"
            )
            sb.exec(["python3", "-c", script], timeout=300)
            upper = readable_upper(sb)
            if upper is None:
                raise SystemExit("the overlay upper dir is not readable here: run as root on the daemon's host")
            keep = Keep(sb)
            paths = sorted(filter(keep, walk_upper(upper)[0]))

            def new() -> bytes:
                return pack_upper(upper, paths, {}, sb.id, 1 << 30, Deadline(300, "bench"))

            def old() -> bytes:
                return _old_pack(upper, paths)

            def frozen() -> bytes:
                sb.container.pause()
                try:
                    return _old_pack(upper, paths)
                finally:
                    sb.container.unpause()

            assert _members(new()) == _members(old()), "the two packs differ on a quiet tree"
            rows = [_row("fast_pack", *_pair(rounds, new, old), f"{len(paths)} paths; beneath+no-follow vs lstat+open")]
            rows.append(_row("fast_pack_frozen", *_pair(rounds, frozen, old), "old pack in docker pause/unpause vs unfrozen"))
            snaps = [_timed(sb.snapshot) for _ in range(rounds)]
            rows.append({"metric": "fast_snapshot", "ours_ms": round(statistics.median(snaps) * 1000, 2),
                         "baseline_ms": None, "ratio": None, "note": "whole snapshot() for scale"})
            return rows
        finally:
            be.close()


def _members(blob: bytes) -> list[tuple[Any, ...]]:
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        return [(m.name, m.type, m.size, m.mode, m.uid, m.gid, m.mtime, m.linkname, m.pax_headers)
                for m in tar.getmembers() if m.name != ".agentenv-snapshot.json"]


def bench_sqlite(rounds: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-bounds-db-") as tmp:
        path = Path(tmp) / "app.db"
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
        con.executemany("INSERT INTO items VALUES (?, ?, ?)", [(i, f"n{i}", i * 0.5) for i in range(5000)])
        con.commit()
        con.close()
        verifier = DbStateVerifier.__new__(DbStateVerifier)  # only the bounded dump is timed: no task needed

        def bounded() -> object:
            try:
                return verifier._dump_sqlite_bounded(path, "/workspace/app.db", ["items"], [])
            except AgentStateError as exc:
                raise SystemExit(f"bounded dump failed: {exc}") from exc

        def in_process() -> object:
            return db_canon.dump(f"sqlite:///{path}", ["items"], [])

        return [_row("sqlite_dump", *_pair(rounds, bounded, in_process), "subprocess + deadline vs in-process; 5,000 rows")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benches.bounds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = bench_fast(args.rounds, args.files) + bench_sqlite(args.rounds)
    print(f"{'metric':<18} {'ours ms':>10} {'baseline ms':>12} {'ratio':>7}  note")
    for r in rows:
        base = "" if r["baseline_ms"] is None else f"{r['baseline_ms']:.2f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"{r['metric']:<18} {r['ours_ms']:>10.2f} {base:>12} {ratio:>7}  {r['note']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
