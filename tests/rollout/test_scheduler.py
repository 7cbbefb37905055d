"""Scheduler unit tests with in-memory fakes: grouping, seeded draws, staleness accounting, faults, backpressure."""

from __future__ import annotations

import asyncio
import pickle
from collections import Counter
from collections.abc import Callable

import pytest

from rollout.config import ConfigError, RolloutConfig, StalenessConfig, StalePolicy, parse_config
from rollout.scheduler import Scheduler, WorkerLost, plan_episodes
from rollout.types import Status, Trajectory, Turn

pytestmark = pytest.mark.unit


def cfg(**kw: object) -> RolloutConfig:
    base: dict[str, object] = {"run_id": "r1", "seeds": [3, 7], "group_size": 3,
                               "efforts": {"levels": ["low", "high", "max"], "seed": 5},
                               "rotation": {"kind": "uniform", "seed": 11}}
    return parse_config(base | kw)


def traj(req, version: int = 0, status: Status = Status.OK) -> Trajectory:  # type: ignore[no-untyped-def]
    return Trajectory(
        episode_id=req.episode_id, run_id=req.run_id, task_id=req.task_id, domain="general", seed=req.seed,
        harness=req.harness, effort=req.effort or "", policy_version=version, status=status,
        reward=1.0 if status is Status.OK else 0.0, turns=(Turn(index=0, policy_version=version, tool_calls=2),),
    )


class FakeStore:
    def __init__(self) -> None:
        self.rows: dict[str, Trajectory] = {}
        self.puts = 0

    def put(self, t: Trajectory) -> bool:
        self.puts += 1
        if t.episode_id in self.rows:
            return False
        self.rows[t.episode_id] = t
        return True


class FakeWorker:
    """Answers after ``delay`` with the version it was told; ``script`` may override per call."""

    def __init__(self, slots: int = 2, delay: float = 0.01,
                 script: Callable[[object, int], object] | None = None) -> None:
        self.slots = slots
        self.delay = delay
        self.script = script
        self.version = 0
        self.running = 0
        self.peak = 0
        self.calls: list[object] = []

    async def run(self, req):  # type: ignore[no-untyped-def]
        self.calls.append(req)
        self.running += 1
        self.peak = max(self.peak, self.running)
        version = self.version  # picked up when the episode starts, like RolloutWorker
        try:
            await asyncio.sleep(self.delay)
            out = self.script(req, len(self.calls)) if self.script else None
            if isinstance(out, BaseException):
                raise out
            return out if isinstance(out, Trajectory) else traj(req, version)
        finally:
            self.running -= 1

    async def set_policy_version(self, version: int, weights: object = None) -> None:
        self.version = version
        self.weights = weights


def run(s: Scheduler):  # type: ignore[no-untyped-def]
    return asyncio.run(s.run())


def test_groups_of_g_per_task_variant_with_deterministic_ids() -> None:
    plan = plan_episodes(cfg(), ["a/x", "b/y"])
    assert len(plan) == 2 * 2 * 3
    groups = Counter(r.group_id for r in plan)
    assert groups == {"r1/a/x/3": 3, "r1/a/x/7": 3, "r1/b/y/3": 3, "r1/b/y/7": 3}
    assert len({r.episode_id for r in plan}) == len(plan)
    assert all(r.episode_id.startswith(r.group_id + "/") and r.attempt == 0 for r in plan)


def test_harness_and_effort_draws_are_seeded_and_reproducible() -> None:
    a = plan_episodes(cfg(), ["t"])
    b = plan_episodes(cfg(), ["t"])
    assert [(r.harness, r.effort) for r in a] == [(r.harness, r.effort) for r in b]
    c = plan_episodes(cfg(rotation={"kind": "uniform", "seed": 12}, efforts={"levels": ["low", "high"], "seed": 6}), ["t"])
    assert [(r.harness, r.effort) for r in a] != [(r.harness, r.effort) for r in c]
    # each draw is the rotation's pick of the planned index: a pure function, not of call order
    conf = cfg()
    assert [r.harness for r in a] == [conf.rotation.pick(i) for i in range(len(a))]
    assert [r.effort for r in a] == [conf.efforts.pick(i) for i in range(len(a))]
    assert {r.effort for r in plan_episodes(cfg(efforts={"levels": []}), ["t"])} == {None}


def test_requests_pickle() -> None:
    req = plan_episodes(cfg(), ["t"])[0]
    assert pickle.loads(pickle.dumps(req)) == req


def test_every_episode_stored_once_with_backpressure() -> None:
    plan = plan_episodes(cfg(), ["a", "b"])
    workers = [FakeWorker(slots=2), FakeWorker(slots=3)]
    store = FakeStore()
    s = Scheduler(plan, workers, store)
    report = run(s)
    assert sorted(store.rows) == sorted(r.episode_id for r in plan)
    assert report.accounted and report.stored == report.ok == len(plan) and report.tool_calls == 2 * len(plan)
    assert workers[0].peak <= 2 and workers[1].peak <= 3
    assert s.max_in_flight == 5  # kept busy up to the bound, never past it


def test_sandbox_lost_gets_one_retry_then_is_stored_as_failed() -> None:
    plan = plan_episodes(cfg(seeds=[0], group_size=2), ["t"])
    lost_first = plan[0].episode_id
    always_lost = plan[1].episode_id

    def script(req, _n):  # type: ignore[no-untyped-def]
        if req.episode_id == always_lost or (req.episode_id == lost_first and req.attempt == 0):
            return traj(req, status=Status.SANDBOX_LOST)
        return None

    store = FakeStore()
    report = run(Scheduler(plan, [FakeWorker(script=script)], store, sandbox_retries=1))
    assert report.retried == 2 and report.accounted
    assert store.rows[lost_first].status is Status.OK
    assert store.rows[always_lost].status is Status.SANDBOX_LOST
    assert report.ok == 1 and report.failed == 1


def test_worker_lost_episodes_are_rerun_and_a_crash_becomes_a_record() -> None:
    plan = plan_episodes(cfg(seeds=[0], group_size=3), ["t"])

    def script(req, _n):  # type: ignore[no-untyped-def]
        if req.episode_id == plan[0].episode_id and req.attempt == 0:
            return WorkerLost("killed")
        if req.episode_id == plan[1].episode_id:
            return ValueError("bug in the runner")
        return None

    store = FakeStore()
    report = run(Scheduler(plan, [FakeWorker(script=script)], store, domains={"t": "general"}))
    assert report.rerun == 1 and report.accounted and len(store.rows) == 3
    assert store.rows[plan[0].episode_id].status is Status.OK
    bad = store.rows[plan[1].episode_id]
    # a worker's exception is a bug, stored as ``error`` (infrastructure), not as a lost sandbox
    assert bad.status is Status.ERROR and "bug in the runner" in bad.error and bad.domain == "general"


@pytest.mark.parametrize("policy", [StalePolicy.ABORT_AND_RESUME, StalePolicy.DROP])
def test_stale_trajectories_never_reach_the_store(policy: StalePolicy) -> None:
    """Episodes finishing after the learner moved more than K=1 ahead are resumed or dropped, and counted."""
    plan = plan_episodes(cfg(seeds=[0], group_size=4), ["t"])
    worker = FakeWorker(slots=4, delay=0.05)
    store = FakeStore()
    s = Scheduler(plan, [worker], store, staleness=StalenessConfig(max_lag=1, policy=policy))

    async def go():  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(s.run())
        await asyncio.sleep(0.01)  # all four in flight at version 0
        s.version = 2  # the learner moved on without an abort broadcast: the completion check must catch it
        for w in s.workers:
            await w.set_policy_version(2)
        return await task

    report = asyncio.run(go())
    assert all(s.version - t.policy_version <= 1 for t in store.rows.values())
    assert report.accounted
    if policy is StalePolicy.ABORT_AND_RESUME:
        assert report.resumed == 4 and report.dropped == 0 and len(store.rows) == 4
        assert {t.policy_version for t in store.rows.values()} == {2}
    else:
        assert report.dropped == 4 and report.resumed == 0 and not store.rows
        assert sorted(report.dropped_ids) == sorted(r.episode_id for r in plan)


def test_publish_aborts_in_flight_episodes_older_than_the_bound() -> None:
    plan = plan_episodes(cfg(seeds=[0], group_size=2), ["t"])
    worker = FakeWorker(slots=2, delay=0.5)
    store = FakeStore()
    s = Scheduler(plan, [worker], store, staleness=StalenessConfig(max_lag=0))

    async def go():  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(s.run())
        await asyncio.sleep(0.05)
        s.publish(1)
        worker.delay = 0.01
        return await task

    report = asyncio.run(go())
    assert report.resumed == 2 and report.accounted and len(store.rows) == 2
    assert all(t.policy_version == 1 for t in store.rows.values())
    assert len(worker.calls) == 4


def test_resume_budget_spent_drops() -> None:
    plan = plan_episodes(cfg(seeds=[0], group_size=1), ["t"])
    always_old = FakeWorker(script=lambda req, _n: traj(req, version=0))
    s = Scheduler(plan, [always_old], FakeStore(), version=5,
                  staleness=StalenessConfig(max_lag=1, max_resumes=2))
    report = run(s)
    assert report.resumed == 2 and report.dropped == 1 and report.accounted and report.stored == 0


def test_a_group_stays_on_its_home_worker_and_idle_workers_steal() -> None:
    # 4 groups of 4 on 2 workers of 2 slots: every group lives on one worker (one setup per variant there).
    c = cfg(seeds=[0, 1, 2, 3], group_size=4)
    requests = plan_episodes(c, ["general/answer_number"])
    workers = [FakeWorker(slots=2), FakeWorker(slots=2)]
    store = FakeStore()
    report = run(Scheduler(requests, workers, store))
    assert report.accounted and report.stored == 16
    homes = {req.group_id: {i for i, w in enumerate(workers) for r in w.calls if r.group_id == req.group_id} for req in requests}
    assert all(len(h) == 1 for h in homes.values()), homes
    assert {len(w.calls) for w in workers} == {8}

    # one group only: the second worker steals rather than idles
    lone = plan_episodes(cfg(seeds=[0], group_size=4), ["general/answer_number"])
    workers = [FakeWorker(slots=1, delay=0.05), FakeWorker(slots=1, delay=0.05)]
    assert run(Scheduler(lone, workers, FakeStore())).stored == 4
    assert all(w.calls for w in workers)


def test_open_mode_takes_submissions_until_closed_and_resolves_each_once() -> None:
    """The engine's mode: episodes arrive while others run; each future resolves to its stored trajectory."""
    plan = plan_episodes(cfg(seeds=[0, 1], group_size=2), ["t"])
    store = FakeStore()
    worker = FakeWorker()

    async def main() -> list[object]:
        s = Scheduler([], [worker], store, keep_open=True)
        runner = asyncio.ensure_future(s.run())
        first = [s.submit(r) for r in plan[:2]]
        got = list(await asyncio.gather(*first))
        assert not runner.done()  # open: waiting for more
        s.publish(3, ["weights-ref"])
        await asyncio.sleep(0)
        later = [s.submit(r) for r in plan[2:]]
        got += list(await asyncio.gather(*later))
        with pytest.raises(ConfigError, match="already submitted"):
            s.submit(plan[3])
        s.close()
        report = await runner
        assert report.planned == 4 and report.stored == 4 and report.accounted
        return got

    got = asyncio.run(main())
    assert [t.episode_id for t in got] == [r.episode_id for r in plan]  # type: ignore[attr-defined]
    assert worker.weights == ["weights-ref"]  # the weights travel with the version, never a bare number
    assert [t.policy_version for t in got[2:]] == [3, 3]  # type: ignore[attr-defined]
