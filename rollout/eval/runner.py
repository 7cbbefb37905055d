"""Run a sweep on the Ray rollout and read its results back: ``run_sweep(cfg, resume=...)``.

The path of one sweep::

    resolve tasks -> policy identities -> lock check (store) -> plan cells
    -> drop cells already stored (resume) -> EvalWorker actors, warm pools
    -> rollout.scheduler.Scheduler (backpressure, group locality, WorkerLost reruns,
       each trajectory written once, idempotently, under its cell's episode id)
    -> read every planned cell back from the store -> EpisodeResult list

The scheduler is the rollout's own, so a sweep inherits its exactly-once
accounting; a sweep only adds its own worker (every policy on one warm pool),
its retry policy for infrastructure outcomes, and the endpoint bounds.
Results are always read back from the store, never from memory, so a resumed
sweep reports the same numbers as one that ran without interruption.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollout.eval.cells import CellRequest, check_lock, plan_cells, record_images, stored_ids, task_locks
from rollout.eval.config import SweepConfig
from rollout.eval.types import CellKey, EpisodeResult, Outcome, SweepConfigError, outcome_of
from rollout.types import Trajectory

log = logging.getLogger(__name__)

__all__ = ["SweepRun", "collect", "result_of", "run_sweep"]

#: ``on_event(event, request, trajectory)``: the scheduler's events ("start", "stored", "rerun", ...).
Event = Callable[[str, Any, "Trajectory | None"], None]


@dataclass
class SweepRun:
    """A finished (or resumed) sweep: its plan, every planned cell's result, and this run's counters."""

    cfg: SweepConfig
    planned: list[CellKey]
    results: list[EpisodeResult]
    missing: list[str]
    domains: dict[str, str]
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.missing and len(self.results) == len(self.planned)


def _get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - the user's own endpoint
        return json.loads(resp.read())


def _served_version(url: str, model: str) -> int | None:
    """The weights version the endpoint reports: ``/models`` entries, else SGLang-style
    ``/get_model_info`` (``agentenv serve`` answers both); None when it reports none."""
    base = url.rstrip("/")
    try:
        data = _get_json(base + "/models")
    except Exception as exc:  # noqa: BLE001
        raise SweepConfigError(f"policies: url {url!r}: the endpoint did not answer GET /models ({exc})") from None
    ids = [m.get("id") for m in data.get("data", [])]
    if model not in ids:
        raise SweepConfigError(f"policies: model {model!r}: the endpoint at {url!r} serves {ids}")
    for m in data.get("data", []):
        if m.get("id") == model and isinstance(m.get("version"), int):
            return int(m["version"])
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    try:
        info = _get_json(root + "/get_model_info")
    except Exception:  # noqa: BLE001 - not every server has it
        return None
    v = info.get("version") if isinstance(info, dict) else None
    return int(v) if isinstance(v, int) else None


def identities(cfg: SweepConfig) -> dict[str, dict[str, Any]]:
    """Each policy's identity; an endpoint's served version wins over the declared one."""
    out = {}
    for p in cfg.policies:
        ident = p.identity()
        if p.kind == "openai":
            served = _served_version(str(p.url), str(p.model))
            if served is not None:
                ident["version"] = served
        out[p.name] = ident
    return out


def result_of(key: CellKey, traj: Trajectory) -> EpisodeResult:
    """Flatten a stored trajectory of ``key`` into an ``EpisodeResult``."""
    v = dict(traj.verifier)
    ev = v.get("eval") or {}
    passed = v.get("passed") if isinstance(v.get("passed"), bool) else None
    outcome = outcome_of(traj.status.value, traj.reward, traj.error, passed)
    # the sweep's reruns of an infrastructure outcome, then the runner's own fresh-sandbox retries
    reasons = list(v.get("infra_retries") or []) + [f"sandbox retry: {x}" for x in v.get("retries") or []]
    prompt = sum(t.prompt_tokens for t in traj.turns) or int(ev.get("usage_prompt_tokens", 0))
    return EpisodeResult(
        episode_id=traj.episode_id, policy=key.policy, policy_id=key.policy_id, task_id=key.task_id,
        domain=traj.domain, seed=key.seed, harness=key.harness, effort=key.effort, sample=key.sample,
        status=traj.status.value, outcome=outcome, reward=float(traj.reward), error=traj.error[:500],
        policy_version=traj.policy_version, prompt_tokens=prompt,
        completion_tokens=sum(t.completion_tokens for t in traj.turns),
        thinking_tokens=int(ev.get("thinking_tokens", 0)), turns=len(traj.turns),
        tool_calls=sum(t.tool_calls for t in traj.turns), tool_errors=traj.tool_errors,
        wall_s=float(traj.timings.total_s),
        infra_retries=len(reasons) - (outcome is Outcome.INFRASTRUCTURE and bool(reasons)),
        extra={"infra_reasons": reasons} if reasons else {},
    )


def collect(store: Any, cfg: SweepConfig, plan: list[tuple[CellKey, CellRequest]]) -> tuple[list[EpisodeResult], list[str]]:
    """Every planned cell's result from the store (in plan order), and the ids not stored."""
    trajs = {t.episode_id: t for t in store.iter_trajectories(run_id=cfg.sweep_id)}
    results, missing = [], []
    for key, req in plan:
        t = trajs.get(req.episode_id)
        if t is None:
            missing.append(req.episode_id)
        else:
            results.append(result_of(key, t))
    return results, missing


def run_sweep(
    cfg: SweepConfig,
    *,
    resume: bool = False,
    on_event: Event | None = None,
    on_start: Callable[[Any, dict[str, int], dict[str, int]], None] | None = None,
) -> SweepRun:
    """Plan, run (only the cells not stored yet) and read back the sweep.

    ``on_start(scheduler, planned_per_policy, done_per_policy)`` sees the scheduler
    before the first episode (progress bars; fault-injection tests reach the
    workers through ``scheduler.workers``).
    """
    import ray

    from rollout.job import resolve_tasks
    from rollout.store import TrajectoryStore

    domains = resolve_tasks(cfg.tasks)
    idents = identities(cfg)
    store = TrajectoryStore(cfg.store)
    try:
        tasks = task_locks(domains, cfg.backend)
        check_lock(store, cfg, idents, resume=resume, tasks=tasks)
        plan = plan_cells(cfg, sorted(domains), idents)
        done = stored_ids(store, cfg.sweep_id)
        todo = [req for _, req in plan if req.episode_id not in done]
        planned_pp: dict[str, int] = {}
        done_pp: dict[str, int] = {}
        for key, req in plan:
            planned_pp[key.policy] = planned_pp.get(key.policy, 0) + 1
            done_pp[key.policy] = done_pp.get(key.policy, 0) + (req.episode_id in done)
        counters: dict[str, Any] = {"planned": len(plan), "skipped": len(plan) - len(todo), "ran": len(todo)}
        if todo:
            started = _init_ray(cfg)
            try:
                _check_placement(cfg)
                counters.update(asyncio.run(_run(cfg, todo, store, domains, planned_pp, done_pp, on_event, on_start)))
            finally:
                if started:
                    ray.shutdown()
            record_images(store, cfg, task_locks(domains, cfg.backend))  # the images this run built
        results, missing = collect(store, cfg, plan)
    finally:
        store.close()
    return SweepRun(cfg, [k for k, _ in plan], results, missing, domains, counters)


def _init_ray(cfg: SweepConfig) -> bool:
    """Connect to or start Ray; True when this call started it. Embedded means ``address="local"``:
    a bare ``ray.init()`` would join whatever head ``ray start`` last left on this machine."""
    import os

    import ray

    if ray.is_initialized():
        return False
    address = cfg.ray.address or ("auto" if os.environ.get("RAY_ADDRESS") else None)
    if address is not None:
        ray.init(address=address, log_to_driver=True)
        return True
    resources = {cfg.ray.worker_resource: float(cfg.workers)} if cfg.ray.worker_resource else None
    ray.init(address="local", num_cpus=cfg.ray.num_cpus, resources=resources, include_dashboard=False, log_to_driver=True)
    return True


def _check_placement(cfg: SweepConfig) -> None:
    import ray

    name = cfg.ray.worker_resource
    if name and ray.cluster_resources().get(name, 0) < 1:
        raise SweepConfigError(
            f"ray.worker_resource: no node of this Ray cluster declares {name!r}; start nodes with "
            f"`ray start --resources '{{\"{name}\": {cfg.workers}}}'` or set ray.worker_resource to null"
        )


async def _run(cfg: SweepConfig, todo: list[CellRequest], store: Any, domains: dict[str, str],
               planned_pp: dict[str, int], done_pp: dict[str, int], on_event: Event | None, on_start: Any) -> dict[str, Any]:
    import time

    from rollout.eval.worker import EndpointLimit, EvalWorkerClient, start_eval_worker
    from rollout.scheduler import Scheduler

    counters: dict[str, int] = {}
    endpoints = {p.name: p.endpoint for p in cfg.policies}
    limits = {p.endpoint: EndpointLimit(p.max_concurrency) for p in cfg.policies if p.endpoint}
    clients = [
        EvalWorkerClient(lambda i=i: start_eval_worker(cfg, i), cfg.concurrency, infra_retries=cfg.retries.infrastructure,
                         backoff_s=cfg.retries.backoff_s, limits=limits, endpoints=endpoints, counters=counters)
        for i in range(cfg.workers)
    ]
    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(c.info() for c in clients))
        if cfg.warm:
            await asyncio.gather(*(c.warm(sorted({r.task_id for r in todo}), cfg.concurrency) for c in clients))
        startup_s = time.perf_counter() - t0
        scheduler = Scheduler(todo, clients, store, sandbox_retries=0, worker_lost_retries=cfg.retries.worker_lost,
                              domains=domains, on_event=on_event)
        if on_start is not None:
            on_start(scheduler, planned_pp, done_pp)
        report = await scheduler.run()
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return {
        **counters, "startup_s": startup_s, "elapsed_s": report.elapsed_s, "stored": report.stored,
        "worker_reruns": report.rerun, "worker_restarts": sum(c.restarts for c in clients),
        "duplicates": report.duplicates, "accounted": report.accounted,
        "episodes_per_s": report.stored / report.elapsed_s if report.elapsed_s else 0.0,
        "endpoints": {e: {"limit": lim.limit, "peak": lim.peak, "throttled": lim.throttled} for e, lim in limits.items()},
    }
