"""The rollout scheduler: plan groups, keep workers busy, enforce staleness, account for every episode once.

What it guarantees, and how:

* **Groups.** ``plan_episodes`` makes ``G`` requests per (task, variant seed),
  sharing a ``group_id``, with the harness (``RotationPolicy.pick(i)``) and the
  effort (``EffortDraw.pick(i)``) drawn per planned episode index ``i``: a pure
  function of the config, so the same config plans the same run, whoever asks.
  Episode ids are deterministic (``run/task/seed/k``), which makes a re-submitted
  run resume: episodes already in the store are skipped.
* **Backpressure.** At most ``slots`` episodes are in flight per worker; the rest
  wait in a queue here, not in Ray's mailboxes, so an aborted or rerun episode
  never sits behind a long tail.
* **Group locality.** A group's episodes go to one home worker while it has a
  free slot (its variant is set up once there and restored from a snapshot for
  the rest); a worker with nothing of its own takes a new group, then steals.
* **Hard staleness bound.** The scheduler, not the worker, writes trajectories,
  so nothing reaches the store (where the learner reads) unchecked. A trajectory
  with ``learner_version - policy_version > K`` is resumed (run again on current
  weights) or dropped, by the named ``StalePolicy``; both are counted. When the
  learner publishes a version, episodes in flight since a version that is now
  more than K behind are aborted at once instead of finishing for nothing.
* **Faults.** A worker that dies (``WorkerLost``) takes its episodes with it; they
  are queued again (the worker client restarts or re-creates the actor). A
  ``sandbox_lost`` trajectory is run again ``retries.sandbox_lost`` times. Budgets
  spent, the last failure is stored as a record with a reason, never raised.
* **Exactly once.** Every planned episode ends as exactly one of: stored (under its
  planned id; ``put`` is idempotent), dropped as stale, or skipped (already stored
  by an earlier submission). ``RolloutReport.accounted`` checks the sum.
* **Open mode** (the training engine's): ``keep_open=True`` keeps ``run()`` going
  while the queue is empty; ``submit(request)`` adds an episode and returns a
  future that resolves to its stored trajectory (``None`` when it was dropped as
  stale); ``close()`` lets ``run()`` return once everything submitted is settled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollout.attempt import EpisodeRequest
from rollout.config import RolloutConfig, StalePolicy, StalenessConfig
from rollout.errors import ConfigError, StalenessError, WorkerLost
from rollout.types import Status, Trajectory

log = logging.getLogger(__name__)
LOCALITY_WINDOW = 256  # queued requests scanned for one of a worker's own groups

__all__ = ["RolloutReport", "Scheduler", "WorkerClient", "WorkerLost", "plan_episodes"]


class WorkerClient(Protocol):
    """What the scheduler needs of one worker. ``rollout.worker.RayWorkerClient`` is the real one.

    ``run`` raises ``WorkerLost`` when the worker died under the episode (and has
    arranged a replacement before raising); when the awaiting task is cancelled it
    must abort the remote episode too.
    """

    slots: int

    async def run(self, request: EpisodeRequest) -> Trajectory: ...

    async def set_policy_version(self, version: int, weights: Any = None) -> None: ...


def plan_episodes(cfg: RolloutConfig, task_ids: Sequence[str]) -> list[EpisodeRequest]:
    """Every episode of the run, in group order: ``G`` per (task, seed), draws per episode index."""
    if cfg.branching.on:
        raise ConfigError("branching: tree rollouts run in a training run's in-process runner only; a rollout job's "
                          "Ray workers would split a root from its leaves (set branching.kind: off)")
    plan: list[EpisodeRequest] = []
    for task_id in task_ids:
        for seed in cfg.seeds:
            group_id = f"{cfg.run_id}/{task_id}/{seed}"
            for k in range(cfg.group_size):
                i = len(plan)
                plan.append(
                    EpisodeRequest(
                        episode_id=f"{group_id}/{k}",
                        run_id=cfg.run_id,
                        task_id=task_id,
                        seed=seed,
                        harness=cfg.rotation.pick(i),
                        effort=cfg.efforts.pick(i),
                        group_id=group_id,
                        resume_from_snapshots=cfg.resume_from_snapshots,
                    )
                )
    return plan


@dataclass
class RolloutReport:
    """How every planned episode ended. ``stored + dropped + skipped == planned`` when the run is whole.

    ``retried``: sandbox_lost reruns; ``rerun``: episodes rerun because their worker
    died; ``resumed``: stale episodes aborted and run again; ``dropped``: stale and
    discarded (ids in ``dropped_ids``); ``failed``: stored with a non-ok status.
    """

    planned: int = 0
    skipped: int = 0
    stored: int = 0
    ok: int = 0
    failed: int = 0
    retried: int = 0
    rerun: int = 0
    resumed: int = 0
    dropped: int = 0
    duplicates: int = 0
    worker_restarts: int = 0
    tool_calls: int = 0
    elapsed_s: float = 0.0
    store_s: float = 0.0
    by_status: dict[str, int] = field(default_factory=dict)
    dropped_ids: list[str] = field(default_factory=list)

    @property
    def accounted(self) -> bool:
        return self.stored + self.dropped + self.skipped == self.planned

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"accounted": self.accounted}


class Store(Protocol):
    def put(self, trajectory: Trajectory) -> bool: ...


# Events passed to ``on_event``: what happened to which request, with its trajectory when there is one.
Event = Callable[[str, "EpisodeRequest", "Trajectory | None"], None]


@dataclass
class _Flight:
    request: EpisodeRequest
    worker: int
    version: int  # the learner's version when it was dispatched
    task: asyncio.Task[Trajectory]


class Scheduler:
    """Runs ``requests`` on ``workers`` and writes their trajectories to ``store``, exactly once each.

    ``domains`` maps task id to domain, used only for the failure records the
    scheduler writes itself. ``publish(version)`` is the learner's hook: call it
    from the scheduler's event loop (or via ``loop.call_soon_threadsafe``).
    """

    def __init__(
        self,
        requests: Sequence[EpisodeRequest],
        workers: Sequence[WorkerClient],
        store: Store,
        *,
        staleness: StalenessConfig = StalenessConfig(),
        sandbox_retries: int = 1,
        worker_lost_retries: int = 3,
        domains: dict[str, str] | None = None,
        on_event: Event | None = None,
        version: int = 0,
        skipped: int = 0,
        keep_open: bool = False,
    ) -> None:
        if not workers:
            raise ConfigError("Scheduler: workers: expected at least one worker, got none")
        self.workers = list(workers)
        self.store = store
        self.staleness = staleness
        self.sandbox_retries = sandbox_retries
        self.worker_lost_retries = worker_lost_retries
        self.domains = domains or {}
        self.on_event = on_event
        self.version = version
        self.report = RolloutReport(planned=len(requests) + skipped, skipped=skipped)
        self._queue: deque[EpisodeRequest] = deque(requests)
        self._flights: dict[asyncio.Task[Trajectory], _Flight] = {}
        self._load = [0] * len(self.workers)
        self._home: dict[str, int] = {}  # group id -> the worker holding its variant's sandboxes
        self._tries: Counter[tuple[str, str]] = Counter()  # (episode id, kind) -> reruns spent
        self._aborted: set[asyncio.Task[Trajectory]] = set()
        self._wake = asyncio.Event()
        self.max_in_flight = 0
        self._open = keep_open
        self._futures: dict[str, asyncio.Future[Trajectory | None]] = {}
        self._submitted: set[str] = set()  # an episode id runs once per scheduler, whatever became of it

    # ------------------------------------------------------------------ open mode

    def submit(self, request: EpisodeRequest) -> asyncio.Future[Trajectory | None]:
        """Queue one more episode (open mode); the future resolves when it is stored (or dropped: None)."""
        if request.episode_id in self._submitted:
            raise ConfigError(f"Scheduler.submit: episode_id: {request.episode_id!r} is already submitted")
        future: asyncio.Future[Trajectory | None] = asyncio.get_running_loop().create_future()
        self._futures[request.episode_id] = future
        self._submitted.add(request.episode_id)
        self._queue.append(request)
        self.report.planned += 1
        self._wake.set()
        return future

    def close(self) -> None:
        """End open mode: ``run()`` returns when what was submitted is settled."""
        self._open = False
        self._wake.set()

    def _resolve(self, req: EpisodeRequest, traj: Trajectory | None) -> None:
        future = self._futures.pop(req.episode_id, None)
        if future is not None and not future.done():
            future.set_result(traj)

    # ------------------------------------------------------------------ learner hook

    def publish(self, version: int, weights: Any = None) -> None:
        """The learner has weights ``version``: tell workers (with ``weights``, e.g. ``[ObjectRef]``, for a
        model policy), abort episodes now certain to be too stale."""
        if version < self.version:
            raise StalenessError(f"publish: version: versions only grow, expected >= {self.version}, got {version}")
        self.version = version
        for w in self.workers:
            asyncio.ensure_future(w.set_policy_version(version, weights))
        floor = version - self.staleness.max_lag
        for task, flight in self._flights.items():
            if flight.version < floor and task not in self._aborted:
                self._aborted.add(task)
                task.cancel()
        self._wake.set()

    def is_stale(self, trajectory: Trajectory) -> bool:
        return self.version - trajectory.policy_version > self.staleness.max_lag

    # ------------------------------------------------------------------ main loop

    async def run(self) -> RolloutReport:
        """Until every request is stored, dropped or failed for good; returns the report."""
        t0 = time.perf_counter()
        while self._queue or self._flights or self._open:
            self._dispatch()
            self._wake.clear()
            waiters: set[asyncio.Future[Any]] = set(self._flights)
            wake = asyncio.ensure_future(self._wake.wait())
            done, _ = await asyncio.wait(waiters | {wake}, return_when=asyncio.FIRST_COMPLETED)
            wake.cancel()
            for task in done:
                if task is not wake:
                    await self._settle(task)  # type: ignore[arg-type]
        self.report.elapsed_s = time.perf_counter() - t0
        return self.report

    def _dispatch(self) -> None:
        while self._queue:
            free = [i for i, w in enumerate(self.workers) if self._load[i] < w.slots]
            if not free:
                return  # backpressure: the queue waits here until a slot frees
            i = min(free, key=lambda j: self._load[j] / self.workers[j].slots)
            req = self._take_for(i)
            task = asyncio.ensure_future(self.workers[i].run(req))
            self._flights[task] = _Flight(req, i, self.version, task)
            self._load[i] += 1
            self.max_in_flight = max(self.max_in_flight, len(self._flights))
            self._emit("start", req, None)

    def _take_for(self, worker: int) -> EpisodeRequest:
        """The next request for ``worker``: group locality first, never an idle slot.

        A group's episodes share their variant's setup and its pristine snapshot,
        which live in one worker's pools; so a group has a home worker (the first
        to take one of its episodes). In the first ``LOCALITY_WINDOW`` queued
        requests, in order: one of a group at home here, else one of a group with
        no home yet (it moves in), else the first request (stolen: a free slot
        never waits while work is queued).
        """
        claim: int | None = None
        for n, req in enumerate(itertools.islice(self._queue, LOCALITY_WINDOW)):
            home = self._home.get(req.group_id) if req.group_id else worker
            if home == worker:
                claim = n
                break
            if home is None and claim is None:
                claim = n
        n = claim or 0
        req = self._queue[n]
        del self._queue[n]
        if req.group_id:
            self._home.setdefault(req.group_id, worker)
        return req

    async def _settle(self, task: asyncio.Task[Trajectory]) -> None:
        flight = self._flights.pop(task)
        self._load[flight.worker] -= 1
        req = flight.request
        aborted = task in self._aborted
        self._aborted.discard(task)
        if task.cancelled():
            if aborted:
                self._stale(req, None)
            else:  # cancelled by someone else: the episode still owes a result
                self._requeue(req, "rerun")
            return
        exc = task.exception()
        if isinstance(exc, WorkerLost):
            self.report.rerun += 1
            if self._spend(req, "worker_lost", self.worker_lost_retries):
                self._requeue(req, "rerun")
            else:
                reason = f"worker lost {self.worker_lost_retries + 1} times: {exc}"
                await self._write(req, self._failure(req, reason, Status.WORKER_LOST))
            return
        if exc is not None:  # a bug in the worker: a bad rollout is data, not a crash of the run
            log.warning("episode %s raised %r", req.episode_id, exc)
            await self._write(req, self._failure(req, f"worker raised {type(exc).__name__}: {exc}", Status.ERROR))
            return
        traj = task.result()
        if self.is_stale(traj):
            self._stale(req, traj)
        elif traj.status is Status.SANDBOX_LOST and self._spend(req, "sandbox_lost", self.sandbox_retries):
            self.report.retried += 1
            self._requeue(req, "retry", traj)
        else:
            await self._write(req, traj)

    def _stale(self, req: EpisodeRequest, traj: Trajectory | None) -> None:
        policy = self.staleness.policy
        if policy is StalePolicy.ABORT_AND_RESUME and self._spend(req, "stale", self.staleness.max_resumes):
            self.report.resumed += 1
            self._requeue(req, "resume", traj)
        else:
            self.report.dropped += 1
            self.report.dropped_ids.append(req.episode_id)
            self._emit("drop", req, traj)
            self._resolve(req, None)

    def _spend(self, req: EpisodeRequest, kind: str, budget: int) -> bool:
        key = (req.episode_id, kind)
        if self._tries[key] >= budget:
            return False
        self._tries[key] += 1
        return True

    def _requeue(self, req: EpisodeRequest, why: str, traj: Trajectory | None = None) -> None:
        # front of the queue: a rerun finishes its group instead of waiting behind new work
        self._queue.appendleft(dataclasses.replace(req, attempt=req.attempt + 1))
        self._emit(why, req, traj)

    async def _write(self, req: EpisodeRequest, traj: Trajectory) -> None:
        t0 = time.perf_counter()
        inserted = await asyncio.to_thread(self.store.put, traj)
        r = self.report
        r.store_s += time.perf_counter() - t0
        if not inserted:
            r.duplicates += 1  # stored by an earlier submission of this run: still exactly once
        r.stored += 1
        r.ok += traj.status is Status.OK
        r.failed += traj.status is not Status.OK
        r.by_status[traj.status.value] = r.by_status.get(traj.status.value, 0) + 1
        r.tool_calls += sum(t.tool_calls for t in traj.turns)
        self._emit("stored", req, traj)
        self._resolve(req, traj)

    def _failure(self, req: EpisodeRequest, reason: str, status: Status) -> Trajectory:
        return Trajectory(
            episode_id=req.episode_id,
            run_id=req.run_id,
            task_id=req.task_id,
            domain=self.domains.get(req.task_id, ""),
            seed=req.seed,
            harness=req.harness,
            effort=req.effort or "",
            policy_version=self.version,
            status=status,
            reward=0.0,
            error=reason[:2000],
        )

    def _emit(self, event: str, req: Any, traj: Trajectory | None) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event, req, traj)
            except Exception:  # a progress bar must never break the run
                log.exception("on_event(%s) failed", event)
