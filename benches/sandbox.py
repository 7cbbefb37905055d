"""Sandbox hot-path benchmark: ours against the plain ``docker`` SDK, in the same run.

    agentenv sandbox bench [--quick] [--json runs/bench_sandbox.json]

Each metric times our way and the way a user would write it with the SDK
(``containers.run``, ``exec_run``, ``commit`` then run from the image), on the
same image, interleaved in one process, so the ratio survives a noisy machine
even when absolute times drift.

* ``exec_roundtrip``: ``sandbox.exec("true")`` over the agent channel vs ``exec_run("true")``.
* ``output_flood``: a command printing 50 MB (``yes | head -c``) capped at the spec's output limit vs
  ``exec_run`` of the same command, which keeps all of it (a unit test only checks the cap, never the time).
* ``pool_acquire``: ``pool.acquire()`` from a warm pool vs ``containers.run`` of a fresh container.
* ``snapshot_restore``: FAST snapshot + restore onto a warm sandbox vs ``commit`` + ``run`` from
  the committed image, after writing 20 files / 1 MB.
* ``fork8``: 8 ready sandboxes from one snapshot vs ``commit`` + 8 ``run``.
* ``lineage``: N successive snapshot/restore cycles (each restore from the previous snapshot);
  must succeed; reports time per cycle.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker

from sandboxes import labels as L
from sandboxes.images import ensure_base_image
from sandboxes.pool import SandboxPool
from sandboxes.types import Sandbox, SandboxSpec, SnapshotKind

TARGETS = {"exec_roundtrip": 0.2, "pool_acquire": 0.1, "snapshot_restore": 0.5}
FLOOD_CMD = "yes | head -c 50000000"
# 20 files, 1 MB in all
FILES_ARGV = [
    "python3",
    "-c",
    "import os\nos.makedirs('/workspace/bench', exist_ok=True)\n"
    "for i in range(20):\n    open(f'/workspace/bench/f{i}.bin','wb').write(os.urandom(52429))",
]


@dataclass
class Metric:
    name: str
    ours_s: list[float] = field(default_factory=list)
    baseline_s: list[float] = field(default_factory=list)
    note: str = ""

    @staticmethod
    def _p(xs: list[float], q: float) -> float:
        if not xs:
            return float("nan")
        xs = sorted(xs)
        return xs[min(int(q * (len(xs) - 1) + 0.5), len(xs) - 1)] * 1000

    def row(self) -> dict[str, float | str | None]:
        ours = statistics.median(self.ours_s) * 1000 if self.ours_s else float("nan")
        base = statistics.median(self.baseline_s) * 1000 if self.baseline_s else None
        return {
            "ours_ms": round(ours, 3),
            "ours_p95_ms": round(self._p(self.ours_s, 0.95), 3),
            "baseline_ms": None if base is None else round(base, 3),
            "baseline_p95_ms": None if base is None else round(self._p(self.baseline_s, 0.95), 3),
            "ratio": None if base is None else round(ours / base, 4),
            "target": TARGETS.get(self.name),
            "n": len(self.ours_s),
            "note": self.note,
        }


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class _Baseline:
    """The plain-SDK way, with the same hardening options so the comparison is fair."""

    def __init__(self, client: docker.DockerClient, image: str) -> None:
        self.client = client
        self.image = image
        self.labels = L.owner_labels(kind="sandbox")

    def run(self, image: str | None = None) -> docker.models.containers.Container:
        return self.client.containers.run(
            image or self.image,
            ["sleep", "infinity"],
            detach=True,
            init=True,
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            user="agent",
            labels=self.labels,
        )

    def remove(self, container: docker.models.containers.Container) -> None:
        container.remove(force=True)


def run_bench(
    *,
    quick: bool = False,
    json_path: Path | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, dict[str, float | str | None]]:
    """Run every metric; return ``{metric: {ours_ms, baseline_ms, ratio, ...}}``."""
    from sandboxes.docker_backend import DockerBackend

    client = docker.from_env(timeout=300)
    image = ensure_base_image(client, log=progress)
    backend = DockerBackend(client)
    spec = SandboxSpec(image=image)
    base = _Baseline(client, image)
    n_exec, n_start, n_snap, n_cycles = (30, 4, 3, 30) if quick else (200, 10, 6, 200)
    n_flood = 2 if quick else 5
    metrics: dict[str, Metric] = {}
    pool = SandboxPool(backend, spec, size=8 if not quick else 4, max_size=12)
    try:
        progress("warming the pool")
        pool.warm(timeout=300)

        progress("exec round trip")
        m = metrics["exec_roundtrip"] = Metric("exec_roundtrip")
        sb = pool.acquire()
        bc = base.run()
        try:
            for _ in range(5):  # warm both paths
                sb.exec("true")
                bc.exec_run("true")
            for _ in range(n_exec):
                m.ours_s.append(_timed(lambda: sb.exec(["true"])))
            for _ in range(max(n_exec // 4, 10)):
                m.baseline_s.append(_timed(lambda: bc.exec_run(["true"])))

            progress("output flood (50 MB)")
            m = metrics["output_flood"] = Metric("output_flood", note="50 MB of stdout: ours capped, baseline whole")
            for _ in range(n_flood):
                m.ours_s.append(_timed(lambda: sb.exec(FLOOD_CMD, timeout=120)))
                m.baseline_s.append(_timed(lambda: bc.exec_run(["sh", "-c", FLOOD_CMD])))
        finally:
            base.remove(bc)

        progress("pool acquire vs fresh container")
        m = metrics["pool_acquire"] = Metric("pool_acquire", note="ours: warm pool; baseline: containers.run")
        for _ in range(n_start):
            pool.warm(timeout=300)
            got: list[Sandbox] = []
            m.ours_s.append(_timed(lambda: got.append(pool.acquire())))
            pool.release(got[0])
            holder: list[docker.models.containers.Container] = []
            m.baseline_s.append(_timed(lambda: holder.append(base.run())))
            base.remove(holder[0])

        progress("snapshot + restore after 20 files / 1 MB")
        m = metrics["snapshot_restore"] = Metric("snapshot_restore", note="FAST snapshot vs docker commit")
        res = sb.exec(FILES_ARGV, timeout=60)
        if not res.ok:
            raise RuntimeError(f"bench could not write files: {res.stderr}")
        bc = base.run()
        bc.exec_run(FILES_ARGV)
        try:
            for _ in range(n_snap):
                pool.warm(timeout=300)
                restored: list[Sandbox] = []

                def ours() -> None:
                    ref = sb.snapshot(SnapshotKind.FAST)
                    restored.append(pool.restore(ref))

                m.ours_s.append(_timed(ours))
                check = restored[0].exec("ls /workspace/bench | wc -l")
                if check.stdout.strip() != "20":
                    raise RuntimeError(f"restored sandbox lacks the files: {check.stdout!r}")
                pool.release(restored[0])
                made: list[object] = []

                def baseline() -> None:
                    img = bc.commit()
                    made.append(img)
                    made.append(base.run(img.id))

                m.baseline_s.append(_timed(baseline))
                base.remove(made[1])  # type: ignore[arg-type]
                client.images.remove(made[0].id, force=True)  # type: ignore[attr-defined]
        finally:
            base.remove(bc)

        progress("fork 8 from one snapshot")
        m = metrics["fork8"] = Metric("fork8", note="8 ready sandboxes from one snapshot")
        ref = sb.snapshot(SnapshotKind.FAST)
        pool.size = 8
        pool.warm(timeout=300)
        forks: list[Sandbox] = []
        m.ours_s.append(_timed(lambda: forks.extend(pool.fork(ref, 8))))
        for f in forks:
            pool.release(f)
        bc = base.run()
        bc.exec_run(FILES_ARGV)
        made_c: list[docker.models.containers.Container] = []
        img_holder: list[object] = []

        def baseline_fork() -> None:
            img = bc.commit()
            img_holder.append(img)
            made_c.extend(base.run(img.id) for _ in range(8))

        m.baseline_s.append(_timed(baseline_fork))
        for c in [*made_c, bc]:
            base.remove(c)
        client.images.remove(img_holder[0].id, force=True)  # type: ignore[attr-defined]

        progress(f"{n_cycles}-cycle snapshot/restore lineage")
        m = metrics["lineage"] = Metric("lineage", note=f"{n_cycles} cycles, time per cycle")
        pool.release(sb)
        current = pool.acquire()
        for i in range(n_cycles):
            t0 = time.perf_counter()
            current.write_file(f"/workspace/lineage/step{i}.txt", str(i))
            ref = current.snapshot(SnapshotKind.FAST)
            nxt = pool.restore(ref)
            m.ours_s.append(time.perf_counter() - t0)
            pool.release(current)
            current = nxt
        listing = current.exec("ls /workspace/lineage | wc -l").stdout.strip()
        if listing != str(n_cycles):
            raise RuntimeError(f"lineage lost files: expected {n_cycles}, found {listing}")
        m.note += f"; depth {ref.depth}, all {n_cycles} files present"
        pool.release(current)
    finally:
        pool.close()
        backend.close()
    rows = {name: metric.row() for name, metric in metrics.items()}
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(rows, indent=2))
    return rows


__all__ = ["TARGETS", "run_bench"]
