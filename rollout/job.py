"""Run a rollout config on Ray: ``python -m rollout.job CONFIG`` (also what ``agentenv rollout CONFIG`` calls).

The same entry point serves both places a run starts:

* a laptop or one machine: no ``RAY_ADDRESS`` and ``ray.address`` unset, so Ray
  starts embedded in this process with ``ray.num_cpus`` CPUs and
  ``workers`` units of the worker resource, and stops when the run ends;
* a cluster, ``ray job submit --working-dir . -- python -m rollout.job CONFIG``:
  the job supervisor sets ``RAY_ADDRESS``, so this connects to that cluster
  (``address="auto"``) and workers go to nodes declaring the worker resource.

Exit status: 0 when every planned episode is accounted for exactly once
(stored, dropped as stale, or already stored by an earlier submission of the
same ``run_id``), 1 otherwise, 2 for a bad config. The report is printed as
one JSON line prefixed ``rollout-report:`` so a job's logs can be parsed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from rollout.config import ConfigError, RayConfig, RolloutConfig, TaskSelection, load_config
from rollout.scheduler import Event, RolloutReport, Scheduler, plan_episodes
from rollout.store import EpisodeRow, TrajectoryStore

log = logging.getLogger(__name__)

__all__ = ["check_placement", "init_ray", "main", "resolve_tasks", "run_rollout"]


def resolve_tasks(sel: TaskSelection) -> dict[str, str]:
    """Task id -> domain for every registered task passing the selection (ids, domain, all tags)."""
    from agentenv.registry import default_registry

    reg = default_registry()
    ids = list(sel.ids) or reg.ids(sel.domain)
    out: dict[str, str] = {}
    for task_id in ids:
        entry = reg.entry(task_id)  # unknown id: TaskNotFound with a "did you mean"
        if sel.domain is not None and entry.domain != sel.domain:
            continue
        if sel.tags:
            task = reg.get(task_id)
            if not set(sel.tags) <= set(task.tags):
                continue
        out[task_id] = entry.domain.value if entry.domain is not None else ""
    if not out:
        raise ConfigError(f"tasks: no registered task matches {sel.model_dump(exclude_defaults=True)}")
    return out


def init_ray(cfg: RayConfig, workers: int) -> bool:
    """Connect to or start Ray; returns True when this call started it (so the caller stops it)."""
    import ray

    if ray.is_initialized():
        return False
    address = cfg.address or ("auto" if os.environ.get("RAY_ADDRESS") else None)
    if address is not None:
        ray.init(address=address, log_to_driver=True)
        return True
    resources = {cfg.worker_resource: float(workers)} if cfg.worker_resource else None
    # "local": a new embedded instance, never a head some `ray start` left running on this machine
    ray.init(address="local", num_cpus=cfg.num_cpus, resources=resources, include_dashboard=False, log_to_driver=True)
    return True


def check_placement(cfg: RolloutConfig) -> None:
    """Fail at once, with the fix, when no node of the Ray cluster can place a worker of ``cfg``."""
    import ray

    name = cfg.ray.worker_resource
    if name and ray.cluster_resources().get(name, 0) < 1:
        raise ConfigError(
            f"ray.worker_resource: no node of this Ray cluster declares {name!r}, so no worker could be "
            f"placed; start nodes with `ray start --resources '{{\"{name}\": {cfg.workers}}}'` "
            "or set ray.worker_resource to null"
        )


def _stored_ids(store: TrajectoryStore, run_id: str) -> set[str]:
    from sqlalchemy import select

    with store.engine.connect() as conn:
        return {str(r[0]) for r in conn.execute(select(EpisodeRow.episode_id).where(EpisodeRow.run_id == run_id))}


def run_rollout(
    cfg: RolloutConfig,
    *,
    on_event: Event | None = None,
    on_start: Callable[[Scheduler], None] | None = None,
) -> RolloutReport:
    """Plan, run and store the whole config; returns the report. ``on_start`` sees the scheduler
    (and its ``workers``) before the first episode, for progress bars and fault-injection tests."""
    import ray

    from rollout.worker import RayWorkerClient, start_worker

    domains = resolve_tasks(cfg.tasks)
    store = TrajectoryStore(cfg.store)
    store.ensure_run(cfg.run_id, cfg.model_dump(mode="json"))
    plan = plan_episodes(cfg, sorted(domains))
    done = _stored_ids(store, cfg.run_id)
    todo = [r for r in plan if r.episode_id not in done]
    started = init_ray(cfg.ray, cfg.workers)
    clients: list[RayWorkerClient] = []
    try:
        check_placement(cfg)

        async def main() -> RolloutReport:
            for i in range(cfg.workers):
                clients.append(RayWorkerClient(lambda i=i: start_worker(cfg, i), slots=cfg.concurrency))
            # every worker up (backend reachable, policy loaded) before the first episode: fail fast
            await asyncio.gather(*(c.info() for c in clients))
            if cfg.warm:  # warm pools before the clock of the first episode starts: a run pays this once
                await asyncio.gather(*(c.warm(sorted(domains), cfg.concurrency) for c in clients))
            scheduler = Scheduler(
                todo,
                clients,
                store,
                staleness=cfg.staleness,
                sandbox_retries=cfg.retries.sandbox_lost,
                worker_lost_retries=cfg.retries.worker_lost,
                domains=domains,
                on_event=on_event,
                skipped=len(plan) - len(todo),
            )
            if on_start is not None:
                on_start(scheduler)
            try:
                report = await scheduler.run()
            finally:
                await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
            report.worker_restarts = sum(c.restarts for c in clients)
            return report

        report = asyncio.run(main())
    finally:
        if started:
            ray.shutdown()
    counts = {k: float(v) for k, v in report.as_dict().items() if isinstance(v, (int, float))}
    store.log_metrics(cfg.run_id, counts, tags={"source": "rollout.report"})
    store.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollout.job", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="rollout config YAML (docs/rollout.md)")
    parser.add_argument("--store", help="override the config's store URL")
    parser.add_argument("--run-id", help="override the config's run_id")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, store=args.store, run_id=args.run_id)
        report = run_rollout(cfg)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print("rollout-report: " + json.dumps(report.as_dict(), sort_keys=True), flush=True)
    return 0 if report.accounted else 1


if __name__ == "__main__":
    sys.exit(main())
