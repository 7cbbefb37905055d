"""``agentenv tour``: the sandbox tour.

Build the base image if it is missing, start a sandbox, run commands and a test
suite, snapshot, fork three branches, restore, commit a durable snapshot, and
show what each step cost. It was the README's main job until the training run
(``agentenv train examples/quickstart.yaml``, what ``scripts/main.sh`` runs)
learned; it stays as the quickest look at what a sandbox can do.
"""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def register(app: typer.Typer) -> None:
    app.command("tour")(tour)


def tour() -> None:
    """The sandbox tour: snapshot, fork, restore and what each step cost (local Docker daemon)."""
    import docker

    from sandboxes.docker_backend import DockerBackend
    from sandboxes.images import ensure_base_image
    from sandboxes.pool import SandboxPool
    from sandboxes.types import SandboxSpec, SnapshotKind

    timings: list[tuple[str, float, str]] = []

    def step(label: str, fn, show=lambda r: ""):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        with console.status(label):
            result = fn()
        timings.append((label, (time.perf_counter() - t0) * 1000, show(result)))
        return result

    client = docker.from_env(timeout=600)
    image = step("base image (built if missing)", lambda: ensure_base_image(client, log=console.log), str)
    backend = DockerBackend(client)
    pool = SandboxPool(backend, SandboxSpec(image=image), size=4)
    try:
        step("warm pool of 4", lambda: pool.warm(timeout=300))
        sb = step("acquire a sandbox", pool.acquire, lambda s: s.id)
        step("exec: python3 --version", lambda: sb.exec("python3 --version"), lambda r: r.stdout.strip())
        step(
            "write a project + run its test",
            lambda: (
                sb.write_file("/workspace/calc.py", "def add(a, b):\n    return a + b\n"),
                sb.write_file("/workspace/test_calc.py", "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"),
                sb.exec("python3 -m pytest -q", timeout=60),
            )[2],
            lambda r: r.stdout.strip().splitlines()[-1],
        )
        ref = step("snapshot (fast)", lambda: sb.snapshot(SnapshotKind.FAST), lambda r: r.id)
        # A different size from the original, so a .pyc cached in the same second is not reused.
        step("break the code", lambda: sb.write_file("/workspace/calc.py", "def add(a, b):\n    return a - b  # broken on purpose\n"))
        forks = step("fork 3 from the snapshot", lambda: pool.fork(ref, 3), lambda fs: ", ".join(f.id for f in fs))
        fork_codes = step(
            "tests in the 3 forks",
            lambda: [f.exec("python3 -m pytest -q", timeout=60).exit_code for f in forks],
            lambda codes: f"exit codes {codes} (snapshot was green)",
        )
        broken_code = step("tests in the broken original", lambda: sb.exec("python3 -m pytest -q", timeout=60).exit_code,
             lambda code: f"exit code {code}")
        restored = step("restore the snapshot", lambda: pool.restore(ref), lambda s: s.id)
        restored_code = step("tests after restore", lambda: restored.exec("python3 -m pytest -q", timeout=60).exit_code,
             lambda code: f"exit code {code}")
        img = step("durable snapshot (docker commit)", lambda: restored.snapshot(SnapshotKind.IMAGE), lambda r: r.location[:19])
        for s in [sb, restored, *forks]:
            pool.release(s)
        from_image = step("new sandbox from the durable snapshot", lambda: backend.restore(img), lambda s: s.id)
        image_code = step("tests in it", lambda: from_image.exec("python3 -m pytest -q", timeout=60).exit_code,
             lambda code: f"exit code {code}")
        from_image.close()
        step("remove the durable snapshot image", lambda: client.images.remove(img.location, force=True))
    finally:
        pool.close()
        backend.close()
    table = Table(title="AgentENV sandbox tour")
    table.add_column("step")
    table.add_column("ms", justify="right")
    table.add_column("result")
    for label, ms, shown in timings:
        table.add_row(label, f"{ms:.1f}", shown)
    console.print(table)
    # The tour proves something only if each branch kept its own state.
    expected = {"forks green": fork_codes == [0, 0, 0], "original red": broken_code != 0,
                "restore green": restored_code == 0, "durable green": image_code == 0}
    if not all(expected.values()):
        console.print(f"[red]snapshot semantics broken: {expected}[/]")
        raise typer.Exit(1)
