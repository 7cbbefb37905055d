"""A warm pool of sandboxes for one (backend, spec), so the hot path never waits on a start.

``acquire`` hands out a sandbox that is already at the pristine state: a fresh
container of the spec's image, or, when the pool was given a ``pristine``
FAST snapshot (a task after its setup), that snapshot already applied.
``release`` gives it back. When the backend has ``reset(sandbox, timeout=)``
(``DockerBackend``), the pool resets it in place in the background (bounded by
``reset_timeout``), re-applies ``pristine`` if set, and puts it back in the
ready queue: no new container. When the backend refuses (returns False),
fails or is too slow, or has no ``reset``, the sandbox is destroyed and a
replacement started in the background, as before. Either way the reset never
sits on the caller's path and a dirty sandbox is never handed out twice: a
released sandbox re-enters the ready queue only after a reset that returned
True. The pool never holds more than ``max_size`` sandboxes (warm + leased +
starting + resetting).

``restore(ref)`` / ``fork(ref, n)`` apply any FAST snapshot onto warm pristine
sandboxes: that is what makes mid-episode branching cheap.

At start the pool sweeps its own run's leftovers: containers labelled with
this run id whose owning process is gone (a crashed earlier worker of the same
run). It never touches a live owner's sandboxes.

Usage::

    with SandboxPool(DockerBackend(), SandboxSpec(image=tag), size=4) as pool:
        sb = pool.acquire(timeout=30)
        sb.exec("make test")
        pool.release(sb)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from sandboxes.errors import PoolClosed, SandboxError, SandboxTimeout, SpecError
from sandboxes.types import (
    LabelledBackend,
    ResettableBackend,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
    SnapshotApplier,
    SnapshotKind,
    SnapshotRef,
)

__all__ = ["SandboxPool"]


log = logging.getLogger(__name__)


class SandboxPool:
    """Warm sandboxes for one spec. Thread-safe.

    ``size`` is how many warm sandboxes the pool keeps ready; ``max_size``
    (default ``2 * size``) bounds everything it holds at once, leased included.
    ``starters`` is how many sandboxes may be starting at the same time.
    """

    def __init__(
        self,
        backend: SandboxBackend,
        spec: SandboxSpec,
        *,
        size: int = 4,
        max_size: int | None = None,
        pristine: SnapshotRef | None = None,
        starters: int = 2,
        sweep: bool = True,
        reset_timeout: float = 30.0,
    ) -> None:
        if size < 0:
            raise SpecError(f"size must be >= 0, got {size}")
        max_size = max_size if max_size is not None else max(2 * size, 1)
        if max_size < max(size, 1):
            raise SpecError(f"max_size must be >= size and >= 1, got max_size={max_size}, size={size}")
        if pristine is not None and pristine.kind is not SnapshotKind.FAST:
            raise SpecError(f"pristine must be a FAST snapshot, got {pristine.kind.value}")
        self.backend = backend
        self.spec = spec
        self.size = size
        self.max_size = max_size
        self.pristine = pristine
        self._ready: deque[Sandbox] = deque()
        self._leased: dict[str, Sandbox] = {}
        self._starting = 0
        self._resetting = 0
        self._returning: dict[str, Sandbox] = {}  # released, their reset / recycle job not yet started
        self.reset_timeout = reset_timeout
        self._cond = threading.Condition()
        self._closed = False
        self._errors: deque[BaseException] = deque(maxlen=8)
        self._executor = ThreadPoolExecutor(max_workers=max(starters, 1), thread_name_prefix="sandbox-pool")
        self._pending: set[Future[None]] = set()
        self.stats = {"acquired": 0, "hits": 0, "misses": 0, "started": 0, "recycled": 0, "failed": 0,
                      "reset": 0, "reset_refused": 0}
        if sweep:
            self._sweep_leftovers()
        self._refill()

    # ------------------------------------------------------------------ public API

    def acquire(self, timeout: float | None = 60.0) -> Sandbox:
        """A sandbox at the pristine state; waits up to ``timeout`` for one to be ready."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check_open()
            self.stats["acquired"] += 1
            hit = bool(self._ready)
            if not hit:
                self.stats["misses"] += 1
                self._refill_locked(extra=1)
            while not self._ready:
                self._check_open()
                if self._errors and self._starting == 0 and self._resetting == 0 and not self._ready:
                    raise SandboxError(f"pool cannot start sandboxes for {self.spec.image}: {self._errors[-1]}")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise SandboxTimeout(
                        f"no sandbox of {self.spec.image} ready within {timeout}s "
                        f"(ready={len(self._ready)}, leased={len(self._leased)}, starting={self._starting})"
                    )
                self._cond.wait(timeout=remaining if remaining is None else min(remaining, 1.0))
            if hit:
                self.stats["hits"] += 1
            sandbox = self._ready.popleft()
            self._leased[sandbox.id] = sandbox
            self._refill_locked()
        return sandbox

    def release(self, sandbox: Sandbox) -> None:
        """Give a sandbox back; it is reset in place, or destroyed and replaced, in the background."""
        with self._cond:
            self._leased.pop(sandbox.id, None)
            self.stats["recycled"] += 1
            closed = self._closed
            if not closed:
                self._returning[sandbox.id] = sandbox  # closed by ``close`` if its job never runs
                if isinstance(self.backend, ResettableBackend):
                    self._resetting += 1  # still held: counts against max_size until done
                    if not self._submit(self._reset_one, sandbox):
                        self._resetting -= 1
                else:
                    self._submit(self._recycle, sandbox)
        if closed:
            _close_quietly(sandbox)

    def restore(self, ref: SnapshotRef, timeout: float | None = 60.0) -> Sandbox:
        """A warm sandbox with the FAST snapshot ``ref`` applied (falls back to ``backend.restore``)."""
        if ref.kind is not SnapshotKind.FAST or ref.base_image != self.spec.image or self.pristine is not None:
            return self.backend.restore(ref)
        if not isinstance(self.backend, SnapshotApplier):
            return self.backend.restore(ref)
        applier = self.backend.apply_snapshot
        sandbox = self.acquire(timeout)
        try:
            applier(sandbox, ref)
        except BaseException:
            self.release(sandbox)
            raise
        return sandbox

    def fork(self, ref: SnapshotRef, n: int, timeout: float | None = 60.0) -> list[Sandbox]:
        """``n`` independent sandboxes at ``ref``, restored in parallel from warm ones."""
        if n < 1:
            raise SpecError(f"fork needs n >= 1, got {n}")
        sandboxes = [self.acquire(timeout) for _ in range(n)]
        applier = self.backend.apply_snapshot if isinstance(self.backend, SnapshotApplier) else None
        if applier is None or ref.kind is not SnapshotKind.FAST or ref.base_image != self.spec.image:
            for sb in sandboxes:
                self.release(sb)
            return list(self.backend.fork(ref, n))
        with ThreadPoolExecutor(max_workers=min(n, 4)) as ex:
            futures = [ex.submit(applier, sb, ref) for sb in sandboxes]
            errors = [f.exception() for f in futures]
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            for sb in sandboxes:
                self.release(sb)
            raise failed
        return sandboxes

    def warm(self, timeout: float = 120.0, n: int | None = None) -> None:
        """Block until ``n`` (default ``size``; at most ``max_size``) sandboxes are ready, starting the
        missing ones (for benchmarks and start-up: a rollout warms to its concurrency first)."""
        target = min(self.size if n is None else n, self.max_size)
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < target:
                self._check_open()
                if self._errors and self._starting == 0 and self._resetting == 0:
                    raise SandboxError(f"pool cannot start sandboxes for {self.spec.image}: {self._errors[-1]}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SandboxTimeout(f"pool did not reach {target} ready sandboxes within {timeout}s")
                self._refill_locked(extra=max(target - self.size, 0))
                self._cond.wait(timeout=min(remaining, 1.0))

    def counts(self) -> dict[str, int]:
        with self._cond:
            return {"ready": len(self._ready), "leased": len(self._leased), "starting": self._starting,
                    "resetting": self._resetting}

    def close(self, timeout: float = 60.0) -> None:
        """Stop refilling, wait for starts in flight, destroy every sandbox the pool holds."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending)
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for fut in pending:
            try:
                fut.result(timeout=max(deadline - time.monotonic(), 0.1))
            except BaseException as exc:  # a failed start is already recorded
                log.debug("pool start ended with %r during close", exc)
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._cond:
            # Released sandboxes whose reset or recycle job was cancelled above are still ours.
            doomed = list(self._ready) + list(self._leased.values()) + list(self._returning.values())
            self._ready.clear()
            self._leased.clear()
            self._returning.clear()
        for sb in doomed:
            _close_quietly(sb)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosed(f"pool for {self.spec.image} is closed")

    def _held(self) -> int:
        return len(self._ready) + len(self._leased) + self._starting + self._resetting

    def _refill(self) -> None:
        with self._cond:
            self._refill_locked()

    def _refill_locked(self, extra: int = 0) -> None:
        if self._closed:
            return  # close() is collecting what the pool holds: start nothing new
        want = self.size + extra - len(self._ready) - self._starting - self._resetting
        room = self.max_size - self._held()
        for _ in range(max(min(want, room), 0)):
            self._starting += 1
            self._submit(self._start_one)

    def _submit(self, fn, *args) -> bool:  # type: ignore[no-untyped-def]
        try:
            fut = self._executor.submit(fn, *args)
        except RuntimeError:  # executor shut down: pool closing
            if args:
                self._returning.pop(args[0].id, None)
                _close_quietly(args[0])
            return False
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return True

    def _make(self) -> Sandbox:
        sandbox = self.backend.create(self.spec)
        if self.pristine is not None:
            try:
                self._applier()(sandbox, self.pristine)
            except BaseException:
                _close_quietly(sandbox)
                raise
        return sandbox

    def _applier(self) -> Callable[[Sandbox, SnapshotRef], None]:
        if not isinstance(self.backend, SnapshotApplier):
            raise SpecError(f"backend {self.backend.name!r} cannot apply snapshots onto warm sandboxes")
        return self.backend.apply_snapshot

    def _start_one(self) -> None:
        try:
            sandbox = self._make()
        except BaseException as exc:
            log.warning("pool failed to start a sandbox of %s: %s", self.spec.image, exc)
            with self._cond:
                self._starting -= 1
                self.stats["failed"] += 1
                self._errors.append(exc)
                self._cond.notify_all()
            return
        with self._cond:
            self._starting -= 1
            self.stats["started"] += 1
            self._errors.clear()
            if self._closed:
                doomed: Sandbox | None = sandbox
            else:
                doomed = None
                self._ready.append(sandbox)
            self._cond.notify_all()
        if doomed is not None:
            _close_quietly(doomed)

    def _taken(self, sandbox: Sandbox) -> bool:
        """Claim a released sandbox for its job; False when ``close`` has already taken it."""
        with self._cond:
            return self._returning.pop(sandbox.id, None) is not None

    def _reset_one(self, sandbox: Sandbox) -> None:
        """Reset in place and re-queue; anything short of an exact reset destroys it instead."""
        if not self._taken(sandbox):
            return
        ok = False
        try:
            assert isinstance(self.backend, ResettableBackend)
            ok = bool(self.backend.reset(sandbox, timeout=self.reset_timeout))
            if ok and self.pristine is not None:
                self._applier()(sandbox, self.pristine)
        except BaseException as exc:
            log.info("pool reset of %s failed: %r", sandbox.id, exc)
            ok = False
        with self._cond:
            self._resetting -= 1
            self.stats["reset" if ok else "reset_refused"] += 1
            requeue = ok and not self._closed
            if requeue:
                self._ready.append(sandbox)
            self._cond.notify_all()
        if not requeue:
            _close_quietly(sandbox)
            self._refill()

    def _recycle(self, sandbox: Sandbox) -> None:
        if not self._taken(sandbox):
            return
        _close_quietly(sandbox)
        self._refill()

    def _sweep_leftovers(self) -> None:
        """Remove this run's containers whose owner died (a crashed earlier worker of the run)."""
        if not isinstance(self.backend, LabelledBackend) or self.backend.client is None or self.backend.run_id is None:
            return  # not a Docker backend: nothing labelled to sweep
        from sandboxes.reaper import gc

        run_id = self.backend.run_id
        try:
            removed = gc(self.backend.client, run_id=run_id)
        except SandboxError as exc:
            log.warning("pool could not sweep leftovers of run %s: %s", run_id, exc)
            return
        if removed:
            log.info("pool swept %d leftover sandboxes of run %s", len(removed), run_id)


def _close_quietly(sandbox: Sandbox) -> None:
    try:
        sandbox.close()
    except BaseException as exc:  # closing a dead sandbox must not kill the pool
        log.debug("closing sandbox %s failed: %r", sandbox.id, exc)
