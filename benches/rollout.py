"""The Ray side of ``agentenv rollout bench``: our rollout vs the sequential plain-docker baseline, same run.

    agentenv rollout bench [--workers 2] [--concurrency 2] [-G 8] [--json runs/bench_rollout.json]

Both sides run the scripted oracle policy on the same built-in tasks, ``G``
episodes per task (one GRPO group per task; 8 by default), so they do the same
work: set the task up, replay the oracle through a harness, grade it. The
baseline (``benches.rollout_baseline``) does it the way a script over the
``docker`` SDK would: one container per episode, one episode at a time. Ours is
``run_rollout`` itself: Ray workers x concurrency, pools warmed to the
concurrency before the first episode and reset in place after each, one setup
per variant shared by its group (FAST snapshot, group locality), grading in the
quiesced agent sandbox, and the store written by the scheduler. The baseline
runs first, then ours, in one process, so both see the same machine.

What is counted: ``wall_s`` of ours is the scheduler's run, from the first
episode dispatched to the last stored. Start-up (Ray actors, warming the pools:
``startup_s``) is paid once per run and reported separately, with
``ratio_with_startup`` (episodes over start-up + wall) beside ``ratio``: a
104-episode bench is short, a training run is not. Episodes/s is stored
episodes over that wall time; tool calls/s counts every tool call of every
turn. The time split is per episode, means over the stored trajectories:
policy, sandbox, verifier from the runner's timings, store from the
scheduler's writes, other = the rest of the episode's wall time (harness,
queueing on the worker's event loop).

CPU: each side also reports ``cpu_s_per_episode`` (host-wide busy CPU seconds
from ``/proc/stat`` over its timed span, divided by its episodes: the Docker
daemon, fuse-overlayfs, containers and Ray workers included, which no
per-process timer sees) and ``busy_cores`` (the mean number of cores busy).
Host-wide means other load on the machine counts too: run it on a quiet one.
On this 2-core machine the baseline keeps about one core busy (it waits on the
daemon), so concurrency alone gives at most about 2x; the rest must come from
less CPU per episode.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollout.config import RolloutConfig, parse_config
from rollout.store import TrajectoryStore
from rollout.types import Status

__all__ = ["TARGET_RATIO", "CpuMeter", "run_bench", "run_ray_bench", "time_split"]

TARGET_RATIO = 5.0


class CpuMeter:
    """Host-wide busy CPU time between ``start()`` and ``stop()``, from ``/proc/stat`` (Linux; zeros elsewhere)."""

    def __init__(self) -> None:
        self._busy0 = self._total0 = 0.0
        self.cpu_s = self.busy_cores = 0.0

    @staticmethod
    def _read() -> tuple[float, float]:
        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:9]]  # user .. steal (guest is inside user)
        except (OSError, ValueError):
            return 0.0, 0.0
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        return float(sum(ticks) - idle), float(sum(ticks))

    def start(self) -> None:
        self._busy0, self._total0 = self._read()

    def stop(self) -> None:
        busy, total = self._read()
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.cpu_s = (busy - self._busy0) / hz
        cores = os.cpu_count() or 1
        self.busy_cores = cores * (busy - self._busy0) / (total - self._total0) if total > self._total0 else 0.0


def bench_config(
    task_ids: Sequence[str], *, store: str, workers: int, concurrency: int, group_size: int, pool_size: int = 2
) -> RolloutConfig:
    """The config ``run_ray_bench`` runs: one seed per task, ``group_size`` episodes, round-robin harnesses."""
    return parse_config(
        {
            "run_id": f"bench-{uuid.uuid4().hex[:8]}",
            "store": store,
            "tasks": {"ids": list(task_ids)},
            "seeds": [0],
            "group_size": group_size,
            "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
            "efforts": {"levels": ["low", "high"]},
            "policy": {"kind": "scripted"},
            "workers": workers,
            "concurrency": concurrency,
            "pool_size": pool_size,
            "ray": {"num_cpus": 2},
        },
        source="bench",
    )


def time_split(store: TrajectoryStore, run_id: str, store_s_total: float) -> dict[str, float]:
    """Mean seconds per stored episode in policy, sandbox, verifier, store, and the rest."""
    trajs = store.query(run_id=run_id)
    if not trajs:
        return dict.fromkeys(("policy_s", "sandbox_s", "verifier_s", "store_s", "other_s", "total_s"), 0.0)
    mean = lambda f: statistics.fmean(f(t) for t in trajs)  # noqa: E731
    policy, sandbox, verifier = mean(lambda t: t.timings.policy_s), mean(lambda t: t.timings.sandbox_s), mean(
        lambda t: t.timings.verifier_s
    )
    total = mean(lambda t: t.timings.total_s)
    st = store_s_total / len(trajs)
    return {
        "policy_s": policy,
        "sandbox_s": sandbox,
        "verifier_s": verifier,
        "store_s": st,
        "other_s": max(total - policy - sandbox - verifier, 0.0),
        "total_s": total + st,
    }


def run_ray_bench(
    task_ids: Sequence[str], *, workers: int, concurrency: int, group_size: int, store_dir: Path, pool_size: int = 0
) -> tuple[dict[str, Any], dict[str, float]]:
    """Our rollout on embedded Ray over ``task_ids``; returns (metrics, per-episode time split)."""
    from rollout.job import run_rollout

    cfg = bench_config(
        task_ids, store=f"sqlite:///{store_dir / 'bench.db'}", workers=workers, concurrency=concurrency,
        group_size=group_size, pool_size=pool_size,
    )
    marks: dict[str, float] = {"t0": time.perf_counter()}
    cpu = CpuMeter()

    def ready(_scheduler: object) -> None:
        marks["ready"] = time.perf_counter()
        cpu.start()

    report = run_rollout(cfg, on_start=ready)
    cpu.stop()
    wall = max(report.elapsed_s, 1e-9)
    metrics = {
        "label": f"ray {workers} workers x {concurrency}",
        "episodes": report.stored,
        "ok": report.ok,
        "wall_s": wall,
        "startup_s": marks.get("ready", marks["t0"]) - marks["t0"],
        "episodes_per_s": report.stored / wall,
        "tool_calls_per_s": report.tool_calls / wall,
        "accounted": report.accounted,
        "cpu_s_per_episode": cpu.cpu_s / max(report.stored, 1),
        "busy_cores": cpu.busy_cores,
        "report": report.as_dict(),
    }
    with TrajectoryStore(cfg.store) as store:
        split = time_split(store, cfg.run_id, report.store_s)
        metrics["ok"] = len(store.query(run_id=cfg.run_id, status=Status.OK))
    return metrics, split


def run_bench(
    *,
    workers: int = 2,
    concurrency: int = 2,
    group_size: int = 8,
    pool_size: int = 0,
    task_ids: Sequence[str] | None = None,
    log: Callable[..., Any] = print,
) -> dict[str, Any]:
    """Baseline then ours on the same tasks; the result dict the CLI prints and ``--json`` writes."""
    from benches import rollout_baseline

    ids = list(task_ids) if task_ids is not None else rollout_baseline.suite_task_ids()
    log(f"baseline: sequential plain docker SDK, {len(ids)} tasks x {group_size}")
    cpu = CpuMeter()
    cpu.start()
    base = rollout_baseline.run_baseline(ids, episodes_per_task=group_size)
    cpu.stop()
    baseline = {
        "label": "sequential docker SDK",
        "episodes": base.episodes,
        "ok": base.ok,
        "wall_s": base.wall_s,
        "episodes_per_s": base.episodes_per_s,
        "tool_calls_per_s": base.tool_calls_per_s,
        "cpu_s_per_episode": cpu.cpu_s / max(base.episodes, 1),
        "busy_cores": cpu.busy_cores,
        "split_total_s": dict(base.split),
        "failures": list(base.failures),
    }
    log(f"ray: {workers} workers x {concurrency} concurrent episodes")
    with tempfile.TemporaryDirectory(prefix="agentenv-bench-") as tmp:
        ray_metrics, split = run_ray_bench(
            ids, workers=workers, concurrency=concurrency, group_size=group_size, store_dir=Path(tmp),
            pool_size=pool_size,
        )
    ratio = float(ray_metrics["episodes_per_s"]) / max(base.episodes_per_s, 1e-9)
    with_startup = ray_metrics["episodes"] / max(ray_metrics["wall_s"] + ray_metrics["startup_s"], 1e-9)
    return {
        "tasks": len(ids),
        "task_ids": ids,
        "group_size": group_size,
        "pool_size": pool_size,
        "baseline": baseline,
        "ray": ray_metrics,
        "split": split,
        "ratio": ratio,
        "ratio_with_startup": with_startup / max(base.episodes_per_s, 1e-9),
        "target": TARGET_RATIO,
    }
