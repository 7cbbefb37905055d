"""SandboxPool against a small in-memory backend (unit) — the Docker run is in test_pool_docker.py."""

from __future__ import annotations

import time

import pytest

from sandboxes.errors import PoolClosed, SandboxError, SandboxTimeout, SpecError
from sandboxes.pool import SandboxPool
from sandboxes.testing import FakeBackend, FakeSandbox
from sandboxes.types import SandboxSpec, SnapshotKind, SnapshotRef

pytestmark = pytest.mark.unit


SPEC = SandboxSpec(image="img:1")


def _backend(*, fail: bool = False) -> FakeBackend:
    """The in-memory backend with ``apply_snapshot``, whose ``restore`` and ``fork`` the pool must not use."""
    return FakeBackend(fail="image broken" if fail else None, applies_snapshots=True)


def _ref(marker: str = "snap1") -> SnapshotRef:
    """A FAST snapshot of a fresh sandbox whose only change is the file ``snap`` holding ``marker``."""
    maker = _backend()
    sb = maker.create(SPEC)
    sb.write_file("snap", marker)
    ref = sb.snapshot(SnapshotKind.FAST)
    maker.close()
    return ref


def _snap(sb: FakeSandbox) -> bytes | None:
    return sb.files.get(f"{SPEC.workdir}/snap")


@pytest.fixture(autouse=True)
def _no_restore_or_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool restores and forks onto warm sandboxes (apply_snapshot), never through the backend's own."""

    def refuse(self: FakeBackend, *args: object) -> None:
        raise AssertionError("pool should restore and fork onto warm sandboxes")

    monkeypatch.setattr(FakeBackend, "restore", refuse)
    monkeypatch.setattr(FakeBackend, "fork", refuse)


def test_acquire_is_warm_and_release_replaces_in_background() -> None:
    backend = _backend()
    with SandboxPool(backend, SPEC, size=2, max_size=3) as pool:
        pool.warm(timeout=5)
        sb = pool.acquire(timeout=5)
        assert pool.stats["hits"] == 1
        pool.release(sb)
        deadline = time.monotonic() + 5
        while not sb.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sb.closed, "a released sandbox is destroyed, never handed out again"
        pool.warm(timeout=5)
        again = pool.acquire(timeout=5)
        assert again.id != sb.id


def test_pool_is_bounded() -> None:
    backend = _backend()
    with SandboxPool(backend, SPEC, size=1, max_size=2) as pool:
        a = pool.acquire(timeout=5)
        b = pool.acquire(timeout=5)
        with pytest.raises(SandboxTimeout):
            pool.acquire(timeout=0.3)
        assert len(backend.made) <= 2
        pool.release(a)
        c = pool.acquire(timeout=5)
        assert c.id not in (a.id, b.id)


def test_pristine_snapshot_is_applied_before_handout() -> None:
    backend = _backend()
    with SandboxPool(backend, SPEC, size=2, pristine=_ref("task-pristine")) as pool:
        sb = pool.acquire(timeout=5)
        assert _snap(sb) == b"task-pristine"


def test_fork_and_restore_apply_onto_warm_sandboxes() -> None:
    backend = _backend()
    with SandboxPool(backend, SPEC, size=3, max_size=6) as pool:
        forks = pool.fork(_ref("mid"), 3, timeout=5)
        assert len({f.id for f in forks}) == 3
        assert all(_snap(f) == b"mid" for f in forks)
        r = pool.restore(_ref("other"), timeout=5)
        assert _snap(r) == b"other"


def test_close_destroys_everything_and_refuses_acquire() -> None:
    backend = _backend()
    pool = SandboxPool(backend, SPEC, size=2)
    pool.warm(timeout=5)
    leased = pool.acquire(timeout=5)
    pool.close()
    assert all(sb.closed for sb in backend.made)
    assert leased.closed
    with pytest.raises(PoolClosed):
        pool.acquire(timeout=1)
    pool.close()  # idempotent


def test_failing_backend_surfaces_an_error_not_a_hang() -> None:
    pool = SandboxPool(_backend(fail=True), SPEC, size=1)
    try:
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match="image broken"):
            pool.acquire(timeout=10)
        assert time.monotonic() - t0 < 5
    finally:
        pool.close()


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(SpecError, match="size"):
        SandboxPool(_backend(), SPEC, size=-1)
    with pytest.raises(SpecError, match="max_size"):
        SandboxPool(_backend(), SPEC, size=4, max_size=2)


def _resetting(*, delay: float = 0.0) -> FakeBackend:
    """A backend with ``reset`` too: clean sandboxes reset (back to pristine), ones holding ``root-owned`` refuse."""
    return FakeBackend(applies_snapshots=True, resettable=True, reset_delay=delay,
                refuse_reset=lambda sb: f"{SPEC.workdir}/root-owned" in sb.files)


def _wait(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cond()


def test_reset_reuses_the_sandbox_and_reapplies_pristine() -> None:
    backend = _resetting()
    with SandboxPool(backend, SPEC, size=1, max_size=2, pristine=_ref("task")) as pool:
        sb = pool.acquire(timeout=5)
        sb.write_file("dirty", b"x")
        pool.release(sb)
        _wait(lambda: pool.stats["reset"] == 1)
        again = pool.acquire(timeout=5)
        if again.id != sb.id:  # the other warm one came first; the reset one is next
            pool.release(again)
            _wait(lambda: pool.stats["reset"] == 2)
            again = pool.acquire(timeout=5)
        assert f"{SPEC.workdir}/dirty" not in again.files
        assert _snap(again) == b"task", "the pristine snapshot is re-applied after a reset"
        assert not sb.closed
        assert len(backend.made) <= 2


def test_refused_reset_destroys_and_replaces() -> None:
    backend = _resetting()
    with SandboxPool(backend, SPEC, size=1, max_size=1) as pool:
        sb = pool.acquire(timeout=5)
        sb.write_file("root-owned", b"x")
        pool.release(sb)
        _wait(lambda: sb.closed)
        again = pool.acquire(timeout=5)
        assert again.id != sb.id and not again.files
        assert pool.stats["reset_refused"] == 1 and pool.stats["reset"] == 0


def test_release_racing_close_leaks_nothing() -> None:
    backend = _resetting(delay=0.2)
    pool = SandboxPool(backend, SPEC, size=2, max_size=2)
    a, b = pool.acquire(timeout=5), pool.acquire(timeout=5)
    pool.release(a)
    pool.close()
    pool.release(b)
    assert all(sb.closed for sb in backend.made), "a reset finishing after close() must not re-queue"
    assert pool.counts() == {"ready": 0, "leased": 0, "starting": 0, "resetting": 0}


def test_resetting_counts_against_max_size() -> None:
    backend = _resetting(delay=0.5)
    with SandboxPool(backend, SPEC, size=1, max_size=1) as pool:
        sb = pool.acquire(timeout=5)
        pool.release(sb)
        again = pool.acquire(timeout=5)  # waits for the reset rather than starting a second one
        assert again.id == sb.id and len(backend.made) == 1


def test_warm_to_n_with_no_spares_then_cycle_without_new_starts() -> None:
    # What a rollout does: size 0 (no spares), warmed to its concurrency, then only resets.
    backend = _resetting()
    with SandboxPool(backend, SPEC, size=0, max_size=4) as pool:
        pool.warm(timeout=5, n=3)
        assert pool.counts()["ready"] == 3 and len(backend.made) == 3
        for _ in range(4):
            held = [pool.acquire(timeout=5) for _ in range(3)]
            for sb in held:
                pool.release(sb)
            _wait(lambda: pool.counts()["ready"] == 3)
        assert len(backend.made) == 3 and pool.stats["misses"] == 0
        pool.warm(timeout=5, n=9)  # capped at max_size
        assert len(backend.made) == 4


def test_close_closes_released_sandboxes_whose_reset_never_started() -> None:
    # More releases than the pool has worker threads, and a close() that waits less than the resets
    # take: the queued reset jobs are cancelled, and their sandboxes must be closed, not dropped.
    backend = _resetting(delay=0.3)
    pool = SandboxPool(backend, SPEC, size=0, max_size=12, starters=2)
    held = [pool.acquire(timeout=5) for _ in range(12)]
    for sb in held:
        pool.release(sb)
    pool.close(timeout=0.2)
    assert all(sb.closed for sb in backend.made), [sb.id for sb in backend.made if not sb.closed]
    assert len(backend.resets) < len(held), "some resets were still queued when close() ran"
