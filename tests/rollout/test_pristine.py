"""PristineSandboxes.warm with a fake backend: one pool per image, warmed to the concurrency, room for it."""

from __future__ import annotations

import pytest

from rollout.pristine import PristineSandboxes
from sandboxes.testing import FakeBackend
from sandboxes.types import SandboxSpec

pytestmark = pytest.mark.unit


class FakeTask:
    def __init__(self, task_id: str, image: str) -> None:
        self.id, self.image = task_id, image

    def sandbox_spec(self, build: bool = True) -> SandboxSpec:
        return SandboxSpec(image=self.image)


def test_warm_starts_each_image_once_to_the_concurrency_and_makes_room_for_it() -> None:
    backend = FakeBackend(resettable=True)
    sandboxes = PristineSandboxes(backend, pool_size=0)  # type: ignore[arg-type]
    tasks = [FakeTask("a/one", "img:1"), FakeTask("a/two", "img:1"), FakeTask("b/pg", "img:2")]
    try:
        assert sandboxes.warm(tasks, per_image=6) == 2  # type: ignore[arg-type]
        assert sorted(s.spec.image for s in backend.made) == ["img:1"] * 6 + ["img:2"] * 6
        pools = list(sandboxes._pools.values())
        assert all(p.counts()["ready"] == 6 and p.max_size >= 6 for p in pools)
        held = [pools[0].acquire(timeout=1) for _ in range(6)]  # the whole concurrency at once, no wait
        assert len({s.id for s in held}) == 6 and len(backend.made) == 12
        assert sandboxes._leases == {pools[0].spec.key(): 0, pools[1].spec.key(): 0}, "warming leases nothing"
    finally:
        sandboxes.close()


class CountingTask(FakeTask):
    """Setup that records, per variant, how many set-ups run at once."""

    def __init__(self) -> None:
        super().__init__("a/lock", "img:1")
        import threading

        self._guard = threading.Lock()
        self.running: dict[int, int] = {}
        self.overlaps: list[int] = []
        self.setups = 0

    def setup(self, sandbox: object, variant: object) -> None:
        import time

        seed = variant.seed  # type: ignore[attr-defined]
        with self._guard:
            self.running[seed] = self.running.get(seed, 0) + 1
            self.setups += 1
            if self.running[seed] > 1:
                self.overlaps.append(seed)
        time.sleep(0.002)
        with self._guard:
            self.running[seed] -= 1


def test_one_setup_per_variant_at_a_time_even_when_the_lock_map_is_pruned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many threads, many variants, a tiny lock map and snapshot cache (so locks are pruned and variants set
    up again all the time): two set-ups of one variant must never overlap, and no lock outlives its users."""
    import random
    import sys
    import threading
    from types import SimpleNamespace

    import rollout.pristine as pristine

    monkeypatch.setattr(pristine, "MAX_PRISTINE", 1)  # prune the lock map past 4 entries; cache 1 snapshot
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    task = CountingTask()
    sandboxes = PristineSandboxes(FakeBackend(resettable=True), pool_size=0)  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            for _ in range(60):
                lease = sandboxes.acquire(task, SimpleNamespace(seed=rng.randrange(12)))  # type: ignore[arg-type]
                sandboxes.release(lease)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(old_interval)
        sandboxes.close()
    assert not errors, errors[0]
    assert task.setups > 100  # the cache of one snapshot makes most acquires set up again
    assert task.overlaps == [], f"variants set up twice at once: {sorted(set(task.overlaps))}"
    assert sandboxes._variant_locks == {}, "a lock outlived every user of its variant"


class BlockingTask(FakeTask):
    """A variant whose setup waits for the test: the episode is cancelled while a thread acquires its sandbox."""

    def __init__(self) -> None:
        import threading

        super().__init__("a/slow_setup", "img:1")
        self.entered, self.go = threading.Event(), threading.Event()

    def variant(self, seed: int) -> object:
        from agentenv.types import Variant

        return Variant(self.id, seed, {}, "do nothing")

    def setup(self, sandbox: object, variant: object) -> None:
        self.entered.set()
        assert self.go.wait(10), "the test never let setup finish"


def test_an_episode_cancelled_while_its_sandbox_is_acquired_gives_the_lease_back() -> None:
    """Before issue 26 the lease the acquiring thread delivered after the cancellation was dropped: the pool
    kept it leased forever (``leased`` 1, ``PristineSandboxes._leases`` 1) and a one-sandbox pool starved."""
    import asyncio
    import time

    from rollout.episode import EpisodeRequest, EpisodeRunner
    from rollout.policy.scripted import ScriptedPolicy

    backend = FakeBackend(resettable=True)
    runner = EpisodeRunner(ScriptedPolicy(), backend=backend, pool_size=0)  # type: ignore[arg-type]
    task = BlockingTask()
    runner._tasks[task.id] = task  # type: ignore[assignment]

    async def cancel_mid_acquire() -> None:
        episode = asyncio.create_task(runner.run(EpisodeRequest("e1", "r", task.id, 0, "bash")))
        while not task.entered.is_set():
            await asyncio.sleep(0.01)
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode

    try:
        asyncio.run(cancel_mid_acquire())
        task.go.set()  # the thread now finishes setup and delivers a lease nobody awaits
        pool = next(iter(runner.sandboxes._pools.values()))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (pool.counts()["leased"] or any(runner.sandboxes._leases.values())):
            time.sleep(0.01)
        assert pool.counts()["leased"] == 0 and runner.sandboxes._leases == {pool.spec.key(): 0}, pool.counts()
        assert runner.sandboxes.stats["orphaned_leases"] == 1
    finally:
        task.go.set()
        runner.close()
