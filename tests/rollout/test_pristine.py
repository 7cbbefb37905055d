"""PristineSandboxes.warm with a fake backend: one pool per image, warmed to the concurrency, room for it."""

from __future__ import annotations

import itertools

import pytest

from rollout.pristine import PristineSandboxes
from sandboxes.types import SandboxSpec

pytestmark = pytest.mark.unit


class FakeSandbox:
    def __init__(self, sid: str, spec: SandboxSpec) -> None:
        self.id, self.spec, self.closed = sid, spec, False

    def close(self) -> None:
        self.closed = True


class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.made: list[FakeSandbox] = []
        self._ids = itertools.count()

    def create(self, spec: SandboxSpec) -> FakeSandbox:
        self.made.append(FakeSandbox(f"sb{next(self._ids)}", spec))
        return self.made[-1]

    def reset(self, sandbox: FakeSandbox, timeout: float | None = None) -> bool:
        return True


class FakeTask:
    def __init__(self, task_id: str, image: str) -> None:
        self.id, self.image = task_id, image

    def sandbox_spec(self, build: bool = True) -> SandboxSpec:
        return SandboxSpec(image=self.image)


def test_warm_starts_each_image_once_to_the_concurrency_and_makes_room_for_it() -> None:
    backend = FakeBackend()
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
