"""``agentenv sandbox``: list, reap and benchmark sandboxes."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Inspect, reap and benchmark sandboxes.", no_args_is_help=True)
console = Console()


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@app.command("ls")
def ls(
    images: bool = typer.Option(False, "--images", help="also list snapshot images"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
) -> None:
    """List every sandbox we started, with its owner and whether the owner is alive."""
    from sandboxes.reaper import list_sandboxes

    records = list_sandboxes(images=images)
    if as_json:
        print(json.dumps([r.__dict__ | {"orphaned": r.orphaned} for r in records], indent=2))
        return
    table = Table(title=f"{len(records)} sandboxes")
    for col in ("id", "kind", "name", "status", "run", "owner", "owner alive", "age"):
        table.add_column(col)
    for r in records:
        alive = {True: "[green]yes[/]", False: "[red]no (orphan)[/]", None: "[yellow]other host[/]"}[r.owner_alive]
        table.add_row(r.id, r.kind, r.name, r.status, r.run_id, r.owner, alive, _age(r.age_s))
    console.print(table)


@app.command("gc")
def gc(
    run_id: str = typer.Option(None, "--run", help="only this run's orphans"),
    images: bool = typer.Option(False, "--images", help="also remove snapshot images of dead owners"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show what would be removed"),
) -> None:
    """Remove sandboxes whose owning process is gone. Live owners' sandboxes are never touched."""
    from sandboxes.reaper import gc as reap

    removed = reap(run_id=run_id, images=images, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for r in removed:
        console.print(f"{verb} {r.kind} {r.id} {r.name} (run {r.run_id}, owner {r.owner})")
    console.print(f"[bold]{verb} {len(removed)}[/]")


@app.command("bench")
def bench(
    quick: bool = typer.Option(False, "--quick", help="fewer repetitions (CI-sized)"),
    json_path: Path = typer.Option(None, "--json", help="write {metric: {ours_ms, baseline_ms, ratio}} here"),
) -> None:
    """Time the sandbox hot paths against the plain docker SDK, in the same run."""
    from sandboxes.bench import run_bench

    with console.status("benchmarking") as status:
        rows = run_bench(quick=quick, json_path=json_path, progress=lambda msg: status.update(msg))
    table = Table(title="sandbox hot paths: ours vs plain docker SDK (ms)")
    for col in ("metric", "ours p50", "ours p95", "base p50", "base p95", "ratio", "target", "n"):
        table.add_column(col, no_wrap=True)
    failed = []
    for name, r in rows.items():
        ratio, target = r["ratio"], r["target"]
        ok = target is None or (ratio is not None and ratio <= target)  # type: ignore[operator]
        if not ok:
            failed.append(name)
        table.add_row(
            name,
            f"{r['ours_ms']:.2f}",
            f"{r['ours_p95_ms']:.2f}",
            "-" if r["baseline_ms"] is None else f"{r['baseline_ms']:.2f}",
            "-" if r["baseline_p95_ms"] is None else f"{r['baseline_p95_ms']:.2f}",
            "-" if ratio is None else f"{'[green]' if ok else '[red]'}{ratio:.3f}[/]",
            "-" if target is None else f"<= {target}",
            str(r["n"]),
        )
    Console(width=max(console.width, 110)).print(table)  # a pipe reports 80 columns: too narrow
    for name, r in rows.items():
        console.print(f"  {name}: {r['note']}")
    if failed:
        console.print(f"[red]missed target: {', '.join(failed)}[/]")
        raise typer.Exit(1)
