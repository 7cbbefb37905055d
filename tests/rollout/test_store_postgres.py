"""TrajectoryStore on a real PostgreSQL server that this module starts and throws away.

The session fixture runs ``initdb`` into a temp dir, starts ``postgres`` on
127.0.0.1 at a free port (as the ``postgres`` system user when the tests run as
root, since PostgreSQL refuses to run as root), creates a database and stops the
server at the end. CI only needs the server binaries (``apt-get install
postgresql``). Missing binaries fail the run; this test never skips.

The dialect-neutral tests of test_store.py are imported and rerun here against
this module's ``store`` fixture.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from rollout.store import Base, SampleRow, TrajectoryStore

# pytest puts this folder on sys.path (rootdir-relative "prepend" import mode, no __init__.py).
from test_store import (  # noqa: F401  - collected here with this module's ``store``
    make,
    test_export_loads_with_datasets,
    test_groups_are_complete_per_task_and_seed,
    test_metrics_split_by_harness,
    test_put_is_idempotent_by_episode_id,
    test_query_filters,
    test_round_trip_every_field_bit_exact,
    test_two_writers_racing_on_the_same_ids_store_each_once,
)

pytestmark = pytest.mark.slow

_INSTALL_HINT = "install the PostgreSQL server binaries: apt-get install postgresql (or set AGENTENV_PG_BIN)"


def _pg_bin() -> Path:
    """The folder holding initdb and pg_ctl: $AGENTENV_PG_BIN, the newest Debian layout, or $PATH."""
    candidates = [os.environ.get("AGENTENV_PG_BIN", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    found = shutil.which("initdb")
    candidates.append(str(Path(found).parent) if found else "")
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    pytest.fail(f"PostgreSQL server binaries (initdb, pg_ctl) not found; {_INSTALL_HINT}", pytrace=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    try:
        import psycopg
    except ImportError:
        pytest.fail("psycopg is missing: pip install 'psycopg[binary]>=3.1'", pytrace=False)
    bindir = _pg_bin()
    base = Path(tempfile.mkdtemp(prefix="agentenv-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root and no 'postgres' system user to run the server as; " + _INSTALL_HINT)
        os.chown(base, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = base / "data", _free_port()

    def run(*args: str) -> None:
        proc = subprocess.run([*as_user, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            log = (base / "server.log").read_text() if (base / "server.log").exists() else ""
            pytest.fail(f"{' '.join(args[:2])} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}{log}")

    run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
    # A throwaway server: durability off, sockets only on loopback and in our own dir.
    options = f"-h 127.0.0.1 -p {port} -k {base} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-o", options, "-w", "-t", "60",
        "start")
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE agentenv_test")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/agentenv_test"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def store(pg_url: str) -> Iterator[TrajectoryStore]:
    s = TrajectoryStore(pg_url)
    yield s
    Base.metadata.drop_all(s.engine)  # every test starts from empty tables
    s.close()


def test_workers_opening_a_fresh_database_at_once(pg_url: str) -> None:
    first = TrajectoryStore(pg_url)
    Base.metadata.drop_all(first.engine)
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            TrajectoryStore(pg_url).close()
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert errors == []
    assert first.put(make("after-race"))
    Base.metadata.drop_all(first.engine)
    first.close()


def test_postgres_dialect_and_compact_arrays(store: TrajectoryStore) -> None:
    assert store.engine.dialect.name == "postgresql"
    store.put(make("e", n_samples=1))
    with store.engine.connect() as conn:
        lengths = conn.execute(
            select(func.octet_length(SampleRow.token_ids), func.octet_length(SampleRow.logprobs),
                   func.octet_length(SampleRow.loss_mask))
        ).one()
    assert tuple(lengths) == (5 * 4, 5 * 4, 5)  # int32, float32, uint8 per token
