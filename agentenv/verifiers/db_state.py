"""Database state through SQLAlchemy: row assertions and the oracle's canonical state hash.

Two ways in, one canonical form (``db_canon``):

* **SQLite** (``sqlite:////workspace/app.db``): the database file, with its
  ``-wal`` / ``-journal`` companions when present (committed rows may still
  live only in the WAL), is copied out of the sandbox and opened on the host
  with SQLAlchemy 2, in a subprocess killed past ``SQLITE_DEADLINE_S`` (a
  recursive view never returns); a graded name that is a view, a virtual
  table or has triggers is refused (``db_canon.NotATable``).
* **Any server URL** (``postgresql+psycopg2://agent@/shop?host=/tmp``): the
  server lives inside the sandbox and the network is off, so ``db_canon.py``
  is staged into a fresh directory and run *inside* with the image's Debian
  ``python3-sqlalchemy``; it prints the canonical rows as JSON and the host
  hashes them. ``prepare`` (e.g. ``agentenv-pg-start``) runs first, because a
  grading sandbox restored from a snapshot has the files but no server.

The state hash is compared with the hash of the same tables after the oracle
ran on a fresh copy of the same variant (``Episode.oracle``, cached per task,
variant and image). A failed replay is ``invalid`` ("oracle failed"), never the
agent's failure. A missing, unreadable, malformed or hanging database, a graded table
replaced by a view, or a query that errors (a dropped table), is the
agent's failure (reward 0).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from agentenv.errors import OracleError
from agentenv.types import CheckResult, DbStateVerifierSpec, Episode, RowAssertion, VerifierResult
from agentenv.verifiers import db_canon
from agentenv.verifiers.common import (
    AgentCaused,
    BaseVerifier,
    VerifierContext,
    VerifierError,
    check,
    invalid,
    read_graded_file,
    remove_dirs,
    score,
    stage,
)
from agentenv.verifiers.compare import close
from sandboxes.types import Sandbox

_SQLITE = "sqlite:///"
_DB_CAP = 256 << 20  # a SQLite file larger than this is not one a task makes
SQLITE_DEADLINE_S = 60.0  # the whole host-side dump of one SQLite database
_DUMP_MEMORY = 2 << 30  # address space of the dumping subprocess


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_DUMP_MEMORY, _DUMP_MEMORY))


class AgentStateError(Exception):
    """The database is not there or not readable: the agent's failure, decided."""


def _cell_equal(actual: Any, expected: Any) -> bool:
    if isinstance(expected, str):
        try:
            expected = json.loads(expected)  # rendered templates arrive as text: "{{ n }}" -> 7
        except json.JSONDecodeError:
            pass
    expected = db_canon.normalise(expected)
    numeric = (int, float)
    if isinstance(actual, numeric) and isinstance(expected, numeric) and not isinstance(actual, bool):
        return close(float(actual), float(expected), 1e-6)
    return bool(actual == expected)


def assertion_check(assertion: RowAssertion, outcome: dict[str, Any], query: str, expect: list[list[Any]] | None) -> CheckResult:
    name = f"query {query[:60]!r}"
    if "error" in outcome:
        return check(name, False, f"query failed: {outcome['error']}")
    rows: list[list[Any]] = outcome["rows"]
    if assertion.expect_count is not None and len(rows) != assertion.expect_count:
        return check(name, False, f"{len(rows)} rows, expected {assertion.expect_count}")
    if expect is not None:
        same = len(rows) == len(expect) and all(
            len(a) == len(e) and all(_cell_equal(x, y) for x, y in zip(a, e, strict=True)) for a, e in zip(rows, expect, strict=True)
        )
        if not same:
            return check(name, False, f"got {json.dumps(rows)[:200]}, expected {json.dumps(expect)[:200]}")
    return check(name, True)


class DbStateVerifier(BaseVerifier):
    kind = "db_state"
    sqlite_deadline_s = SQLITE_DEADLINE_S

    def __init__(self, spec: DbStateVerifierSpec, ctx: VerifierContext) -> None:
        super().__init__(spec.name, ctx)
        self.spec = spec
        self.url = ctx.render(spec.url, f"{self.name}.url")

    # ------------------------------------------------------------ dumping

    def dump(self, sandbox: Sandbox, queries: list[str], *, tables: bool) -> dict[str, Any]:
        """Canonical rows of the sandbox's database; ``AgentStateError`` when there is none to read."""
        wanted = self.spec.tables if tables else []
        if self.url.startswith(_SQLITE):
            return self._dump_sqlite(sandbox, queries, wanted)
        return self._dump_inside(sandbox, queries, wanted)

    def _dump_sqlite(self, sandbox: Sandbox, queries: list[str], tables: list[str] | None) -> dict[str, Any]:
        remote = self.url[len(_SQLITE) :]
        with tempfile.TemporaryDirectory(prefix="agentenv-db-") as tmp:
            local = Path(tmp) / (Path(remote).name or "db.sqlite")
            data = read_graded_file(sandbox, remote, cap=_DB_CAP)  # a FIFO or a huge file there: AgentCaused
            if data is None:
                raise AgentStateError(f"database file {remote} is missing")
            local.write_bytes(data)
            for suffix in ("-wal", "-journal"):
                side = read_graded_file(sandbox, remote + suffix, cap=_DB_CAP)
                if side is not None:
                    Path(f"{local}{suffix}").write_bytes(side)
            return self._dump_sqlite_bounded(local, remote, tables, queries)

    def _dump_sqlite_bounded(self, local: Path, remote: str, tables: list[str] | None, queries: list[str]) -> dict[str, Any]:
        """``db_canon.dump`` of the copied file in a subprocess, killed past ``sqlite_deadline_s``.

        The file is the agent's: a recursive view, a huge or malformed file is its
        failure (``AgentStateError``, reward 0), and none of it runs in this process.
        """
        request = local.parent / "request.json"
        request.write_text(json.dumps({"url": f"sqlite:///{local}", "tables": tables, "queries": queries}))
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-S", db_canon.__file__, str(request)],  # a SQLite dump needs the stdlib only
                capture_output=True, timeout=self.sqlite_deadline_s, preexec_fn=_limit_memory, check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise AgentStateError(f"database {remote} did not answer within {self.sqlite_deadline_s:g} s") from exc
        if proc.returncode != 0:
            last = (proc.stderr.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise AgentStateError(f"database {remote} cannot be read: {last[:400]}")
        try:
            return json.loads(proc.stdout.decode().splitlines()[-1])  # type: ignore[no-any-return]
        except (IndexError, json.JSONDecodeError) as exc:
            raise AgentStateError(f"database {remote}: garbled dump {proc.stdout[-200:]!r}") from exc

    def _dump_inside(self, sandbox: Sandbox, queries: list[str], tables: list[str] | None) -> dict[str, Any]:
        if self.spec.prepare:
            prep = sandbox.exec(["bash", "-c", self.spec.prepare], timeout=120)
            if not prep.ok:
                raise VerifierError(f"prepare command failed (exit {prep.exit_code}): {(prep.stdout + prep.stderr)[-400:]}")
        request = json.dumps({"url": self.url, "tables": tables, "queries": queries}).encode()
        root = stage(sandbox, {"db_canon.py": Path(db_canon.__file__).read_bytes(), "request.json": request}, "db")
        try:
            result = sandbox.exec(["python3", "-I", f"{root}/db_canon.py", f"{root}/request.json"], timeout=120)
        finally:
            remove_dirs(sandbox, [root])
        if result.timed_out:  # the oracle's state goes through the same dump: a hang there is the task's
            raise AgentStateError("dumping the database inside the sandbox timed out (a recursive view?)")
        if not result.ok:
            # connection refused / database dropped: decided against the agent only if the server ran
            raise AgentStateError(f"cannot read {self.url}: {(result.stderr or result.stdout)[-400:]}")
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        try:
            return json.loads(lines[-1])  # type: ignore[no-any-return]
        except (IndexError, json.JSONDecodeError) as exc:
            raise VerifierError(f"garbled output of the in-sandbox dump: {result.stdout[-300:]!r}") from exc

    # ------------------------------------------------------------ verifying

    def _verify(self, sandbox: Sandbox, episode: Episode, started: float) -> VerifierResult:
        if not self.spec.assertions and not self.spec.compare_oracle_hash:
            return invalid(f"{self.name}: no assertions and no oracle hash: nothing to check", started=started)
        rendered = [
            (
                a,
                self.ctx.render(a.query, f"{self.name}.assertions[{i}].query"),
                None if a.expect is None else [[self._render_cell(c, i) for c in row] for row in a.expect],
            )
            for i, a in enumerate(self.spec.assertions)
        ]
        try:
            state = self.dump(sandbox, [q for _, q, _ in rendered], tables=self.spec.compare_oracle_hash)
        except AgentStateError as exc:
            return score([check("database readable", False, str(exc))], partial_credit=False, started=started)
        checks = [assertion_check(a, outcome, q, e) for (a, q, e), outcome in zip(rendered, state["queries"], strict=True)]
        if self.spec.compare_oracle_hash:
            checks.append(self._hash_check(state["tables"], episode))
        return score(checks, partial_credit=False, started=started)

    def _render_cell(self, cell: Any, i: int) -> Any:
        return self.ctx.render(cell, f"{self.name}.assertions[{i}].expect") if isinstance(cell, str) else cell

    def _hash_check(self, tables: dict[str, Any], episode: Episode) -> CheckResult:
        if episode.oracle is None:
            raise VerifierError("compare_oracle_hash needs an oracle replay (grade through agentenv.grading.grade_episode)")
        mine = db_canon.state_hash(tables)

        def oracle_state(oracle_sandbox: Sandbox, _answer: str | None) -> dict[str, Any]:
            try:
                return self.dump(oracle_sandbox, [], tables=True)["tables"]  # type: ignore[no-any-return]
            except (AgentStateError, AgentCaused) as exc:  # on the oracle's side: the task's fault
                raise OracleError(f"its database is unreadable: {exc}") from exc

        theirs: dict[str, Any] = episode.oracle.compute(f"db:{self.url}:{self.spec.tables}", oracle_state)
        if mine == db_canon.state_hash(theirs):
            return check("state hash equals the oracle's", True, mine[:16])
        return check("state hash equals the oracle's", False, _first_difference(tables, theirs))


def _first_difference(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    for name in sorted(set(mine) | set(theirs)):
        a, b = mine.get(name), theirs.get(name)
        if a != b:
            if a is None or b is None:
                return f"table {name} {'missing' if a is None else 'unexpected'}"
            if a["columns"] != b["columns"]:
                return f"table {name}: columns {a['columns']} != {b['columns']}"
            extra = [r for r in a["rows"] if r not in b["rows"]][:2]
            missing = [r for r in b["rows"] if r not in a["rows"]][:2]
            return f"table {name}: unexpected rows {extra}, missing rows {missing}"
    return "states differ"


__all__ = ["DbStateVerifier", "assertion_check"]
