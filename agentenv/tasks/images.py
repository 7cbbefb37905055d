"""Images of the built-in suite that the base image does not cover.

The PostgreSQL tasks need a database *server* inside the sandbox. There is no
registry and ``docker build`` may not reach an apt mirror, so the image is a
``RootfsRecipe`` bootstrapped offline from the host's mirror, exactly like the
base image, with Debian's ``postgresql`` plus ``python3-sqlalchemy`` and
``python3-psycopg2`` (the grading script runs inside the sandbox, because the
network is off and the server only listens on a unix socket).

The image also carries ``agentenv-pg-start``: it starts the server of the
cluster owned by the sandbox user, initialised when the image is built (in
``/home/agent/pgdata``, 1 MB WAL segments), so a task's set-up state differs
from the image by its own database only: the FAST snapshot a rollout applies
to every episode of a variant is a few MB, not the whole 48 MB cluster (the
script still initialises one on first use where the directory is missing,
for another user or ``PGDATA``); it is
idempotent, and it cleans the stale ``postmaster.pid`` a file snapshot leaves
behind (snapshots capture files, never processes, so a grading sandbox restored
from a snapshot must start the server again).

Tasks name the image as ``agentenv-postgres:latest`` in ``environment.image``;
``ensure_named_image`` builds it (cached by recipe hash) when it is missing.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import docker

from sandboxes.images import RootfsRecipe, build_rootfs_image, ensure_base_image

POSTGRES_REPOSITORY = "agentenv-postgres"
POSTGRES_IMAGE = f"{POSTGRES_REPOSITORY}:latest"
PG_SOCKET_DIR = "/tmp"
PG_URL_TEMPLATE = "postgresql+psycopg2://agent@/{db}?host=" + PG_SOCKET_DIR

_PG_START = r"""#!/bin/sh
# agentenv-pg-start: start a PostgreSQL server owned by the calling user (idempotent).
# Data in $PGDATA (default /home/agent/pgdata); unix socket in /tmp; no TCP listener.
set -e
PGDATA="${PGDATA:-/home/agent/pgdata}"
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
if "$BIN/pg_isready" -q -h /tmp; then exit 0; fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  "$BIN/initdb" -D "$PGDATA" -U "$(id -un)" --auth=trust -E UTF8 --locale=C.UTF-8 --wal-segsize=1 >/dev/null
fi
chmod 700 "$PGDATA"
rm -f "$PGDATA/postmaster.pid" /tmp/.s.PGSQL.5432 /tmp/.s.PGSQL.5432.lock
"$BIN/pg_ctl" -D "$PGDATA" -w -t 60 -l /tmp/postgres.log \
  -o "-c listen_addresses='' -k /tmp -c fsync=off -c full_page_writes=off" start >/dev/null
"""


def postgres_recipe() -> RootfsRecipe:
    """The base recipe plus a PostgreSQL server and the in-sandbox grading libraries."""
    base = RootfsRecipe()
    script = base64.b64encode(_PG_START.encode()).decode()
    return base.model_copy(
        update={
            "repository": POSTGRES_REPOSITORY,
            "packages": (*base.packages, "postgresql", "python3-sqlalchemy", "python3-psycopg2"),
            "setup": (
                *base.setup,
                f"echo {script} | base64 -d > /usr/local/bin/agentenv-pg-start",
                "chmod 755 /usr/local/bin/agentenv-pg-start",
                # the sandbox user's cluster, initialised once here instead of in every task's setup
                "setpriv --reuid=1000 --regid=1000 --clear-groups env HOME=/home/agent USER=agent"
                " /bin/sh -c 'cd /home/agent && BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
                " && \"$BIN/initdb\" -D /home/agent/pgdata -U agent --auth=trust -E UTF8 --locale=C.UTF-8"
                " --wal-segsize=1 >/dev/null'",
                # the packaged cluster is never used; the agent runs its own
                "rm -rf /var/lib/postgresql/*/main /etc/postgresql/*/main",
            ),
        }
    )


# name (repository) -> recipe; ``environment.image: <name>:latest`` resolves through this
NAMED_RECIPES: dict[str, Callable[[], RootfsRecipe]] = {POSTGRES_REPOSITORY: postgres_recipe}


def ensure_named_image(
    client: docker.DockerClient, ref: str, *, log: Callable[[str], None] = lambda _m: None
) -> str:
    """Return a runnable tag for ``ref``, building a suite recipe if ``ref`` names one.

    ``ref`` not naming a suite recipe is returned unchanged (the base image, or
    an image the caller built some other way).
    """
    repository = ref.split(":", 1)[0]
    recipe = NAMED_RECIPES.get(repository)
    if recipe is None:
        return ref
    ensure_base_image(client, log=log)
    return build_rootfs_image(client, recipe(), log=log)


__all__ = ["NAMED_RECIPES", "PG_URL_TEMPLATE", "POSTGRES_IMAGE", "ensure_named_image", "postgres_recipe"]
