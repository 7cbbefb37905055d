"""The trajectory store: every episode written once, read back by run, task, harness, effort, status.

Why a database and not files: many workers write at once, the learner reads
complete groups while rollouts are still running, and a retried episode must
never be counted twice. Writes are idempotent by ``episode_id`` through
``INSERT ... ON CONFLICT DO NOTHING RETURNING`` (SQLite >= 3.35), so two workers
racing on one id (a worker restarted after it had already written) leave
exactly one row, and the loser learns it lost (``put`` returns False).

Backends: SQLite (the default, ``runs/agentenv.db``, WAL mode so readers never
block the writer) for one machine; PostgreSQL by URL
(``postgresql+psycopg://user@host/db``) for a cluster. The SQL is the same.

Token arrays are stored compactly, one ``samples`` row per training sample:
``token_ids`` int32, ``logprobs`` float32, ``loss_mask`` uint8, each as the
little-endian bytes of the array (on any host), in a ``LargeBinary`` column.
That is 9 bytes a token instead of a JSON list's ~20, and it reads back bit-exact.

Usage::

    store = TrajectoryStore()                      # sqlite:///runs/agentenv.db
    store.put(trajectory)                          # True; False if that episode is stored
    groups = store.groups("run-1", size=8)         # complete groups for GRPO
    store.log_metric("run-1", "reward", 0.5, step=3, tags={"harness": "codex"})
    store.export("runs/run-1.parquet", run_id="run-1")
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, cast

from sqlalchemy import JSON, BigInteger, ColumnElement, DateTime, Float, ForeignKey, Index, Integer
from sqlalchemy import LargeBinary, String, Table, Text, create_engine, event, make_url, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, RowMapping
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from rollout.errors import StoreError, UnknownFilter
from rollout.types import TRAINABLE, Sample, Status, Timings, Trajectory, Turn

__all__ = ["DEFAULT_URL", "Base", "Metric", "TrajectoryStore"]

DEFAULT_URL = "sqlite:///runs/agentenv.db"
_SQLITE_BUSY_MS = 30_000
_SCHEMA_LOCK_KEY = 0x6167656E  # "agen": any constant shared by every process creating this schema
_IN_CHUNK = 500  # ids per IN (...) clause, far under SQLite's variable limit

# ---------------------------------------------------------------- schema


class Base(DeclarativeBase):
    """Strings are unbounded (``VARCHAR`` / ``TEXT``) so an id valid on SQLite is valid on PostgreSQL."""


class RunRow(Base):
    __tablename__ = "runs"
    run_id: Mapped[str] = mapped_column(String(), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class EpisodeRow(Base):
    __tablename__ = "episodes"
    episode_id: Mapped[str] = mapped_column(String(), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id", ondelete="CASCADE"))
    task_id: Mapped[str] = mapped_column(String())
    domain: Mapped[str] = mapped_column(String())
    seed: Mapped[int] = mapped_column(BigInteger)
    harness: Mapped[str] = mapped_column(String())
    effort: Mapped[str] = mapped_column(String())
    policy_version: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String())
    error: Mapped[str] = mapped_column(Text)
    reward: Mapped[float] = mapped_column(Float)
    verifier: Mapped[dict[str, Any]] = mapped_column(JSON)
    turns: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    tool_errors: Mapped[int] = mapped_column(Integer)
    num_samples: Mapped[int] = mapped_column(Integer)
    policy_s: Mapped[float] = mapped_column(Float)
    sandbox_s: Mapped[float] = mapped_column(Float)
    verifier_s: Mapped[float] = mapped_column(Float)
    total_s: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("ix_episodes_group", "run_id", "task_id", "seed"),
        Index("ix_episodes_split", "run_id", "harness", "effort"),
        Index("ix_episodes_created", "run_id", "created_at"),
    )


class SampleRow(Base):
    """Arrays as little-endian bytes: token_ids int32, logprobs float32, loss_mask uint8."""

    __tablename__ = "samples"
    episode_id: Mapped[str] = mapped_column(
        ForeignKey("episodes.episode_id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    num_tokens: Mapped[int] = mapped_column(Integer)
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    loss_mask: Mapped[bytes] = mapped_column(LargeBinary)


class MetricRow(Base):
    __tablename__ = "metrics"
    # SQLite autoincrements only an INTEGER PRIMARY KEY
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String())
    value: Mapped[float] = mapped_column(Float)
    tags: Mapped[dict[str, str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_metrics_run_name_step", "run_id", "name", "step"),)


_RUNS = cast(Table, RunRow.__table__)
_EPS = cast(Table, EpisodeRow.__table__)
_SAMPLES = cast(Table, SampleRow.__table__)
_METRICS = cast(Table, MetricRow.__table__)


@dataclass(frozen=True)
class Metric:
    """One logged value. ``tags`` (harness, effort, domain, ...) let every metric be split."""

    run_id: str
    step: int
    name: str
    value: float
    tags: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


# ---------------------------------------------------------------- encoding


def _pack(typecode: str, values: Sequence[Any]) -> bytes:
    arr = array(typecode, values)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def _unpack(typecode: str, data: bytes) -> tuple[Any, ...]:
    arr = array(typecode)
    arr.frombytes(data)
    if sys.byteorder == "big":
        arr.byteswap()
    return tuple(arr)


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes (we always write UTC); PostgreSQL aware ones.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


# Trajectory fields stored as they are, in columns of the same name.
_PLAIN = ("episode_id", "run_id", "task_id", "domain", "seed", "harness", "effort", "policy_version", "error",
          "reward", "tool_errors")
_TIMINGS = tuple(f.name for f in fields(Timings))


def _episode_values(t: Trajectory) -> dict[str, Any]:
    return {k: getattr(t, k) for k in _PLAIN} | asdict(t.timings) | {
        "status": t.status.value,
        "verifier": dict(t.verifier),
        "turns": [asdict(turn) for turn in t.turns],
        "num_samples": len(t.samples),
        "created_at": t.created_at,
    }


def _sample_values(episode_id: str, idx: int, s: Sample) -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "idx": idx,
        "num_tokens": len(s.token_ids),
        "token_ids": _pack("i", s.token_ids),
        "logprobs": _pack("f", s.logprobs),
        "loss_mask": _pack("B", s.loss_mask),
    }


def _trajectory(row: RowMapping, samples: Sequence[RowMapping]) -> Trajectory:
    arrays = (
        Sample(_unpack("i", s["token_ids"]), _unpack("f", s["logprobs"]), _unpack("B", s["loss_mask"]))
        for s in samples
    )
    return Trajectory(
        **{k: row[k] for k in _PLAIN},
        status=Status(row["status"]),
        verifier=row["verifier"],
        samples=tuple(arrays),
        turns=tuple(Turn(**turn) for turn in row["turns"]),
        timings=Timings(**{k: row[k] for k in _TIMINGS}),
        created_at=_utc(row["created_at"]),
    )


# ---------------------------------------------------------------- engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_MS}")  # first: switching to WAL may wait on a lock
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL: a crash loses at most the last commits
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _engine(url: str) -> Engine:
    sa_url = make_url(url)
    if sa_url.get_backend_name() == "sqlite":
        db = sa_url.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(sa_url, connect_args={"timeout": _SQLITE_BUSY_MS / 1000})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if sa_url.get_backend_name() != "postgresql":
        raise StoreError(f"TrajectoryStore url: expected sqlite:/// or postgresql+psycopg://, got {url!r}")
    return create_engine(sa_url, pool_pre_ping=True)


def _create_tables(engine: Engine) -> None:
    """Create missing tables. Many workers may open a fresh database at once, and
    check-then-create is not atomic, so PostgreSQL serialises it on an advisory
    lock and SQLite (whose writers already serialise) retries a lost race once."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
            Base.metadata.create_all(conn)
        return
    try:
        Base.metadata.create_all(engine)
    except OperationalError:
        Base.metadata.create_all(engine)


StatusFilter = Status | str | Sequence[Status | str] | None


class TrajectoryStore:
    """Trajectories and metrics of runs, in SQLite (default) or PostgreSQL.

    ``url``: a SQLAlchemy URL; ``None`` means ``sqlite:///runs/agentenv.db``
    relative to the working directory (the folder is created). Tables are
    created if missing. Safe to share between threads; each process opens its own.
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = url or DEFAULT_URL
        self.engine = _engine(self.url)
        _create_tables(self.engine)
        self._known_runs: set[str] = set()
        dialect = self.engine.dialect.name
        self._insert = postgresql.insert if dialect == "postgresql" else sqlite.insert

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ writes

    def _ensure_run(self, conn: Connection, run_id: str, config: Mapping[str, Any] | None = None) -> None:
        if run_id in self._known_runs and config is None:
            return
        values = {"run_id": run_id, "created_at": datetime.now(timezone.utc), "config": dict(config or {})}
        conn.execute(self._insert(_RUNS).values(**values).on_conflict_do_nothing(index_elements=["run_id"]))

    def ensure_run(self, run_id: str, config: Mapping[str, Any] | None = None) -> None:
        """Record a run (and its config, JSON) if it is new; ``put`` and ``log_metric`` call this too."""
        with self.engine.begin() as conn:
            self._ensure_run(conn, run_id, config)
        self._known_runs.add(run_id)

    def put(self, trajectory: Trajectory) -> bool:
        """Store ``trajectory`` once. Returns False (and writes nothing) if its episode id is stored.

        Idempotent under concurrent writers, across threads and processes: the
        episode row is inserted with ON CONFLICT DO NOTHING, and its samples only
        by the transaction whose insert won.
        """
        t = trajectory
        with self.engine.begin() as conn:
            self._ensure_run(conn, t.run_id)
            stmt = (
                self._insert(_EPS)
                .values(**_episode_values(t))
                .on_conflict_do_nothing(index_elements=["episode_id"])
                .returning(_EPS.c.episode_id)  # a row only if this insert won; rowcount is unreliable across drivers
            )
            inserted = conn.execute(stmt).first() is not None
            if inserted and t.samples:
                conn.execute(_SAMPLES.insert(), [_sample_values(t.episode_id, i, s) for i, s in enumerate(t.samples)])
        self._known_runs.add(t.run_id)
        return inserted

    def log_metric(
        self, run_id: str, name: str, value: float, *, step: int = 0, tags: Mapping[str, str] | None = None
    ) -> None:
        """Log one value; put harness / effort / domain in ``tags`` so it can be split later."""
        self.log_metrics(run_id, {name: value}, step=step, tags=tags)

    def log_metrics(
        self, run_id: str, values: Mapping[str, float], *, step: int = 0, tags: Mapping[str, str] | None = None
    ) -> None:
        """Log several values of one step with the same tags, in one transaction."""
        now = datetime.now(timezone.utc)
        rows = [
            {"run_id": run_id, "step": step, "name": n, "value": float(v), "tags": dict(tags or {}), "created_at": now}
            for n, v in values.items()
        ]
        if not rows:
            return
        with self.engine.begin() as conn:
            self._ensure_run(conn, run_id)
            conn.execute(_METRICS.insert(), rows)
        self._known_runs.add(run_id)

    # ------------------------------------------------------------ reads

    def get(self, episode_id: str) -> Trajectory | None:
        """The stored trajectory of ``episode_id``, or None."""
        with self.engine.connect() as conn:
            row = conn.execute(select(_EPS).where(_EPS.c.episode_id == episode_id)).mappings().first()
            return None if row is None else self._attach_samples(conn, [row])[0]

    def query(
        self,
        *,
        run_id: str | None = None,
        task_id: str | None = None,
        harness: str | None = None,
        effort: str | None = None,
        status: StatusFilter = None,
        domain: str | None = None,
        min_policy_version: int | None = None,
        limit: int | None = None,
    ) -> list[Trajectory]:
        """Trajectories matching every given filter, oldest first. ``status`` may be one or several."""
        where = _where(run_id, task_id, harness, effort, status, domain, min_policy_version)
        stmt = select(_EPS).where(*where).order_by(_EPS.c.created_at, _EPS.c.episode_id).limit(limit)
        with self.engine.connect() as conn:
            return self._attach_samples(conn, list(conn.execute(stmt).mappings()))

    def groups(
        self,
        run_id: str,
        size: int,
        *,
        task_id: str | None = None,
        harness: str | None = None,
        effort: str | None = None,
        domain: str | None = None,
        min_policy_version: int | None = None,
        status: StatusFilter = tuple(TRAINABLE),
        limit: int | None = None,
    ) -> list[tuple[Trajectory, ...]]:
        """Complete groups of ``size`` trajectories of one (task, variant seed), for group-relative advantages.

        Only members passing the filters count (by default trainable statuses, so
        a lost sandbox leaves its group incomplete until the retry lands). A group
        with more members than ``size`` (retries that both finished) gives its
        oldest ``size``. Groups come in the order they became complete.
        """
        if size < 1:
            raise StoreError(f"groups: size must be >= 1, got {size}")
        where = _where(run_id, task_id, harness, effort, status, domain, min_policy_version)
        stmt = (
            select(_EPS.c.episode_id, _EPS.c.task_id, _EPS.c.seed)
            .where(*where)
            .order_by(_EPS.c.created_at, _EPS.c.episode_id)
        )
        members: dict[tuple[str, int], list[tuple[int, str]]] = {}
        with self.engine.connect() as conn:
            for pos, row in enumerate(conn.execute(stmt)):
                members.setdefault((str(row.task_id), int(row.seed)), []).append((pos, str(row.episode_id)))
            complete = sorted((m[:size] for m in members.values() if len(m) >= size), key=lambda m: m[-1][0])
            complete = complete[:limit] if limit is not None else complete
            ids = [eid for m in complete for _, eid in m]
            by_id = {t.episode_id: t for t in self._load(conn, ids)}
        return [tuple(by_id[eid] for _, eid in m) for m in complete]

    def metrics(
        self, run_id: str, name: str | None = None, *, tags: Mapping[str, str] | None = None
    ) -> list[Metric]:
        """Logged metrics of a run by step, optionally one ``name`` and only those whose tags include ``tags``."""
        stmt = select(_METRICS).where(_METRICS.c.run_id == run_id)
        if name is not None:
            stmt = stmt.where(_METRICS.c.name == name)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt.order_by(_METRICS.c.step, _METRICS.c.id)).mappings().all()
        want = dict(tags or {})
        # Tag filtering in Python: JSON operators differ between SQLite and PostgreSQL.
        return [
            Metric(r["run_id"], r["step"], r["name"], r["value"], r["tags"], _utc(r["created_at"]))
            for r in rows
            if all(r["tags"].get(k) == v for k, v in want.items())
        ]

    def iter_trajectories(self, *, batch_size: int = 256, **filters: Any) -> Iterator[Trajectory]:
        """All matching trajectories by episode id, ``batch_size`` at a time (memory stays flat).

        ``filters`` are ``query``'s (without ``limit``). Pages are read one after
        another, not from one snapshot: an episode written meanwhile may or may not appear.
        """
        where = _where(**_checked(filters))
        last: str | None = None
        while True:
            stmt = select(_EPS).where(*where).order_by(_EPS.c.episode_id).limit(batch_size)
            if last is not None:
                stmt = stmt.where(_EPS.c.episode_id > last)
            with self.engine.connect() as conn:
                batch = self._attach_samples(conn, list(conn.execute(stmt).mappings()))
            yield from batch
            if len(batch) < batch_size:
                return
            last = batch[-1].episode_id

    def export(self, path: str | Path, format: Literal["parquet", "jsonl"] = "parquet", **filters: Any) -> int:
        """Write matching trajectories for Hugging Face ``datasets``; returns the number of rows.

        One row per training sample (episode fields repeated, ``sample_index`` /
        ``num_samples`` added); an episode without samples gives one row with
        empty arrays, so failures stay visible. ``verifier`` and ``turns`` are JSON
        strings, ``created_at`` ISO 8601. ``filters`` are ``query``'s. The file
        appears whole or not at all. Load with
        ``datasets.load_dataset("parquet" | "json", data_files=str(path))``.
        """
        if format not in ("parquet", "jsonl"):
            raise StoreError(f"export: format must be 'parquet' or 'jsonl', got {format!r}")
        _checked(filters)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        rows = (r for t in self.iter_trajectories(**filters) for r in _export_rows(t))
        try:
            n = _write_jsonl(tmp, rows) if format == "jsonl" else _write_parquet(tmp, rows)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)
        return n

    # ------------------------------------------------------------ helpers

    def _load(self, conn: Connection, ids: Sequence[str]) -> list[Trajectory]:
        rows: list[RowMapping] = []
        for i in range(0, len(ids), _IN_CHUNK):
            rows += conn.execute(select(_EPS).where(_EPS.c.episode_id.in_(ids[i : i + _IN_CHUNK]))).mappings().all()
        return self._attach_samples(conn, rows)

    def _attach_samples(self, conn: Connection, rows: Sequence[RowMapping]) -> list[Trajectory]:
        ids = [r["episode_id"] for r in rows if r["num_samples"]]
        samples: dict[str, list[RowMapping]] = {}
        for i in range(0, len(ids), _IN_CHUNK):
            stmt = (
                select(_SAMPLES)
                .where(_SAMPLES.c.episode_id.in_(ids[i : i + _IN_CHUNK]))
                .order_by(_SAMPLES.c.episode_id, _SAMPLES.c.idx)
            )
            for s in conn.execute(stmt).mappings():
                samples.setdefault(s["episode_id"], []).append(s)
        return [_trajectory(r, samples.get(r["episode_id"], [])) for r in rows]


# Export columns and their Arrow types (``pyarrow.type_for_alias`` names); arrays come last.
_EXPORT_SCALARS = (
    "episode_id:string sample_index:int32 num_samples:int32 run_id:string task_id:string domain:string "
    "seed:int64 harness:string effort:string policy_version:int64 status:string error:string reward:float64 "
    "tool_errors:int32 num_turns:int32 policy_s:float64 sandbox_s:float64 verifier_s:float64 total_s:float64 "
    "created_at:string verifier:string turns:string"
)
_EXPORT_ARRAYS = (("token_ids", "int32"), ("logprobs", "float32"), ("loss_mask", "int8"))


def _export_rows(t: Trajectory) -> Iterator[dict[str, Any]]:
    base = _episode_values(t) | {
        "num_turns": len(t.turns),
        "created_at": t.created_at.isoformat(),
        "verifier": json.dumps(dict(t.verifier), sort_keys=True),
        "turns": json.dumps([asdict(turn) for turn in t.turns]),
    }
    for i, s in enumerate(t.samples or (Sample((), (), ()),)):
        arrays = {"token_ids": list(s.token_ids), "logprobs": list(s.logprobs), "loss_mask": list(s.loss_mask)}
        yield base | arrays | {"sample_index": i}


def _write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for n, row in enumerate(rows, 1):
            f.write(json.dumps(row) + "\n")
    return n


def _write_parquet(path: Path, rows: Iterator[dict[str, Any]], batch_rows: int = 1024) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("export(format='parquet') needs pyarrow: pip install 'pyarrow>=15'") from exc
    schema = pa.schema(
        [(col, pa.type_for_alias(kind)) for col, kind in (c.split(":") for c in _EXPORT_SCALARS.split())]
        + [(col, pa.list_(pa.type_for_alias(kind))) for col, kind in _EXPORT_ARRAYS]
    )
    n, batch = 0, []
    with pq.ParquetWriter(path, schema) as writer:
        for n, row in enumerate(rows, 1):
            batch.append(row)
            if len(batch) == batch_rows:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return n


_FILTERS = ("run_id", "task_id", "harness", "effort", "status", "domain", "min_policy_version")


def _checked(filters: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(filters) - set(_FILTERS))
    if unknown:
        raise UnknownFilter(f"unknown trajectory filter(s) {unknown}; expected some of {list(_FILTERS)}")
    return filters


def _where(
    run_id: str | None = None,
    task_id: str | None = None,
    harness: str | None = None,
    effort: str | None = None,
    status: StatusFilter = None,
    domain: str | None = None,
    min_policy_version: int | None = None,
) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    for col, value in (
        (_EPS.c.run_id, run_id),
        (_EPS.c.task_id, task_id),
        (_EPS.c.harness, harness),
        (_EPS.c.effort, effort),
        (_EPS.c.domain, domain),
    ):
        if value is not None:
            where.append(col == value)
    if status is not None:
        wanted = {status} if isinstance(status, str) else set(status)
        unknown = wanted - set(Status) - {s.value for s in Status}
        if unknown:
            raise StoreError(f"status filter: expected values of {[s.value for s in Status]}, got {sorted(unknown)}")
        where.append(_EPS.c.status.in_(sorted(Status(s).value for s in wanted)))
    if min_policy_version is not None:
        where.append(_EPS.c.policy_version >= min_policy_version)
    return where
