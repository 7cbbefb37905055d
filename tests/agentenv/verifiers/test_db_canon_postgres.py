"""db_canon inside a PostgreSQL sandbox: the psycopg2 path dumps exactly what the SQLAlchemy path dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentenv.registry import get_task
from agentenv.verifiers import db_canon

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SCRIPT = """
import json, sys
sys.path.insert(0, "/tmp/canon")
import db_canon
url = "postgresql+psycopg2://agent@/shop?host=/tmp"
queries = ["SELECT COUNT(*) FROM items WHERE stock < 5", "SELECT price, name FROM items ORDER BY id LIMIT 3",
           "SELECT * FROM no_such_table", "SELECT 1.5::float8, NULL, true, now()::date - now()::date"]
fast = db_canon.dump(url, None, queries)
fast_imported_sqlalchemy = "sqlalchemy" in sys.modules
slow = db_canon.dump(url, None, queries, force_sqlalchemy=True)
print(json.dumps({"fast": fast, "slow": slow, "fast_imported_sqlalchemy": fast_imported_sqlalchemy}))
"""


def test_psycopg2_dump_equals_the_sqlalchemy_dump(docker_client, base_image) -> None:  # noqa: ANN001
    from sandboxes.docker_backend import DockerBackend

    task = get_task("agent/postgres_orders")
    with DockerBackend(docker_client) as backend:
        sandbox = backend.create(task.sandbox_spec())
        task.setup(sandbox, task.variant(0))
        sandbox.write_file("/tmp/canon/db_canon.py", Path(db_canon.__file__).read_bytes())
        res = sandbox.exec(["python3", "-I", "-c", SCRIPT], timeout=120)
        assert res.ok, res.stderr
        out = json.loads(res.stdout)
    fast, slow = out["fast"], out["slow"]
    assert not out["fast_imported_sqlalchemy"]
    assert sorted(fast["tables"]) == ["customers", "items", "orders"] and len(fast["tables"]["orders"]["rows"]) == 50
    assert fast["tables"] == slow["tables"]
    assert db_canon.state_hash(fast["tables"]) == db_canon.state_hash(slow["tables"])
    ok = [q for q in fast["queries"] if "rows" in q]
    assert ok == [q for q in slow["queries"] if "rows" in q] and len(ok) == 3
    assert "no_such_table" in fast["queries"][2]["error"] and "error" in slow["queries"][2]


HOSTILE = """
import json, sys, subprocess
sys.path.insert(0, "/tmp/canon")
import db_canon
url = "postgresql+psycopg2://agent@/shop?host=/tmp"
out = {}
for name, sql in [
    ("view", "ALTER TABLE items RENAME TO items_real; CREATE VIEW items AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n AS id FROM r;"),
    ("trigger", "CREATE FUNCTION f() RETURNS trigger AS $$ BEGIN RETURN NULL; END $$ LANGUAGE plpgsql; CREATE TRIGGER t BEFORE INSERT ON customers FOR EACH ROW EXECUTE FUNCTION f();"),
]:
    subprocess.run(["psql", "-h", "/tmp", "-U", "agent", "shop", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True, capture_output=True)
    graded = ["items"] if name == "view" else ["customers"]
    try:
        db_canon.dump(url, graded, [])
        out[name] = "dumped"
    except db_canon.NotATable as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def test_a_view_or_a_trigger_in_place_of_a_graded_table_is_refused(docker_client, base_image) -> None:  # noqa: ANN001
    from sandboxes.docker_backend import DockerBackend

    task = get_task("agent/postgres_orders")
    with DockerBackend(docker_client) as backend:
        sandbox = backend.create(task.sandbox_spec())
        task.setup(sandbox, task.variant(0))
        sandbox.write_file("/tmp/canon/db_canon.py", Path(db_canon.__file__).read_bytes())
        res = sandbox.exec(["python3", "-I", "-c", HOSTILE], timeout=120)
        assert res.ok, res.stderr
        out = json.loads(res.stdout)
    assert "is not a table" in out["view"], out
    assert "has triggers" in out["trigger"], out
