"""The sweep's Ray worker: one actor per Docker daemon slot holding *every* policy of the sweep.

Why not ``rollout.worker.RolloutWorker``: that worker plays one policy. A sweep
plays several on the same variants, and the warm sandboxes of an image should
serve all of them, so ``EvalWorker`` builds one ``EpisodeRunner`` per policy and
gives them one shared ``PristineSandboxes`` (pools and variant snapshots),
routing each request by its ``policy`` field. A runner per policy, not one
runner with every policy, because a runner has one tokenizer: a local
checkpoint renders token ids, a reference or a chat endpoint must not.

``EvalWorkerClient`` extends ``RayWorkerClient`` (which survives the actor's
death and raises ``WorkerLost`` for the scheduler to rerun) with the sweep's
failure policy: an episode whose outcome is *infrastructure* is rerun up to
``retries.infrastructure`` times with doubling backoff, every attempt's reason
kept on the stored trajectory (``verifier["infra_retries"]``); and episodes of
an ``openai`` policy first take a slot of that endpoint's ``EndpointLimit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from rollout.attempt import EpisodeRequest as CellRequest
from rollout.eval.policies import Counted, build_eval_policy
from rollout.eval.types import Outcome, outcome_of
from rollout.types import Trajectory
from rollout.worker import RayWorkerClient

if TYPE_CHECKING:
    from rollout.eval.config import PolicySpec, SweepConfig

log = logging.getLogger(__name__)

__all__ = ["EndpointLimit", "EvalWorker", "EvalWorkerClient", "EvalWorkerSpec", "start_eval_worker"]


@dataclass(frozen=True)
class EvalWorkerSpec:
    """Plain data (it pickles): what a worker needs to build itself on its node."""

    sweep_id: str
    policies: tuple[PolicySpec, ...]
    backend: Literal["docker", "local"] = "docker"
    pool_size: int = 1
    sandbox_retries: int = 1
    grading: Literal["in_place", "fork"] = "in_place"

    @classmethod
    def from_config(cls, cfg: SweepConfig) -> EvalWorkerSpec:
        return cls(cfg.sweep_id, cfg.policies, cfg.backend, cfg.pool_size, cfg.retries.sandbox_acquire, cfg.grading)


class EvalWorker:
    """The body of the sweep's worker actor; usable without Ray (``await EvalWorker(spec).run(req)``)."""

    def __init__(self, spec: EvalWorkerSpec, index: int = 0) -> None:
        from rollout.episode import EpisodeRunner
        from rollout.policy.types import SamplingParams
        from sandboxes.backends import make_backend

        self.spec, self.index = spec, index
        self.backend = make_backend(spec.backend, run_id=spec.sweep_id)
        self.runners: dict[str, Any] = {}
        self.counted: dict[str, Counted] = {}
        shared = None
        for p in spec.policies:
            policy, tokenizer = build_eval_policy(p)
            counted = Counted(policy)
            s = p.sampling
            runner = EpisodeRunner(
                counted,  # type: ignore[arg-type]
                backend=self.backend, tokenizer=tokenizer,
                sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens),
                pool_size=spec.pool_size, store=None, sandbox_retries=spec.sandbox_retries,
                grade_in_place=spec.grading == "in_place", policies={p.name: counted},  # type: ignore[dict-item]
            )
            if shared is None:
                shared = runner.sandboxes
            else:  # one set of warm pools and variant snapshots for every policy
                runner.sandboxes.close()
                runner.sandboxes = shared
            self.runners[p.name] = runner
            self.counted[p.name] = counted
        self.running = self.finished = 0
        self._closed = False

    async def run(self, request: CellRequest) -> Trajectory:
        """One cell's episode; never raises for an episode failure (its status says it)."""
        runner = self.runners.get(request.policy)
        if runner is None or self._closed:
            raise RuntimeError(f"worker {self.index}: no policy {request.policy!r} (has {sorted(self.runners)}) or closed")
        self.running += 1
        t0 = time.monotonic()
        try:
            traj: Trajectory = await runner.run(request)
        finally:
            self.running -= 1
            self.finished += 1
        counts = self.counted[request.policy].counts.pop(request.episode_id, {})
        extra = {**counts, "policy": request.policy, "worker": self.index, "wall_s": time.monotonic() - t0}
        return replace(traj, verifier={**dict(traj.verifier), "eval": extra})

    async def warm(self, task_ids: list[str], per_image: int) -> dict[str, Any]:
        t0 = time.monotonic()
        runner = next(iter(self.runners.values()))
        images = await asyncio.get_running_loop().run_in_executor(None, runner.warm, list(task_ids), per_image)
        return {"index": self.index, "images": images, "per_image": per_image, "seconds": time.monotonic() - t0}

    def set_policy_version(self, version: int, weights: Any = None) -> None:
        """Sweeps evaluate fixed weights; a version broadcast is ignored (the version is in the cell key)."""

    def info(self) -> dict[str, Any]:
        return {"index": self.index, "pid": os.getpid(), "host": socket.gethostname(), "running": self.running,
                "finished": self.finished, "policies": sorted(self.runners)}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for i, runner in enumerate(self.runners.values()):
                if i == 0:
                    runner.close()  # owns the shared pools
                else:
                    runner._threads.shutdown(wait=False, cancel_futures=True)
        finally:
            self.backend.close()


def start_eval_worker(cfg: SweepConfig, index: int) -> Any:
    """A new ``EvalWorker`` actor, placed by ``cfg.ray.worker_resource``, restarted by Ray on death."""
    import ray

    options: dict[str, Any] = {
        "max_concurrency": cfg.concurrency + 4,
        "max_restarts": cfg.retries.worker_restarts,
        "max_task_retries": 0,
        "num_cpus": cfg.ray.worker_cpus,
    }
    if cfg.ray.worker_resource:
        options["resources"] = {cfg.ray.worker_resource: 1}
    if cfg.ray.spread:  # one worker per node (per Docker daemon) before two on one
        options["scheduling_strategy"] = "SPREAD"
    return ray.remote(EvalWorker).options(**options).remote(EvalWorkerSpec.from_config(cfg), index)  # type: ignore[attr-defined]


class EndpointLimit:
    """Episodes in flight against one endpoint: at most ``limit``, shrunk x0.8 on a 429, grown by one
    after ``limit`` clean episodes, never above ``maximum`` or below 1 (driver side, one event loop)."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.limit = float(maximum)
        self.in_flight = 0
        self.peak = 0
        self.throttled = 0
        self._clean = 0
        self._cond: asyncio.Condition | None = None

    @contextlib.asynccontextmanager
    async def slot(self) -> Any:
        self._cond = self._cond or asyncio.Condition()
        async with self._cond:
            await self._cond.wait_for(lambda: self.in_flight < max(1, int(self.limit)))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            yield
        finally:
            async with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    def feedback(self, traj: Trajectory) -> None:
        if traj.status.value == "policy_error" and "HTTP 429" in traj.error:
            self.throttled += 1
            self.limit = max(1.0, self.limit * 0.8)
            self._clean = 0
        else:
            self._clean += 1
            if self._clean >= self.limit:
                self.limit, self._clean = min(float(self.maximum), self.limit + 1), 0


class EvalWorkerClient(RayWorkerClient):
    """``RayWorkerClient`` plus the sweep's infrastructure retries and per-endpoint bounds."""

    def __init__(self, make: Any, slots: int, *, infra_retries: int, backoff_s: float,
                 limits: dict[str, EndpointLimit], endpoints: dict[str, str | None], counters: dict[str, int]) -> None:
        super().__init__(make, slots)
        self.infra_retries, self.backoff_s = infra_retries, backoff_s
        self.limits, self.endpoints, self.counters = limits, endpoints, counters

    async def run(self, request: CellRequest) -> Trajectory:  # type: ignore[override]
        endpoint = self.endpoints.get(request.policy)
        limit = self.limits.get(endpoint) if endpoint else None
        reasons: list[str] = []
        while True:
            attempt = replace(request, attempt=request.attempt + len(reasons))
            async with limit.slot() if limit is not None else contextlib.nullcontext():
                traj = await super().run(attempt)
            if limit is not None:
                limit.feedback(traj)
            passed = traj.verifier.get("passed") if isinstance(traj.verifier.get("passed"), bool) else None
            if outcome_of(traj.status.value, traj.reward, traj.error, passed) is not Outcome.INFRASTRUCTURE:
                break
            reasons.append(f"{traj.status.value}: {traj.error[:500]}")
            self.counters["infra_errors"] = self.counters.get("infra_errors", 0) + 1
            if len(reasons) > self.infra_retries:
                break
            self.counters["infra_retries"] = self.counters.get("infra_retries", 0) + 1
            await asyncio.sleep(self.backoff_s * 2 ** (len(reasons) - 1))
        if reasons:
            traj = replace(traj, verifier={**dict(traj.verifier), "infra_retries": reasons})
        return traj
