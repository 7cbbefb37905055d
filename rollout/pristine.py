"""Warm sandboxes already at a task variant's pristine state (the task after its setup).

Why two caches: setup depends on the variant (files drawn from the seed), so a
pool cannot hold "the pristine state of a task"; but every variant of tasks
sharing an image starts from the same fresh container. So there is one
``SandboxPool`` per sandbox spec, keeping fresh containers warm, and one FAST
snapshot per (task, seed, spec) taken right after setup. An episode gets a
warm container with its variant's snapshot applied (``pool.restore``): a group
of G samples of one variant runs setup once, not G times. The first episode of
a variant runs setup in its own sandbox and snapshots it before acting, so it
pays no extra container.

Both caches are bounded (LRU): an evicted snapshot is simply re-made by the
next episode of that variant; an evicted pool is closed only once no sandbox
of it is leased.

Blocking: every method here is synchronous (Docker calls); the episode runner
calls them from worker threads, and awaits an acquire through ``acquire_from``:
a thread cannot be stopped, so an asyncio cancellation (a stopped run, the
staleness abort) while a thread still acquires would drop the lease it then
returns, and its sandbox would never go back to its pool. ``acquire_from``
gives such an orphaned lease back as soon as the thread delivers it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from agentenv.types import Task, Variant
from sandboxes.pool import SandboxPool
from sandboxes.types import Sandbox, SandboxBackend, SandboxSpec, SnapshotKind, SnapshotRef, runs_images

log = logging.getLogger(__name__)

MAX_POOLS = 8  # sandbox specs (images) with a warm pool at once
MAX_PRISTINE = 512  # (task, seed) snapshots remembered
ACQUIRE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Lease:
    """A sandbox at a variant's pristine state, and the pool it goes back to."""

    sandbox: Sandbox
    pool: SandboxPool
    fresh_setup: bool  # True when setup ran for this episode (the variant's first)


@dataclass
class _VariantLock:
    """A variant's set-up lock and how many threads hold it or wait for it (guarded by the owner's lock)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class PristineSandboxes:
    """Hands out sandboxes at a variant's pristine state; see the module docstring.

    Usage::

        sandboxes = PristineSandboxes(backend, pool_size=2)
        lease = sandboxes.acquire(task, task.variant(3))
        ...                                   # the episode
        sandboxes.release(lease)
        sandboxes.close()
    """

    def __init__(self, backend: SandboxBackend, *, pool_size: int = 2) -> None:
        self.backend = backend
        self.pool_size = pool_size
        self._build = runs_images(backend)
        self._pools: OrderedDict[str, SandboxPool] = OrderedDict()
        # Grading sandboxes come from pools of their own: an agent holding every sandbox of
        # its pool must never wait on itself to be graded.
        self._grading_pools: dict[str, SandboxPool] = {}
        self._leases: dict[str, int] = {}  # spec key -> sandboxes out
        self._specs: dict[str, SandboxSpec] = {}  # task id -> spec (sandbox_spec() may build an image)
        self._pristine: OrderedDict[tuple[str, int, str], SnapshotRef] = OrderedDict()
        # Only variants someone holds or waits for: an entry leaves with its last user, so the map
        # stays as small as the concurrency and no lock is ever dropped while it is handed out.
        self._variant_locks: dict[tuple[str, int, str], _VariantLock] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._min_size = 0  # the least ``max_size`` of a pool: what ``warm`` was asked for, plus spares
        self.stats = {"setups": 0, "restores": 0, "orphaned_leases": 0}

    # ------------------------------------------------------------ public

    def spec(self, task: Task) -> SandboxSpec:
        with self._lock:
            spec = self._specs.get(task.id)
        if spec is None:
            spec = task.sandbox_spec(build=self._build)
            with self._lock:
                self._specs[task.id] = spec
        return spec

    def acquire(self, task: Task, variant: Variant) -> Lease:
        """A sandbox at ``variant``'s pristine state. Raises what setup or the backend raise."""
        spec = self.spec(task)
        pool = self._pool(spec)
        key = (task.id, variant.seed, spec.key())
        try:
            with self._variant_lock(key):  # one setup per variant; its other episodes wait, then restore
                ref = self._cached(key)
                if ref is None:
                    sandbox = pool.acquire(timeout=ACQUIRE_TIMEOUT_S)
                    try:
                        task.setup(sandbox, variant)
                        ref = sandbox.snapshot(SnapshotKind.FAST)
                    except BaseException:
                        pool.release(sandbox)
                        raise
                    self._remember(key, ref)
                    self.stats["setups"] += 1
                    return Lease(sandbox, pool, fresh_setup=True)
            sandbox = pool.restore(ref, timeout=ACQUIRE_TIMEOUT_S)
            self.stats["restores"] += 1
            return Lease(sandbox, pool, fresh_setup=False)
        except BaseException:
            self._returned(pool)
            raise

    def restore(self, task: Task, ref: SnapshotRef) -> Lease:
        """A warm sandbox of ``task``'s pool with the FAST snapshot ``ref`` (an episode's turn boundary) applied:
        one continuation of a branched or resumed episode. Raises what the backend raises."""
        pool = self._pool(self.spec(task))
        try:
            sandbox = pool.restore(ref, timeout=ACQUIRE_TIMEOUT_S)
        except BaseException:
            self._returned(pool)
            raise
        self.stats["restores"] += 1
        return Lease(sandbox, pool, fresh_setup=False)

    async def acquire_from(self, executor: concurrent.futures.Executor, task: Task, variant: Variant) -> Lease:
        """``acquire`` on one of ``executor``'s threads, awaited. Cancelled while the thread still acquires,
        it re-raises the cancellation and releases the lease the thread delivers later (never leaked)."""
        return await self._lease_from(executor.submit(self.acquire, task, variant))

    async def restore_from(self, executor: concurrent.futures.Executor, task: Task, ref: SnapshotRef) -> Lease:
        """``restore`` on one of ``executor``'s threads, awaited; a cancellation leaks nothing (``acquire_from``)."""
        return await self._lease_from(executor.submit(self.restore, task, ref))

    async def _lease_from(self, future: concurrent.futures.Future[Lease]) -> Lease:
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._release_orphan)  # runs at once if the thread is already done
            raise

    def _release_orphan(self, future: concurrent.futures.Future[Lease]) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # never started, or failed: ``acquire`` gave back what it held
        try:
            self.release(future.result())
            self.stats["orphaned_leases"] += 1
        except Exception:  # noqa: BLE001 - a callback on a worker thread: log, never raise
            log.exception("could not give back a lease acquired for a cancelled episode")

    def warm(self, tasks: list[Task], per_image: int, timeout: float = ACQUIRE_TIMEOUT_S) -> int:
        """Start ``per_image`` sandboxes of every image ``tasks`` use and wait for them; returns how many
        pools were warmed. A run does this before its first episode, so no episode waits on a start."""
        specs = {spec.key(): spec for spec in (self.spec(t) for t in tasks)}
        self._min_size = max(self._min_size, per_image + self.pool_size)  # room for the concurrency + spares
        for spec in specs.values():
            pool = self._pool(spec)
            try:
                pool.max_size = max(pool.max_size, self._min_size)
                pool.warm(timeout=timeout, n=per_image)
            finally:
                self._returned(pool)
        return len(specs)

    def release(self, lease: Lease) -> None:
        """Give the sandbox back (reset in place, or destroyed and replaced, in the background by its pool)."""
        try:
            lease.pool.release(lease.sandbox)
        finally:
            self._returned(lease.pool)

    def grading_restore(self, ref: SnapshotRef) -> Sandbox:
        """A warm sandbox with the agent's final state ``ref`` applied, for grading."""
        key = ref.spec.key()
        with self._lock:
            if self._closed:
                from sandboxes.errors import PoolClosed

                raise PoolClosed("the episode runner's sandboxes are closed")
            pool = self._grading_pools.get(key)
            if pool is None:
                size = self.pool_size // 2  # 0: started on demand, then reset and reused
                pool = self._grading_pools[key] = SandboxPool(self.backend, ref.spec, size=size, max_size=max(4 * size, 4))
        return pool.restore(ref, timeout=ACQUIRE_TIMEOUT_S)

    def pristine_copy(self, task: Task, variant: Variant) -> tuple[Sandbox, Callable[[], None]] | None:
        """A grading-pool sandbox at ``variant``'s set-up state and its disposer, or None when no snapshot
        of that state is cached (the oracle replay then starts and sets up a sandbox of its own)."""
        ref = self._cached((task.id, variant.seed, self.spec(task).key()))
        if ref is None:
            return None
        sandbox = self.grading_restore(ref)
        return sandbox, lambda: self.grading_discard(sandbox)

    def grading_discard(self, sandbox: Sandbox) -> None:
        """Give a grading sandbox back (reset in place, or destroyed and replaced, in the background)."""
        with self._lock:
            pool = self._grading_pools.get(sandbox.spec.key())
        if pool is None:
            sandbox.close()
        else:
            pool.release(sandbox)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools = [*self._pools.values(), *self._grading_pools.values()]
            self._pools.clear()
            self._grading_pools.clear()
        for pool in pools:
            pool.close()

    # ------------------------------------------------------------ internals

    def _pool(self, spec: SandboxSpec) -> SandboxPool:
        key = spec.key()
        doomed: list[SandboxPool] = []
        with self._lock:
            if self._closed:
                from sandboxes.errors import PoolClosed

                raise PoolClosed("the episode runner's sandboxes are closed")
            pool = self._pools.get(key)
            if pool is None:
                cap = max(4 * self.pool_size, 4, self._min_size)
                pool = SandboxPool(self.backend, spec, size=self.pool_size, max_size=cap)
                self._pools[key] = pool
                idle = [k for k in self._pools if k != key and not self._leases.get(k)]
                while len(self._pools) > MAX_POOLS and idle:
                    doomed.append(self._pools.pop(idle.pop(0)))
            self._pools.move_to_end(key)
            self._leases[key] = self._leases.get(key, 0) + 1
        for old in doomed:
            old.close()
        return pool

    def _returned(self, pool: SandboxPool) -> None:
        with self._lock:
            key = pool.spec.key()
            self._leases[key] = max(self._leases.get(key, 1) - 1, 0)

    @contextlib.contextmanager
    def _variant_lock(self, key: tuple[str, int, str]) -> Iterator[None]:
        """Hold ``key``'s set-up lock. Why counted, not pruned: a lock must stay in the map from the
        moment it is handed out until its last user lets go, or a second thread gets a new lock for
        the same variant and both set it up at once."""
        with self._lock:
            entry = self._variant_locks.get(key)
            if entry is None:
                entry = self._variant_locks[key] = _VariantLock()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._lock:
                entry.users -= 1
                if entry.users == 0:
                    del self._variant_locks[key]

    def _cached(self, key: tuple[str, int, str]) -> SnapshotRef | None:
        with self._lock:
            ref = self._pristine.get(key)
            if ref is not None:
                self._pristine.move_to_end(key)
            return ref

    def _remember(self, key: tuple[str, int, str], ref: SnapshotRef) -> None:
        with self._lock:
            self._pristine[key] = ref
            while len(self._pristine) > MAX_PRISTINE:
                self._pristine.popitem(last=False)


__all__ = ["Lease", "PristineSandboxes"]
