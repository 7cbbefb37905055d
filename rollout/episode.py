"""One async episode: a task variant, through one harness, on a sandbox, into a stored ``Trajectory``.

``EpisodeRunner.run(request)`` runs the request's attempts (``rollout.attempt``):
the emulated attempt (``rollout.emulated_attempt``) for an emulated harness, the
native attempt (``rollout.native_attempt``) for a native agent program
(``native:codex``, ...). Around them it owns what every attempt shares: the
task cache, the warm sandbox pools, the thread pool, the tokenizer, the turn
gate, the policies a request may name, retries and the store.

A failed episode is a record, never an exception: every way an episode can end
is a ``Status`` with a reason in ``error``. ``sandbox_lost`` (an attempt raised
``EpisodeLost``: the container died or hung) is retried ``sandbox_retries``
times from scratch on a fresh sandbox before it is recorded; ``policy_error``
and ``sandbox_lost`` are not graded; ``truncated`` (turns or tokens spent) and
``timeout`` (wall time) are.

Blocking sandbox and grading calls run in the runner's own thread pool
(``loop.run_in_executor``, like ``asyncio.to_thread`` but sized for many
episodes: the default executor has ``cpu_count + 4`` threads), so many episodes
share one event loop.

A policy may take the episode's context: each attempt calls its
``for_episode(ctx)`` (``Policy``'s default returns the policy itself) and samples
from what it returns (the scripted oracle policy uses this to know its task and
harness).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from agentenv.registry import get_task
from agentenv.types import Task, Variant
from rollout.attempt import AttemptHost, EpisodeContext, EpisodeLost, EpisodeRequest, SamplingParams
from rollout.branching import TreeRegistry, leaves_per_root
from rollout.emulated_attempt import run_emulated_attempt
from rollout.gate import TurnGate
from rollout.harnesses import is_native_harness
from rollout.policy.types import Policy
from rollout.pristine import Lease, PristineSandboxes
from rollout.store import TrajectoryStore
from rollout.types import Status, Timings, Trajectory
from sandboxes.types import SandboxBackend, SnapshotRef

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_THREADS = 64
_TASK_CACHE = 256
# The sandbox calls of the current attempt still running in a thread: a cancelled episode (a staleness abort)
# waits for them before its sandbox is released, so no tool call writes after the reset has checked the sandbox.
_IN_THREADS: contextvars.ContextVar[set[Future[Any]] | None] = contextvars.ContextVar("episode_threads", default=None)

#: One attempt at an episode (``rollout.attempt``): the runner's services, the request, its task, the policy it
#: names and the sampling to use, and when the episode started.
Attempt = Callable[[AttemptHost, EpisodeRequest, Task, Policy, SamplingParams, float], Awaitable[Trajectory]]

# Kept importable from here, where they were defined before rollout.attempt held the contract.
__all__ = ["Attempt", "EpisodeContext", "EpisodeLost", "EpisodeRequest", "EpisodeRunner"]


class EpisodeRunner:
    """Runs episodes of any task through any harness with one policy; see the module docstring.

    Usage::

        runner = EpisodeRunner(ScriptedPolicy(), backend=DockerBackend(), store=TrajectoryStore())
        traj = await runner.run(EpisodeRequest("ep-1", "run-1", "general/answer_number", seed=3, harness="codex"))
        runner.close()
    """

    def __init__(
        self,
        policy: Policy,
        *,
        backend: SandboxBackend,
        tokenizer: Any = None,
        sampling: SamplingParams = SamplingParams(),
        pool_size: int = 2,
        store: TrajectoryStore | None = None,
        sandbox_retries: int = 1,
        grade_in_place: bool = True,
        policies: Mapping[str, Policy] | None = None,
        gate: TurnGate | None = None,
    ) -> None:
        self.policy = policy
        self.policies: dict[str, Policy] = dict(policies or {})
        self.gate = gate
        self.backend = backend
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.store = store
        self.sandbox_retries = sandbox_retries
        self.grade_in_place = grade_in_place
        self.sandboxes = PristineSandboxes(backend, pool_size=pool_size)
        self._threads = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="episode")
        self._tasks: dict[str, Task] = {}
        self.trees = TreeRegistry()  # tree rollouts: the checkpoints roots publish and their leaves wait for

    async def run(self, req: EpisodeRequest) -> Trajectory:
        """Run ``req`` to a ``Trajectory`` (stored if the runner has a store). Never raises for a failed episode."""
        started = time.monotonic()
        attempt, lost = req.attempt, []
        traj: Trajectory
        while True:
            try:
                traj = await self._attempt(replace(req, attempt=attempt), started)
            except EpisodeLost as exc:
                lost.append(f"attempt {attempt}: {exc}")
                if attempt - req.attempt < self.sandbox_retries:
                    attempt += 1
                    continue
                traj = self._failure(req, Status.SANDBOX_LOST, "; ".join(lost), started)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug or a broken task must not kill the worker
                log.exception("episode %s failed outside the loop", req.episode_id)
                traj = self._failure(req, Status.ERROR, f"runner error: {type(exc).__name__}: {exc}", started)
            break
        if lost and traj.status is not Status.SANDBOX_LOST:
            traj = replace(traj, verifier={**dict(traj.verifier), "retries": lost})
        if self.store is not None:
            try:
                await self.blocking(self.store.put, traj)
            except Exception:  # noqa: BLE001 - the trajectory is still returned; the caller may put it again
                log.exception("could not store episode %s", req.episode_id)
        return traj

    def warm(self, task_ids: list[str], per_image: int) -> int:
        """Load ``task_ids`` and start ``per_image`` sandboxes of each of their images (blocking); returns
        the number of images. Bad task ids raise here, before any episode."""
        return self.sandboxes.warm([self._task(t) for t in task_ids], per_image)

    def close(self) -> None:
        """Destroy every warm sandbox and stop the threads."""
        self.sandboxes.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ one attempt

    def policy_for(self, req: EpisodeRequest) -> Policy:
        """The policy named by ``req.policy`` (the runner's own when empty); an unknown name is a bug of the caller."""
        if not req.policy:
            return self.policy
        try:
            return self.policies[req.policy]
        except KeyError:
            raise KeyError(
                f"EpisodeRequest.policy: expected one of {sorted(self.policies)} (or '' for the default), got {req.policy!r}"
            ) from None

    async def _attempt(self, req: EpisodeRequest, started: float) -> Trajectory:
        _IN_THREADS.set(set())
        # a native program drives its own loop and the gateway records it; else our loop drives an emulated harness
        attempt: Attempt = run_emulated_attempt
        if is_native_harness(req.harness):
            # Imported with the first native episode: it brings the Docker client (image builds) and the gateway's
            # web stack, which the learner side, importing this module for the in-process runner, never loads.
            from rollout.native_attempt import run_native_attempt

            attempt = run_native_attempt
            if req.branch is not None:  # the program owns its loop: no turn boundary to fork at, nothing to wait for
                why = "a native harness neither branches nor continues a branch: run whole"
                if req.branch.is_root:
                    self.trees.finish(req.branch.root, req.branch.plan().points, why)
                traj = await attempt(self, req, self._task(req.task_id), self.policy_for(req), req.sampling or self.sampling, started)
                return replace(traj, verifier={**dict(traj.verifier), **_branch_failed(req, why)})
        return await attempt(self, req, self._task(req.task_id), self.policy_for(req), req.sampling or self.sampling, started)

    # ------------------------------------------------------------ what attempts use (rollout.attempt.AttemptHost)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the runner's threads, awaited; counted as the current attempt's until it ends."""
        future = self._threads.submit(functools.partial(fn, *args))
        running = _IN_THREADS.get()
        if running is not None:
            running.add(future)
            future.add_done_callback(running.discard)
        return await asyncio.wrap_future(future)

    async def acquire(self, task: Task, variant: Variant) -> Lease:
        """A pristine sandbox of ``variant`` from the runner's threads. A cancellation while the thread still
        acquires gives the lease back when it arrives (``PristineSandboxes.acquire_from``): nothing leaks."""
        return await self.sandboxes.acquire_from(self._threads, task, variant)

    async def restore(self, task: Task, ref: SnapshotRef) -> Lease:
        """A sandbox at the FAST snapshot ``ref`` (a branch or a resume), from the runner's threads; a cancellation
        while the thread still restores gives the lease back when it arrives, like ``acquire``."""
        return await self.sandboxes.restore_from(self._threads, task, ref)

    async def quiesce(self) -> None:
        """Wait for the current attempt's calls still running in threads (shielded: also while it is cancelled)."""
        running = [f for f in (_IN_THREADS.get() or ()) if not f.done()]
        if running:
            await asyncio.shield(asyncio.gather(*(asyncio.wrap_future(f) for f in running), return_exceptions=True))

    def leaf_wait_s(self, req: EpisodeRequest) -> float:
        """How long leaf ``req`` waits for its point's checkpoint: the registry's bound, at most its task's wall time + 60 s."""
        return min(self.trees.wait_s, self._task(req.task_id).limits.wall_time_s + 60.0)

    async def branch_ready(self, req: EpisodeRequest) -> None:
        """For a leaf: return once its point is resolved or failed; a point still open after ``leaf_wait_s``
        fails (the reason names the wait), so the attempt reads the outcome at once and runs whole.

        A caller that bounds concurrency awaits this *before* the leaf takes a slot: a leaf waiting inside a slot
        for a root that waits for a slot stalls the pool until the timeout (issue 29's first comparison run lost
        30 of 480 leaves to it). Roots, plain requests and native harnesses return at once."""
        role = req.branch
        if role is None or role.is_root or is_native_harness(req.harness):
            return
        try:
            timeout_s = self.leaf_wait_s(req)
        except Exception:  # noqa: BLE001 - a bad task id is the attempt's to report, with its field named
            return
        got = await self.trees.wait(role.root, role.point, timeout_s)
        if isinstance(got, str):
            self.trees.fail(role.root, role.point, got)

    # ------------------------------------------------------------ helpers

    def _failure(self, req: EpisodeRequest, status: Status, error: str, started: float) -> Trajectory:
        """The record of an episode that no attempt recorded (sandbox lost on every try, a runner error)."""
        return Trajectory(
            episode_id=req.episode_id, run_id=req.run_id, task_id=req.task_id, domain="", seed=req.seed,
            harness=req.harness, effort=req.effort or "", policy_version=self._version_of(req), status=status,
            reward=0.0, error=error, verifier={"attempt": req.attempt, "group_id": req.group_id, **_branch_failed(req, error)},
            timings=Timings(total_s=time.monotonic() - started),
        )

    def _task(self, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None:
            task = get_task(task_id)
            if len(self._tasks) >= _TASK_CACHE:
                self._tasks.pop(next(iter(self._tasks)))
            self._tasks[task_id] = task
        return task

    def _version_of(self, req: EpisodeRequest) -> int:
        try:
            return int(self.policy_for(req).version)
        except KeyError:
            return int(self.policy.version)


def _branch_failed(req: EpisodeRequest, error: str) -> dict[str, Any]:
    """A tree episode that no attempt recorded still says where in its tree it was, and why it failed."""
    role = req.branch
    if role is None:
        return {}
    return {"branch": {
        "root": role.root, "parent": None if role.is_root else role.root,
        "path": "" if role.is_root else req.episode_id[len(role.root) + 1:], "turn": None, "snapshot": None,
        "prefix_turns": 0, "prefix_tokens": 0, "points": [], "failed": [error], "leaves": leaves_per_root(role.plan()),
    }}
