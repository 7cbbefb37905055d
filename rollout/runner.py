"""The rollout-runner contract the training engine calls, in-process or on Ray workers.

One contract, two implementations, picked by the train config's ``runner:``::

    runner.start(task_ids)                 warm pools; workers up and holding weights version 0
    fut = runner.submit(request)           one episode; resolves to its stored Trajectory (None: dropped as stale)
    await runner.publish(version, state)   new weights, with their version; policies take them between turns
    await runner.pause() / resume()        hold episodes at their next turn boundary while the learner trains
    await runner.close()

* ``InProcessRunner``: an ``EpisodeRunner`` on the caller's event loop (sandbox
  calls in its threads, generation in ``asyncio.to_thread``) and one ``HFPolicy``
  copy of the learner's model. The embedded default on a small machine: no
  second process holds the model, nothing is serialised.
* ``RayRunner``: ``RolloutWorker`` actors (placed by the worker resource, one
  warm pool each, next to their Docker daemon) driven by one open-mode
  ``Scheduler``, which writes every trajectory to the store after the staleness
  check and reruns what a dead worker or node took with it. Weights go through
  the object store: one ``ray.put`` per version, and every worker fetches that
  one object before its next episode; a restarted worker gets the latest.

Both look in the trajectory store before running: an episode already stored
under its id (by an earlier, killed submission of the same run) is returned
from there and not run again, which is what makes ``--resume`` exactly-once.
Requests carry their policy (``train`` or ``oracle``) and sampling, so one set
of workers serves the warm start, training rollouts and evaluations.

The learner never builds a sandbox backend: it only sees this contract.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rollout.attempt import EpisodeRequest
from rollout.config import RolloutConfig
from rollout.episode import EpisodeRunner
from rollout.gate import TurnGate
from rollout.policy.scripted import ScriptedPolicy
from rollout.store import TrajectoryStore
from rollout.types import Trajectory

log = logging.getLogger(__name__)

__all__ = ["InProcessRunner", "RayRunner", "RolloutRunner", "run_all"]


class RolloutRunner(Protocol):
    """What the training engine needs of a rollout runner (see the module docstring)."""

    name: str

    async def start(self, task_ids: Sequence[str]) -> None: ...

    def submit(self, request: EpisodeRequest) -> asyncio.Future[Trajectory | None]: ...

    async def publish(self, version: int, weights: Mapping[str, Any]) -> None: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def close(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


async def run_all(runner: RolloutRunner, requests: Sequence[EpisodeRequest], on_done: Any = None) -> list[Trajectory]:
    """Submit ``requests`` and return their trajectories in request order (dropped ones left out).

    Request order, never completion order: which concurrent episode finishes
    first depends on timing, and a batch that did would not repeat.
    """

    async def one(req: EpisodeRequest) -> Trajectory | None:
        traj = await runner.submit(req)
        if on_done is not None and traj is not None:
            on_done(req, traj)
        return traj

    out = await asyncio.gather(*(one(r) for r in requests))
    return [t for t in out if t is not None]


async def _stored_or_run(store: TrajectoryStore, counts: Counter[str], request: EpisodeRequest, run: Any) -> Trajectory | None:
    """The stored trajectory of ``request`` when an earlier submission of the run stored it; else ``run`` it."""
    stored = await asyncio.to_thread(store.get, request.episode_id)
    if stored is not None:
        counts["from_store"] += 1
        return stored
    return await run(request)  # type: ignore[no-any-return]


def _cpu_state(weights: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}


class InProcessRunner:
    """Episodes on this event loop with a local copy of the policy (``policy.set_weights`` on publish)."""

    name = "inprocess"

    def __init__(
        self,
        policy: Any,
        *,
        tokenizer: Any,
        backend: str,
        run_id: str,
        store: TrajectoryStore,
        concurrency: int = 4,
        pool_size: int = 2,
        grade_in_place: bool = True,
        sandbox_retries: int = 1,
    ) -> None:
        from sandboxes.backends import make_backend

        self.policy = policy
        self.store = store
        self.backend = make_backend(backend, run_id=run_id)  # the sandboxes belong to the runner, never to the learner
        self.gate = TurnGate()
        self.episodes = EpisodeRunner(
            policy, backend=self.backend, tokenizer=tokenizer, pool_size=pool_size, store=store,
            sandbox_retries=sandbox_retries, grade_in_place=grade_in_place,
            policies={"train": policy, "oracle": ScriptedPolicy(), "oracle_effort": ScriptedPolicy(styled=True)}, gate=self.gate,
        )
        self.concurrency = concurrency
        self._sem: asyncio.Semaphore | None = None
        self.counts: Counter[str] = Counter()

    async def start(self, task_ids: Sequence[str]) -> None:
        self._sem = asyncio.Semaphore(self.concurrency)

    def submit(self, request: EpisodeRequest) -> asyncio.Future[Trajectory | None]:
        return asyncio.ensure_future(_stored_or_run(self.store, self.counts, request, self._run))

    async def _run(self, request: EpisodeRequest) -> Trajectory | None:
        self._sem = self._sem or asyncio.Semaphore(self.concurrency)
        await self.episodes.branch_ready(request)  # a leaf waits for its root's checkpoint outside the slots
        async with self._sem:
            self.counts["run"] += 1
            return await self.episodes.run(request)

    async def publish(self, version: int, weights: Mapping[str, Any]) -> None:
        # HFPolicy.set_weights waits for turns in flight and holds new ones back: one version per turn.
        await asyncio.to_thread(self.policy.set_weights, dict(weights), version)

    async def pause(self) -> None:
        self.gate.close()

    async def resume(self) -> None:
        self.gate.open()

    async def close(self) -> None:
        self.gate.open()
        self.episodes.close()
        self.backend.close()

    def describe(self) -> dict[str, Any]:
        return {"runner": self.name, "episodes_run": self.counts["run"], "from_store": self.counts["from_store"]}


class RayRunner:
    """``RolloutWorker`` actors and one open-mode ``Scheduler``; weights through the object store.

    ``rollout`` gives the workers, their placement, the sandbox settings, the
    staleness bound and fault budgets; ``train_model`` / ``tokenizer`` the
    learner's architecture (``WorkerSpec.train_model``).
    """

    name = "ray"

    def __init__(
        self,
        rollout: RolloutConfig,
        *,
        store: TrajectoryStore,
        domains: Mapping[str, str],
        train_model: dict[str, Any],
        tokenizer: str | None = None,
        torch_threads: int | None = 1,
    ) -> None:
        self.cfg = rollout
        self.store = store
        self.domains = dict(domains)
        self.train_model = train_model
        self.tokenizer = tokenizer
        self.torch_threads = torch_threads
        self.clients: list[Any] = []
        self.scheduler: Any = None
        self._loop_task: asyncio.Task[Any] | None = None
        self._started_ray = False
        self._ref: Any = None  # the latest version's object: held so it stays in the object store
        self.versions_published = 0
        self.counts: Counter[str] = Counter()

    async def start(self, task_ids: Sequence[str]) -> None:
        from rollout.job import check_placement, init_ray
        from rollout.scheduler import Scheduler
        from rollout.worker import RayWorkerClient, WorkerSpec, start_worker

        self._started_ray = init_ray(self.cfg.ray, self.cfg.workers)
        check_placement(self.cfg)
        spec = WorkerSpec(
            self.cfg.run_id, self.cfg.policy, self.cfg.sampling, self.cfg.backend, self.cfg.pool_size,
            self.cfg.retries.sandbox_acquire, self.cfg.grading, train_model=self.train_model,
            tokenizer=self.tokenizer, torch_threads=self.torch_threads,
        )
        for i in range(self.cfg.workers):
            self.clients.append(RayWorkerClient(lambda i=i: start_worker(self.cfg, i, spec), slots=self.cfg.concurrency))
        await asyncio.gather(*(c.info() for c in self.clients))  # every worker up before the first episode
        if self.cfg.warm:
            await asyncio.gather(*(c.warm(sorted(task_ids), self.cfg.concurrency) for c in self.clients))
        self.scheduler = Scheduler(
            [], self.clients, self.store, staleness=self.cfg.staleness, sandbox_retries=self.cfg.retries.sandbox_lost,
            worker_lost_retries=self.cfg.retries.worker_lost, domains=self.domains, keep_open=True,
        )
        self._loop_task = asyncio.ensure_future(self.scheduler.run())

    def submit(self, request: EpisodeRequest) -> asyncio.Future[Trajectory | None]:
        return asyncio.ensure_future(_stored_or_run(self.store, self.counts, request, self._run))

    async def _run(self, request: EpisodeRequest) -> Trajectory | None:
        if self._loop_task is not None and self._loop_task.done():
            self._loop_task.result()  # the scheduler died: raise its error here, not a hang
        self.counts["run"] += 1
        return await self.scheduler.submit(request)

    async def publish(self, version: int, weights: Mapping[str, Any]) -> None:
        import ray

        ref = ray.put(_cpu_state(weights))  # one object per version; every worker reads this one
        self._ref = ref
        first = self.scheduler.version == 0 and self.versions_published == 0
        if first:
            self.scheduler.version = version  # the first publish sets the floor; versions only grow after
        self.scheduler.publish(version, [ref])
        self.versions_published += 1
        if first:  # version 0 is loaded everywhere before any episode can start
            await asyncio.gather(*(c.set_policy_version(version, [ref]) for c in self.clients))
            held = await asyncio.gather(*(c.load_now() for c in self.clients))
            if any(v != version for v in held):
                raise RuntimeError(f"RayRunner.publish: workers hold versions {held}, expected {version}")

    async def pause(self) -> None:
        await asyncio.gather(*(c.pause() for c in self.clients))

    async def resume(self) -> None:
        await asyncio.gather(*(c.resume() for c in self.clients))

    async def close(self) -> None:
        import ray

        try:
            if self.scheduler is not None:
                self.scheduler.close()
            if self._loop_task is not None:
                try:
                    await asyncio.wait_for(self._loop_task, timeout=60)
                except Exception as exc:  # noqa: BLE001 - closing: report, keep going
                    log.warning("rollout scheduler ended with %r", exc)
            await asyncio.gather(*(c.close() for c in self.clients), return_exceptions=True)
        finally:
            if self._started_ray:
                ray.shutdown()

    def describe(self) -> dict[str, Any]:
        report = self.scheduler.report.as_dict() if self.scheduler is not None else {}
        return {
            "runner": self.name, "workers": self.cfg.workers, "episodes_run": self.counts["run"],
            "from_store": self.counts["from_store"], "versions_published": self.versions_published,
            "worker_restarts": sum(c.restarts for c in self.clients),
            **{f"scheduler_{k}": v for k, v in report.items() if isinstance(v, (int, float))},
        }
