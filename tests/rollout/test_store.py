"""TrajectoryStore on SQLite in a temp dir. test_store_postgres.py reruns the dialect-neutral tests on PostgreSQL.

Tests reach the database only through the ``store`` fixture and ``store.url``,
so the PostgreSQL module can import them and supply its own ``store``.
"""

from __future__ import annotations

import pickle
import threading
from array import array
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from rollout.store import EpisodeRow, SampleRow, TrajectoryStore
from rollout.types import Sample, Status, Timings, Trajectory, Turn

pytestmark = pytest.mark.unit

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def make(
    episode_id: str,
    *,
    run_id: str = "run-a",
    task_id: str = "task-1",
    seed: int = 0,
    harness: str = "bash",
    effort: str = "low",
    domain: str = "coding",
    status: Status | str = Status.OK,
    reward: float = 1.0,
    version: int = 1,
    at: int = 0,
    n_samples: int = 1,
) -> Trajectory:
    """A small trajectory; ``at`` orders creation (seconds after T0)."""
    k = sum(map(ord, episode_id))
    samples = tuple(
        Sample(
            token_ids=(k, k + 1, 2**31 - 1, 0, i),
            logprobs=(0.0, -0.125 * (i + 1), -1.5, 0.0, -3.0),
            loss_mask=(0, 1, 1, 0, 1),
        )
        for i in range(n_samples)
    )
    return Trajectory(
        episode_id=episode_id,
        run_id=run_id,
        task_id=task_id,
        domain=domain,
        seed=seed,
        harness=harness,
        effort=effort,
        policy_version=version,
        status=status,  # type: ignore[arg-type]  # Trajectory parses strings
        reward=reward,
        samples=samples,
        turns=(Turn(index=0, policy_version=version, policy_s=0.5, sandbox_s=0.25, completion_tokens=3),),
        created_at=T0 + timedelta(seconds=at),
    )


@pytest.fixture
def store(tmp_path: Path):
    s = TrajectoryStore(f"sqlite:///{tmp_path}/runs/agentenv.db")
    yield s
    s.close()


def _bits(values: tuple[float, ...]) -> bytes:
    return array("f", values).tobytes()


def test_round_trip_every_field_bit_exact(store: TrajectoryStore) -> None:
    tiny = 1.4e-45  # the smallest float32 subnormal
    samples = (
        Sample(tuple(range(0, 70_000, 7)) + (2**31 - 1,), tuple([-0.0, tiny, -float("inf")] * 3334)[:10_001],
               tuple([0, 1] * 5000) + (1,)),
        Sample((5, 6), (0.0, -0.6931471805599453), (0, 1)),  # logprob rounds to float32 on construction
    )
    t = Trajectory(
        episode_id="ep-1", run_id="run-a", task_id="sql/orders", domain="agent", seed=2**40, harness="codex",
        effort="max", policy_version=7, status=Status.TRUNCATED, reward=0.1 + 0.2, error="turn limit 30",
        verifier={"checks": [{"name": "rows", "passed": True, "score": 0.3}], "hash": "ab", "n": None},
        samples=samples,
        turns=(Turn(0, 6, 1.25, 0.5, 100, 20, 1, 0), Turn(1, 7, 0.75, 2.0, 130, 15, 2, 1)),
        tool_errors=1, timings=Timings(2.0, 2.5, 0.125, 5.0625),
        created_at=datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=timezone(timedelta(hours=2))),
    )
    assert store.put(t) is True
    got = store.get("ep-1")
    assert got == t
    assert got is not None and got.created_at.tzinfo == timezone.utc
    for a, b in zip(got.samples, t.samples, strict=True):
        assert _bits(a.logprobs) == _bits(b.logprobs)  # -0.0 and subnormals survive, not just compare equal
        assert array("i", a.token_ids) == array("i", b.token_ids)
    assert pickle.loads(pickle.dumps(got)) == t  # trajectories cross Ray process boundaries
    assert store.get("missing") is None


def test_default_store_is_sqlite_wal_under_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with TrajectoryStore() as s:
        assert s.put(make("e"))
        with s.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30_000
    assert (tmp_path / "runs" / "agentenv.db").is_file()


def test_put_is_idempotent_by_episode_id(store: TrajectoryStore) -> None:
    first = make("e1", reward=1.0)
    assert store.put(first) is True
    assert store.put(first) is False
    assert store.put(make("e1", reward=0.0, n_samples=3)) is False  # a rerun never overwrites
    assert store.get("e1") == first
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(SampleRow)).scalar() == 1


def test_two_writers_racing_on_the_same_ids_store_each_once(store: TrajectoryStore) -> None:
    trajectories = [make(f"race-{i}", seed=i, at=i, n_samples=2) for i in range(20)]
    other = TrajectoryStore(store.url)  # a second worker: its own engine and connections
    barrier = threading.Barrier(2)
    results: dict[int, list[bool]] = {}

    def write(k: int, s: TrajectoryStore) -> None:
        barrier.wait()
        results[k] = [s.put(t) for t in trajectories]

    threads = [threading.Thread(target=write, args=(k, s)) for k, s in enumerate((store, other))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    other.close()
    assert [a + b for a, b in zip(results[0], results[1], strict=True)] == [1] * 20  # exactly one winner each
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(EpisodeRow)).scalar() == 20
        assert conn.execute(select(func.count()).select_from(SampleRow)).scalar() == 40
    assert [t.episode_id for t in store.query(run_id="run-a")] == [t.episode_id for t in trajectories]


def test_query_filters(store: TrajectoryStore) -> None:
    rows = [
        make("a", harness="bash", effort="low", domain="coding", version=1, at=3),
        make("b", harness="codex", effort="high", domain="agent", version=2, at=2),
        make("c", harness="codex", effort="low", domain="coding", version=3, at=1, status="timeout"),
        make("d", harness="bash", effort="max", domain="general", version=4, at=0, status="sandbox_lost"),
        make("e", run_id="run-b", task_id="task-2", harness="codex", at=4),
    ]
    for t in rows:
        store.put(t)

    def ids(**kw: object) -> list[str]:
        return [t.episode_id for t in store.query(**kw)]  # type: ignore[arg-type]

    assert ids(run_id="run-a") == ["d", "c", "b", "a"]  # oldest first
    assert ids(harness="codex") == ["c", "b", "e"]
    assert ids(run_id="run-a", harness="codex", effort="low") == ["c"]
    assert ids(status="sandbox_lost") == ["d"]
    assert ids(status=[Status.OK, "timeout"], run_id="run-a") == ["c", "b", "a"]
    assert ids(domain="coding", run_id="run-a") == ["c", "a"]
    assert ids(task_id="task-2") == ["e"]
    assert ids(min_policy_version=3, run_id="run-a") == ["d", "c"]
    assert ids(run_id="run-a", limit=2) == ["d", "c"]
    assert ids(run_id="nope") == []
    with pytest.raises(ValueError, match="status.*exploded"):
        store.query(status="exploded")


def test_groups_are_complete_per_task_and_seed(store: TrajectoryStore) -> None:
    for t in [
        make("a0", task_id="A", seed=0, at=0), make("a1", task_id="A", seed=0, at=5),       # complete at 5
        make("b0", task_id="A", seed=1, at=1), make("b1", task_id="A", seed=1, at=2, status="sandbox_lost"),
        make("c0", task_id="B", seed=0, at=2), make("c1", task_id="B", seed=0, at=3),       # complete at 3
        make("c2", task_id="B", seed=0, at=4),                                              # a surplus retry
        make("d0", task_id="C", seed=0, at=6, version=1), make("d1", task_id="C", seed=0, at=7, version=5),
        make("x0", task_id="A", seed=0, at=8, run_id="run-b"),
    ]:
        store.put(t)

    groups = store.groups("run-a", size=2)
    assert [[t.episode_id for t in g] for g in groups] == [["c0", "c1"], ["a0", "a1"], ["d0", "d1"]]
    assert all(len({(t.task_id, t.seed) for t in g}) == 1 for g in groups)
    assert [[t.episode_id for t in g] for g in store.groups("run-a", size=2, limit=1)] == [["c0", "c1"]]
    assert store.groups("run-a", size=2, min_policy_version=2) == []  # d0 is too stale to pair with d1
    assert [len(g) for g in store.groups("run-a", size=2, status=None)] == [2, 2, 2, 2]  # counts the lost one
    assert [[t.episode_id for t in g] for g in store.groups("run-a", size=3)] == [["c0", "c1", "c2"]]
    with pytest.raises(ValueError, match="size"):
        store.groups("run-a", size=0)


def test_metrics_split_by_harness(store: TrajectoryStore) -> None:
    for step in range(2):
        for harness, value in (("bash", 0.25), ("codex", 0.75)):
            store.log_metric("run-a", "reward/mean", value + step, step=step,
                             tags={"harness": harness, "effort": "low", "domain": "coding"})
    store.log_metrics("run-a", {"loss": 1.5, "kl": 0.01}, step=1)

    codex = store.metrics("run-a", "reward/mean", tags={"harness": "codex"})
    assert [(m.step, m.value) for m in codex] == [(0, 0.75), (1, 1.75)]
    assert all(m.tags == {"harness": "codex", "effort": "low", "domain": "coding"} for m in codex)
    by_harness: dict[str, list[float]] = {}
    for m in store.metrics("run-a", "reward/mean"):
        by_harness.setdefault(m.tags["harness"], []).append(m.value)
    assert by_harness == {"bash": [0.25, 1.25], "codex": [0.75, 1.75]}
    assert {m.name for m in store.metrics("run-a")} == {"reward/mean", "loss", "kl"}
    assert store.metrics("run-a", tags={"harness": "kimi_code"}) == []


@pytest.mark.parametrize("fmt, builder", [("parquet", "parquet"), ("jsonl", "json")])
def test_export_loads_with_datasets(store: TrajectoryStore, tmp_path: Path, fmt: str, builder: str) -> None:
    from datasets import load_dataset  # a test dependency: missing means red, not skipped

    store.put(make("one", at=0))
    store.put(make("two", at=1, n_samples=2, harness="codex"))
    store.put(make("lost", at=2, status="sandbox_lost", n_samples=0))
    store.put(make("other", run_id="run-b"))
    out = tmp_path / "export" / f"run-a.{fmt}"

    assert store.export(out, fmt, run_id="run-a") == 4  # 1 + 2 samples + 1 empty row for the lost episode
    ds = load_dataset(builder, data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    rows = {(r["episode_id"], r["sample_index"]): r for r in ds}
    assert set(rows) == {("one", 0), ("two", 0), ("two", 1), ("lost", 0)}
    want = make("two", n_samples=2, harness="codex").samples[1]
    got = rows[("two", 1)]
    assert got["token_ids"] == list(want.token_ids) and all(type(i) is int for i in got["token_ids"])
    assert got["loss_mask"] == list(want.loss_mask)
    assert _bits(tuple(got["logprobs"])) == _bits(want.logprobs)
    assert (got["harness"], got["num_samples"], got["status"], got["reward"]) == ("codex", 2, "ok", 1.0)
    assert rows[("lost", 0)]["token_ids"] == [] and rows[("lost", 0)]["status"] == "sandbox_lost"
    assert not list(out.parent.glob("*.partial"))

    assert store.export(tmp_path / f"codex.{fmt}", fmt, harness="codex") == 2
    with pytest.raises(TypeError, match="unknown trajectory filter"):
        store.export(tmp_path / f"bad.{fmt}", fmt, harnes="codex")


def test_records_validate_at_the_boundary() -> None:
    with pytest.raises(ValueError, match="lengths 2, 1, 2"):
        Sample((1, 2), (0.0,), (0, 1))
    with pytest.raises(ValueError, match="loss_mask"):
        Sample((1,), (0.0,), (2,))
    with pytest.raises(ValueError, match="int32"):
        Sample((2**31,), (0.0,), (1,))
    with pytest.raises(ValueError, match="status"):
        make("x", status="crashed")
    with pytest.raises(ValueError, match="timezone"):
        Trajectory("x", "r", "t", "coding", 0, "bash", "low", 0, Status.OK, 0.0, created_at=datetime(2025, 1, 1))
    two = make("x", n_samples=2)
    with pytest.raises(ValueError, match="2 samples"):
        _ = two.token_ids
    assert make("y").token_ids == make("y").samples[0].token_ids
    assert make("y").trainable and not make("z", status="invalid").trainable
