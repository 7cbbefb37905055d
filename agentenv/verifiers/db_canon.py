"""Canonical rows of a database through SQLAlchemy, and their hash. Also a script.

This file is imported on the host (SQLite: the database file is copied out of
the sandbox and opened here with SQLAlchemy 2) *and* copied into a sandbox and
run there with the image's Debian ``python3-sqlalchemy`` (1.4) for servers
that only exist inside the sandbox (PostgreSQL on a unix socket, network off).
So it imports nothing but the standard library and SQLAlchemy, and uses only
the API both versions share. A ``postgresql`` / ``postgresql+psycopg2`` URL
goes through ``psycopg2`` directly where it is importable (same queries, same
values, same canonical form): importing SQLAlchemy costs about 0.3 s of CPU
in a sandbox, a third of a PostgreSQL episode.

Canonical form (what makes two equal states hash equal on either engine):
tables sorted by name; each table as its column names plus its rows sorted by
their JSON text; values normalised by type: integral numbers (int, Decimal,
float) become ints, other numbers floats rounded to 6 places, dates and times
ISO text, bytes hex, booleans stay booleans, everything else ``str``. The hash
is sha256 of that structure as sorted-key JSON.

Bounds: a graded name must be a plain table (``NotATable`` for a view, a
virtual table, or a table with triggers: a view may recurse forever); on
PostgreSQL every statement has a ``statement_timeout``. The host runs the
SQLite dump in a subprocess with a deadline (``db_state``).

Script use: ``python3 db_canon.py REQUEST.json`` prints one JSON line:
``{"tables": {...}, "queries": [{"rows": [...]} | {"error": "..."}]}``.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import sys
from typing import Any


def normalise(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float | decimal.Decimal):
        number = float(value)
        if number == number and number not in (float("inf"), float("-inf")) and number == int(number):
            return int(number)
        return round(number, 6)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def _rows(result: Any) -> list[list[Any]]:
    return [[normalise(v) for v in row] for row in result.fetchall()]


def _table(columns: list[str], result: Any) -> dict[str, Any]:
    """One table's canonical entry: its columns and its rows sorted by their JSON text."""
    return {"columns": columns, "rows": sorted(_rows(result), key=lambda r: json.dumps(r, sort_keys=True))}


class NotATable(Exception):
    """A graded name is a view, a virtual table, or a table with triggers: refused, never queried."""


# What a graded SQLite name must be: a plain table (a view may recurse forever, a virtual table runs
# module code, a trigger runs on writes), checked in sqlite_master before any row is read.
_SQLITE_KIND = "SELECT type, upper(coalesce(sql, '')) FROM sqlite_master WHERE name = :name COLLATE NOCASE"
_SQLITE_TRIGGERS = "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = :name COLLATE NOCASE"


def _check_sqlite_table(conn: Any, text: Any, name: str) -> None:
    for kind, sql in conn.execute(text(_SQLITE_KIND), {"name": name}).fetchall():
        if kind != "table" or sql.lstrip().startswith("CREATE VIRTUAL"):
            raise NotATable(f"graded table {name!r} is a {'virtual table' if kind == 'table' else kind}, not a table")
    triggers = [row[0] for row in conn.execute(text(_SQLITE_TRIGGERS), {"name": name}).fetchall()]
    if triggers:
        raise NotATable(f"graded table {name!r} has triggers {triggers[:5]}")


def _query_error(exc: Exception) -> dict[str, str]:
    """A failed query as a result (the agent dropped a table), not a crash of the dump."""
    return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}


def dump(
    url: str, tables: list[str] | None = None, queries: list[str] | None = None, *, force_sqlalchemy: bool = False
) -> dict[str, Any]:
    """Canonical table contents (``tables`` or all) and the rows of each query, in order."""
    if not force_sqlalchemy and url.startswith("sqlite:///"):
        return _dump_sqlite3(url[len("sqlite:///") :], tables, queries)
    if not force_sqlalchemy and url.split("://", 1)[0] in ("postgresql", "postgresql+psycopg2"):
        try:
            import psycopg2
        except ImportError:
            pass
        else:
            return _dump_psycopg2(psycopg2, url, tables, queries)
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(url)
    try:
        names = sorted(tables) if tables is not None else sorted(inspect(engine).get_table_names())
        quote = engine.dialect.identifier_preparer.quote
        out: dict[str, Any] = {"tables": {}, "queries": []}
        with engine.connect() as conn:
            for name in names:
                if engine.dialect.name == "sqlite":
                    _check_sqlite_table(conn, text, name)
                result = conn.execute(text(f"SELECT * FROM {quote(name)}"))
                out["tables"][name] = _table(list(result.keys()), result)
            for query in queries or []:
                try:
                    out["queries"].append({"rows": _rows(conn.execute(text(query)))})
                except Exception as exc:  # noqa: BLE001 - a broken query is a result (the agent dropped a table)
                    rollback = getattr(conn, "rollback", None)  # SQLAlchemy 1.4's legacy Connection rolls back itself
                    if callable(rollback):
                        rollback()
                    out["queries"].append(_query_error(exc))
        return out
    finally:
        engine.dispose()


# The tables SQLAlchemy's ``inspect(engine).get_table_names()`` lists on SQLite.
_SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite~_%' ESCAPE '~' ORDER BY name"


def _dump_sqlite3(path: str, tables: list[str] | None, queries: list[str] | None) -> dict[str, Any]:
    """``dump`` of a SQLite file through the standard library (no SQLAlchemy import: a third of a
    second per grading); the same values SQLAlchemy's ``text()`` queries return. ``path`` is the host's
    private copy of the agent's file."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        names = sorted(tables) if tables is not None else [row[0] for row in conn.execute(_SQLITE_TABLES)]
        out: dict[str, Any] = {"tables": {}, "queries": []}
        for name in names:
            _check_sqlite_table(conn, str, name)  # plain SQL text: sqlite3 takes :name parameters itself
            cur = conn.execute('SELECT * FROM "%s"' % name.replace('"', '""'))
            out["tables"][name] = _table([d[0] for d in cur.description], cur)
        for query in queries or []:
            try:
                out["queries"].append({"rows": _rows(conn.execute(query))})
            except sqlite3.Error as exc:  # a broken query is a result, worded as SQLAlchemy words it
                name = type(exc).__name__
                out["queries"].append({"error": f"{name}: {f'(sqlite3.{name}) {exc}'.splitlines()[0][:300]}"})
            except Exception as exc:  # noqa: BLE001 - a broken query is a result (the agent dropped a table)
                out["queries"].append(_query_error(exc))
        return out
    finally:
        conn.close()


# What a graded PostgreSQL name must be: an ordinary or partitioned table, with no user trigger.
_PG_KIND = (
    "SELECT c.relkind FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relname = %s"
)
_PG_TRIGGERS = (
    "SELECT t.tgname FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid"
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relname = %s AND NOT t.tgisinternal"
)
PG_STATEMENT_TIMEOUT_MS = 60_000

# The tables SQLAlchemy's ``inspect(engine).get_table_names()`` lists on PostgreSQL >= 10.
_PG_TABLES = (
    "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
)


def _dump_psycopg2(psycopg2: Any, url: str, tables: list[str] | None, queries: list[str] | None) -> dict[str, Any]:
    """``dump`` over a plain psycopg2 connection (no SQLAlchemy import)."""
    from urllib.parse import parse_qs, unquote, urlsplit

    parts = urlsplit(url)
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    kwargs = {
        "dbname": unquote(parts.path.lstrip("/")) or None,
        "user": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else None,
        "host": options.pop("host", None) or parts.hostname,
        "port": parts.port,
        **options,
    }
    conn = psycopg2.connect(**{k: v for k, v in kwargs.items() if v is not None})
    try:
        cur = conn.cursor()
        if tables is None:
            cur.execute(_PG_TABLES)
            tables = [row[0] for row in cur.fetchall()]
        cur.execute(f"SET statement_timeout = {PG_STATEMENT_TIMEOUT_MS}")
        out: dict[str, Any] = {"tables": {}, "queries": []}
        for name in sorted(tables):
            cur.execute(_PG_KIND, (name,))
            kinds = [row[0] for row in cur.fetchall()]
            if any(k not in ("r", "p") for k in kinds):
                raise NotATable(f"graded table {name!r} is not a table (relkind {kinds})")
            cur.execute(_PG_TRIGGERS, (name,))
            triggers = [row[0] for row in cur.fetchall()]
            if triggers:
                raise NotATable(f"graded table {name!r} has triggers {triggers[:5]}")
            cur.execute('SELECT * FROM "%s"' % name.replace('"', '""'))
            out["tables"][name] = _table([d[0] for d in cur.description], cur)
        for query in queries or []:
            try:
                cur.execute(query)
                out["queries"].append({"rows": _rows(cur)})
            except Exception as exc:  # noqa: BLE001 - a broken query is a result (the agent dropped a table)
                conn.rollback()
                cur = conn.cursor()
                out["queries"].append(_query_error(exc))
        return out
    finally:
        conn.close()


def state_hash(tables: dict[str, Any]) -> str:
    blob = json.dumps(tables, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def main(argv: list[str]) -> int:
    request = json.loads(open(argv[1]).read())
    print(json.dumps(dump(request["url"], request.get("tables"), request.get("queries"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
