"""``agentenv list | new | check | debug``: the task author's commands.

``register(app)`` adds them to the root app (the lead's ``agentenv.cli``).
Heavy imports (Docker, gymnasium, verifiers) happen inside the commands so
``agentenv --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

console = Console(highlight=False)


def _backend(name: str) -> Any:
    from agentenv.env import resolve_backend

    return resolve_backend(name)[0]


def list_cmd(domain: str = typer.Option(None, "--domain", help="general | agent | coding")) -> None:
    """List registered tasks (built-in and from installed packages)."""
    from agentenv.registry import default_registry

    reg = default_registry()
    table = Table("id", "domain", "source")
    for task_id in reg.ids(domain):
        entry = reg.entry(task_id)
        table.add_row(task_id, entry.domain.value if entry.domain else "", entry.source)
    console.print(table)
    for source, exc in reg.errors.items():
        console.print(f"[red]broken:[/red] {source}: {exc}", markup=True)


def new_cmd(
    name: str = typer.Argument(..., help="folder and task id, e.g. my_task"),
    domain: str = typer.Option("coding", "--domain", help="general | agent | coding"),
    dir: Path = typer.Option(Path("."), "--dir", help="where to create the folder"),
) -> None:
    """Create a working task folder, with comments, that passes `agentenv check`."""
    from agentenv.scaffold import scaffold

    try:
        folder = scaffold(name, domain, dir)
    except (ValueError, FileExistsError) as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        raise typer.Exit(2) from exc
    console.print(f"created {folder}", markup=False)
    console.print(f"next: edit {folder}/task.yaml and its files, then run: agentenv check {folder}", markup=False)


def check_cmd(
    targets: list[str] = typer.Argument(None, help="task folders or ids"),
    all_: bool = typer.Option(False, "--all", help="check every registered task"),
    json_path: Path = typer.Option(None, "--json", help="also write the reports as JSON here"),
    seeds: int = typer.Option(3, "--seeds", min=1, help="seeds the oracle must pass"),
    backend: str = typer.Option("docker", "--backend", help="docker | local"),
) -> None:
    """Prove tasks: image builds, oracle earns full reward, do-nothing earns zero, tests stay hidden,
    variants are deterministic. Exits non-zero if any check fails."""
    from agentenv.check import check_task, failed_load, load_for_check
    from agentenv.registry import default_registry

    from sandboxes.backends import BACKENDS

    if backend not in BACKENDS:
        console.print(f"error: --backend: expected one of {'|'.join(BACKENDS)}, got {backend!r}", style="red", markup=False)
        raise typer.Exit(2)
    names = list(targets or [])
    reports = []
    if all_:
        reg = default_registry()
        names += reg.ids()
        reports += [failed_load(Path(src).name, src, exc) for src, exc in reg.errors.items()]
    if not names and not reports:
        console.print("error: give a task folder or id, or --all", style="red", markup=False)
        raise typer.Exit(2)
    sandbox_backend = _backend(backend)
    try:
        for name in names:
            task, failed = load_for_check(name)
            if failed is not None:
                reports.append(failed)
            else:
                assert task is not None
                with console.status(f"checking {task.id} ..."):
                    reports.append(check_task(task, sandbox_backend, seeds=seeds, source=name))
            _print_report(reports[-1])
    finally:
        sandbox_backend.close()
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps([r.to_dict() for r in reports], indent=2))
    bad = [r.task_id for r in reports if not r.passed]
    if bad:
        console.print(f"FAIL: {len(bad)} of {len(reports)} tasks: {', '.join(bad)}", style="bold red", markup=False)
        raise typer.Exit(1)
    console.print(f"PASS: {len(reports)} task(s)", style="bold green", markup=False)


def _print_report(report: Any) -> None:
    table = Table(title=f"{report.task_id}  ({report.source})", title_justify="left")
    table.add_column("check")
    table.add_column("verdict")
    table.add_column("time", justify="right")
    table.add_column("detail", overflow="fold")
    for v in report.verdicts:
        verdict = "[yellow]SKIP[/yellow]" if v.skipped else ("[green]PASS[/green]" if v.passed else "[red]FAIL[/red]")
        table.add_row(v.name, verdict, f"{v.duration_s:.1f}s", v.detail.replace("[", "\\["))
    console.print(table)


def debug_cmd(
    task_id: str = typer.Argument(..., help="task folder or id"),
    seed: int = typer.Option(0, "--seed", help="variant seed"),
    backend: str = typer.Option("docker", "--backend", help="docker | local"),
) -> None:
    """A shell in one sandbox of the task, with :verify, :oracle, :snapshot, :restore, :diff, :reset."""
    from agentenv.debug import DebugSession, run_repl
    from agentenv.errors import AgentEnvError
    from agentenv.registry import get_task

    try:
        task = get_task(task_id)
    except AgentEnvError as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        raise typer.Exit(2) from exc
    sandbox_backend = _backend(backend)
    try:
        with console.status("starting the sandbox and running setup ..."):
            session = DebugSession(task, sandbox_backend, seed, console)
        run_repl(session)
    finally:
        sandbox_backend.close()


def register(app: typer.Typer) -> None:
    """Add ``list``, ``new``, ``check`` and ``debug`` to ``app``."""
    app.command("list")(list_cmd)
    app.command("new")(new_cmd)
    app.command("check")(check_cmd)
    app.command("debug")(debug_cmd)


__all__ = ["register"]
