"""Database-state verifier on real SQLite files behind a fake sandbox; grade_episode with a fake backend."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest
from verifier_fakes import FakeReplay, make_episode, make_variant

from agentenv.errors import OracleError
from agentenv.grading import BackendOracleReplay, clear_oracle_cache, grade_episode
from agentenv.types import DbStateVerifierSpec, Episode, RowAssertion, VerifierResult
from agentenv.verifiers import build_verifier
from agentenv.verifiers.db_canon import dump, normalise, state_hash
from sandboxes.testing import FakeBackend, FakeSandbox

pytestmark = pytest.mark.unit

URL = "sqlite:////workspace/app.db"
_COUNTER = itertools.count()


def db_bytes(tmp_path: Path, price: float, extra_row: bool = False, wal: bool = False) -> dict[str, bytes]:
    path = tmp_path / f"db-{next(_COUNTER)}.sqlite"
    con = sqlite3.connect(path)
    if wal:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
    con.executemany("INSERT INTO items VALUES (?, ?, ?)", [(2, "b", 5.0), (1, "a", price)])
    if extra_row:
        con.execute("INSERT INTO items VALUES (3, 'c', 1.0)")
    con.commit()
    files = {"/workspace/app.db": path.read_bytes()}
    if wal:
        files["/workspace/app.db-wal"] = Path(f"{path}-wal").read_bytes()
    con.close()
    return files


def verify(files: dict[str, bytes], oracle: FakeReplay | None, **spec_kw) -> VerifierResult:  # noqa: ANN003
    spec = DbStateVerifierSpec(url=URL, **spec_kw)
    return build_verifier(spec, None, make_variant(p=11)).verify(FakeSandbox(files), make_episode(oracle=oracle, p=11))


def test_state_hash_matches_the_oracles_and_row_order_does_not_matter(tmp_path: Path) -> None:
    oracle = FakeReplay(FakeSandbox(db_bytes(tmp_path, 11.0)))
    result = verify(db_bytes(tmp_path, 11.0), oracle)
    assert result.reward == 1.0 and result.passed
    wrong = verify(db_bytes(tmp_path, 10.0), oracle)
    assert wrong.reward == 0.0 and not wrong.invalid and "unexpected rows" in wrong.details[-1].detail


def test_rows_committed_only_in_the_wal_are_seen(tmp_path: Path) -> None:
    oracle = FakeReplay(FakeSandbox(db_bytes(tmp_path, 11.0, extra_row=True)))
    assert verify(db_bytes(tmp_path, 11.0, extra_row=True, wal=True), oracle).reward == 1.0


def test_row_assertions_are_templated_and_a_dropped_table_fails(tmp_path: Path) -> None:
    assertion = RowAssertion(query="SELECT price FROM items WHERE id = 1", expect=[["{{ p }}"]])
    assert verify(db_bytes(tmp_path, 11.0), None, assertions=[assertion], compare_oracle_hash=False).reward == 1.0
    assert verify(db_bytes(tmp_path, 12.0), None, assertions=[assertion], compare_oracle_hash=False).reward == 0.0
    gone = RowAssertion(query="SELECT * FROM missing", expect_count=0)
    result = verify(db_bytes(tmp_path, 11.0), None, assertions=[gone], compare_oracle_hash=False)
    assert result.reward == 0.0 and not result.invalid and "query failed" in result.details[0].detail


def test_missing_or_corrupt_database_is_the_agents_failure(tmp_path: Path) -> None:
    oracle = FakeReplay(FakeSandbox(db_bytes(tmp_path, 11.0)))
    assert verify({}, oracle).reward == 0.0 and not verify({}, oracle).invalid
    corrupt = verify({"/workspace/app.db": b"not a database at all" * 100}, oracle)
    assert corrupt.reward == 0.0 and not corrupt.invalid


def test_failed_oracle_replay_is_invalid_not_an_agent_failure(tmp_path: Path) -> None:
    result = verify(db_bytes(tmp_path, 11.0), FakeReplay(error="solve.sh: exit 2"))
    assert result.invalid and result.reason.startswith("oracle failed")
    assert verify(db_bytes(tmp_path, 11.0), None).invalid  # no replay at hand: cannot decide


def test_canonical_form_normalises_types(tmp_path: Path) -> None:
    import datetime
    import decimal

    assert normalise(decimal.Decimal("10.00")) == 10 and normalise(2.5000000001) == 2.5
    assert normalise(datetime.date(2024, 1, 2)) == "2024-01-02" and normalise(b"\x01") == "01"
    path = tmp_path / "x.db"
    sqlite3.connect(path).executescript("CREATE TABLE t (a); INSERT INTO t VALUES (2); INSERT INTO t VALUES (1);")
    out = dump(f"sqlite:///{path}")
    assert out["tables"]["t"]["rows"] == [[1], [2]] and len(state_hash(out["tables"])) == 64


# ---------------------------------------------------------------- grade_episode


class FakeTask:
    id = "t/fake"
    folder = None

    def __init__(self, grade_result: VerifierResult | Exception) -> None:
        self.grade_result = grade_result
        self.seen_files: dict[str, bytes] = {}
        self.oracle_runs = 0

    def hidden_paths(self) -> list[str]:
        return ["/tests"]

    def hidden_files(self, variant: object) -> dict[str, bytes]:
        return {"/tests/test_real.py": b"def test_real(): assert False\n"}

    def sandbox_spec(self, *, build: bool = True) -> object:
        from sandboxes.types import SandboxSpec

        return SandboxSpec(image="fake")

    def setup(self, sandbox: FakeSandbox, variant: object) -> None:
        sandbox.files["/workspace/app.db"] = b"fresh"

    def oracle(self, sandbox: FakeSandbox, variant: object) -> str | None:
        self.oracle_runs += 1
        return "42"

    def grade(self, sandbox: FakeSandbox, episode: Episode) -> VerifierResult:
        self.seen_files = dict(sandbox.files)
        assert episode.oracle is not None
        if isinstance(self.grade_result, Exception):
            raise self.grade_result
        return self.grade_result


def test_grade_episode_clears_planted_files_copies_hidden_ones_and_closes() -> None:
    agent = FakeSandbox({"/tests/test_real.py": b"def test_real(): pass\n", "/tests/conftest.py": b"x", "/workspace/a": b"1"})
    backend = FakeBackend()
    task = FakeTask(VerifierResult(1.0, True))
    result = grade_episode(backend, agent, task, make_episode())  # type: ignore[arg-type]
    assert result.reward == 1.0 and "timings" in result.extra
    assert task.seen_files["/tests/test_real.py"].endswith(b"assert False\n")
    assert "/tests/conftest.py" not in task.seen_files and task.seen_files["/workspace/a"] == b"1"
    assert all(sb.closed for sb in backend.made) and not agent.closed


def test_grade_episode_never_raises() -> None:
    backend = FakeBackend()
    crash = grade_episode(backend, FakeSandbox(), FakeTask(RuntimeError("verifier bug")), make_episode())  # type: ignore[arg-type]
    assert crash.invalid and "verifier bug" in crash.reason

    class Lost(FakeSandbox):
        def snapshot(self, kind: object = None, *, tag: str | None = None) -> object:
            raise ConnectionError("container gone")

    lost = grade_episode(backend, Lost(), FakeTask(VerifierResult(1.0, True)), make_episode())  # type: ignore[arg-type]
    assert lost.invalid and "container gone" in lost.reason


def test_oracle_replay_runs_once_per_variant_and_caches_failures() -> None:
    clear_oracle_cache()
    task = FakeTask(VerifierResult(1.0, True))
    variant = make_variant()
    replay = BackendOracleReplay(FakeBackend(), task, variant)  # type: ignore[arg-type]
    assert replay.compute("k", lambda sb, ans: (sb.files["/workspace/app.db"], ans)) == (b"fresh", "42")
    again = BackendOracleReplay(FakeBackend(), task, variant)  # type: ignore[arg-type]
    assert again.compute("k", lambda sb, ans: "different") == (b"fresh", "42")
    assert task.oracle_runs == 1

    class Broken(FakeTask):
        id = "t/broken"

        def oracle(self, sandbox: FakeSandbox, variant: object) -> str | None:
            raise OracleError("solve.sh exit 1")

    broken = BackendOracleReplay(FakeBackend(), Broken(VerifierResult(1.0, True)), variant)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(OracleError, match="exit 1"):
            broken.compute("k", lambda sb, ans: 1)
    clear_oracle_cache()


def test_grade_in_place_needs_a_quiesced_sandbox_else_it_forks() -> None:
    class Quiet(FakeSandbox):
        def __init__(self, files: dict[str, bytes], refusal: str | None) -> None:
            super().__init__(files)
            self.refusal, self.quiesced = refusal, 0

        def quiesce(self) -> str | None:
            self.quiesced += 1
            return self.refusal

    planted = {"/tests/conftest.py": b"x", "/workspace/a": b"1"}
    backend, task = FakeBackend(), FakeTask(VerifierResult(1.0, True))
    agent = Quiet(dict(planted), None)
    result = grade_episode(backend, agent, task, make_episode(), in_place=True)  # type: ignore[arg-type]
    assert result.reward == 1.0 and result.extra["graded_in"] == "place" and agent.quiesced == 1
    assert backend.made == [] and not agent.closed  # no fork made; the caller resets its own sandbox
    assert "/tests/conftest.py" not in task.seen_files and task.seen_files["/tests/test_real.py"].endswith(b"assert False\n")
    assert not [p for p in agent.files if p.startswith("/tests/")]  # what grading copied in is gone again

    refusing = Quiet(dict(planted), "1 SysV IPC objects exist")
    result = grade_episode(backend, refusing, task, make_episode(), in_place=True)  # type: ignore[arg-type]
    assert result.extra["graded_in"] == "fork" and result.extra["in_place_refused"] == "1 SysV IPC objects exist"
    assert len(backend.made) == 1 and backend.made[0].closed and "/tests/conftest.py" in refusing.files

    result = grade_episode(backend, FakeSandbox(dict(planted)), task, make_episode(), in_place=True)  # type: ignore[arg-type]
    assert result.extra["graded_in"] == "fork" and "cannot quiesce" in result.extra["in_place_refused"]
