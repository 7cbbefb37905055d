"""Hostile SQLite databases against the host-side dump (issue 26): each is refused within the deadline,
as the agent's failure (reward 0, not invalid), and none of it runs in the grading process."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from verifier_fakes import FakeReplay, make_episode, make_variant

from agentenv.types import DbStateVerifierSpec, RowAssertion, VerifierResult
from agentenv.verifiers import build_verifier
from sandboxes.testing import FakeSandbox

pytestmark = pytest.mark.unit

URL = "sqlite:////workspace/app.db"
DEADLINE_S = 4.0
RECURSIVE = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n AS id, 'a' AS name, 1.0 AS price FROM r"


def _db(tmp_path: Path, name: str, script: str) -> bytes:
    path = tmp_path / f"{name}.sqlite"
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.executescript(script)
    con.commit()
    con.close()
    return path.read_bytes()


def _good(tmp_path: Path) -> bytes:
    return _db(tmp_path, "good", "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL); INSERT INTO items VALUES (1, 'a', 1.0);")


def _verify(data: bytes, tmp_path: Path, **spec_kw) -> tuple[VerifierResult, float]:  # noqa: ANN003
    spec = DbStateVerifierSpec(url=URL, **spec_kw)
    verifier = build_verifier(spec, None, make_variant(p=11))
    verifier.sqlite_deadline_s = DEADLINE_S  # type: ignore[attr-defined]
    oracle = FakeReplay(FakeSandbox({"/workspace/app.db": _good(tmp_path)}))
    t0 = time.monotonic()
    result = verifier.verify(FakeSandbox({"/workspace/app.db": data}), make_episode(oracle=oracle, p=11))
    return result, time.monotonic() - t0


def _refused(result: VerifierResult, elapsed: float) -> None:
    assert result.reward == 0.0 and not result.invalid, result
    assert elapsed < DEADLINE_S + 10, f"took {elapsed:.1f} s against a {DEADLINE_S} s deadline"


def test_a_good_database_still_passes(tmp_path: Path) -> None:
    result, _ = _verify(_good(tmp_path), tmp_path, tables=["items"])
    assert result.reward == 1.0, result


def test_a_recursive_view_in_place_of_the_graded_table_is_refused_within_the_deadline(tmp_path: Path) -> None:
    data = _db(tmp_path, "view", f"CREATE VIEW items AS {RECURSIVE};")
    result, elapsed = _verify(data, tmp_path, tables=["items"])
    _refused(result, elapsed)
    assert "view" in str(result.details), result.details


def test_a_recursive_view_under_an_assertion_query_ends_at_the_deadline(tmp_path: Path) -> None:
    data = _db(tmp_path, "view2", f"CREATE TABLE t (a); CREATE VIEW items AS {RECURSIVE};")
    assertion = RowAssertion(query="SELECT count(*) FROM items", expect=[[1]])
    result, elapsed = _verify(data, tmp_path, assertions=[assertion], compare_oracle_hash=False)
    _refused(result, elapsed)
    assert "did not answer" in str(result.details), result.details


def test_a_trigger_on_the_graded_table_is_refused(tmp_path: Path) -> None:
    data = _db(
        tmp_path, "trigger",
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL); INSERT INTO items VALUES (1, 'a', 1.0);"
        "CREATE TRIGGER t AFTER INSERT ON items BEGIN DELETE FROM items; END;",
    )
    result, elapsed = _verify(data, tmp_path, tables=["items"])
    _refused(result, elapsed)
    assert "trigger" in str(result.details), result.details


def test_a_virtual_table_in_place_of_the_graded_table_is_refused(tmp_path: Path) -> None:
    data = _db(tmp_path, "virtual", "CREATE VIRTUAL TABLE items USING fts5(id, name, price); INSERT INTO items VALUES (1, 'a', 1.0);")
    result, elapsed = _verify(data, tmp_path, tables=["items"])
    _refused(result, elapsed)
    assert "virtual" in str(result.details), result.details


def test_malformed_and_huge_files_are_the_agents_failure(tmp_path: Path) -> None:
    good = _good(tmp_path)
    malformed = good[:100] + b"\xff" * 4000 + good[4100:]  # a valid header over garbage pages
    result, elapsed = _verify(malformed, tmp_path, tables=["items"])
    _refused(result, elapsed)
    huge = good + b"\0" * (257 << 20)  # past the copy cap: never copied, marked as caused by the agent
    result, elapsed = _verify(huge, tmp_path, tables=["items"])
    assert result.reward == 0.0 and (not result.invalid or result.invalid_cause == "agent"), result
    assert elapsed < DEADLINE_S


def test_the_stdlib_sqlite_dump_equals_the_sqlalchemy_dump(tmp_path: Path) -> None:
    from agentenv.verifiers.db_canon import dump

    path = tmp_path / "types.sqlite"
    _db(tmp_path, "types", "CREATE TABLE t (a INTEGER, b REAL, c TEXT, d BLOB, e DATE, f NUMERIC, g BOOLEAN);"
        "INSERT INTO t VALUES (1, 2.5, 'x', x'00ff', '2024-01-02', 3.0, 1), (NULL, 1e300, '', x'', NULL, 0.1234567, 0);"
        "CREATE TABLE u (z); INSERT INTO u VALUES ('q');")
    path = tmp_path / "types.sqlite"
    queries = ["SELECT a, b FROM t ORDER BY a", "SELECT * FROM missing"]
    fast = dump(f"sqlite:///{path}", None, queries)
    slow = dump(f"sqlite:///{path}", None, queries, force_sqlalchemy=True)
    assert fast == slow
