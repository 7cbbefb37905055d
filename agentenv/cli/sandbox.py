"""``agentenv sandbox``: list, reap (sandboxes, disk mounts, snapshot blobs) and benchmark sandboxes."""

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


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``12h`` or ``7d``."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    body, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        seconds = float(body) * units[unit]
    except ValueError:
        raise typer.BadParameter(f"expected a duration like 7d, 12h, 30m or 90s, got {text!r}") from None
    if seconds <= 0:
        raise typer.BadParameter(f"expected a duration > 0, got {text!r}")
    return seconds


def _size(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@app.command("gc")
def gc(
    run_id: str = typer.Option(None, "--run", help="only this run's orphans"),
    images: bool = typer.Option(False, "--images", help="also remove snapshot images of dead owners"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show what would be removed"),
    snapshots_max_age: str = typer.Option(
        "7d", "--snapshots-max-age", help="remove FAST-snapshot blobs unused for this long (7d, 12h, 30m, 90s)"
    ),
    snapshots_max_gb: float = typer.Option(
        10.0, "--snapshots-max-gb", help="then remove the least recently used blobs until the rest fit in this"
    ),
    snapshots_dir: Path = typer.Option(None, "--snapshots-dir", help="default: ~/.cache/agentenv/snapshots"),
    keep: list[str] = typer.Option([], "--keep", help="a snapshot blob (digest or path) never to remove; repeatable"),
) -> None:
    """Remove sandboxes whose owning process is gone, their leaked disk mounts, and stale snapshot blobs.

    Live owners' sandboxes are never touched; nor is a blob written or read in the last minute.
    """
    from sandboxes.errors import SandboxError
    from sandboxes.reaper import gc as reap
    from sandboxes.reaper import release_disk_mounts
    from sandboxes.snapshot_gc import gc_snapshots

    max_age_s = _duration(snapshots_max_age)
    if snapshots_max_gb < 0:
        raise typer.BadParameter(f"--snapshots-max-gb: expected >= 0, got {snapshots_max_gb}")
    removed = reap(run_id=run_id, images=images, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for r in removed:
        console.print(f"{verb} {r.kind} {r.id} {r.name} (run {r.run_id}, owner {r.owner})")
    console.print(f"[bold]{verb} {len(removed)}[/]")

    try:
        mounts = release_disk_mounts(dry_run=dry_run)
    except SandboxError as exc:  # not root, say: the rest of gc still runs
        console.print(f"[yellow]disk-limit mounts not checked: {exc}[/]")
        mounts = []
    for m in mounts:
        console.print(f"{'would unmount' if dry_run else 'unmounted'} leaked disk limit {m.mount_point} ({m.fstype})")

    if snapshots_dir is None:
        from sandboxes.docker_snapshots import default_snapshot_dir

        snapshots_dir = default_snapshot_dir()
    report = gc_snapshots(
        snapshots_dir, max_age_s=max_age_s, max_bytes=int(snapshots_max_gb * (1 << 30)), keep=set(keep), dry_run=dry_run
    )
    if report.removed:
        table = Table(title=f"snapshot blobs {verb} from {report.dir}")
        for col in ("blob", "size", "unused for", "why"):
            table.add_column(col, no_wrap=True)
        why = {"tmp": "unfinished write", "age": f"older than {snapshots_max_age}", "size": f"over {snapshots_max_gb:g} GB"}
        for b in report.removed:
            table.add_row(b.name[:16] + ("..." if len(b.name) > 16 else ""), _size(b.size), _age(b.idle_s), why[b.reason])
        Console(width=max(console.width, 90)).print(table)
    for err in report.errors:
        console.print(f"[red]could not remove {err}[/]")
    console.print(
        f"[bold]snapshots: {verb} {len(report.removed)} ({_size(report.freed_bytes)}), "
        f"kept {report.kept_count} ({_size(report.kept_bytes)})[/]"
    )


@app.command("bench")
def bench(
    quick: bool = typer.Option(False, "--quick", help="fewer repetitions (CI-sized)"),
    json_path: Path = typer.Option(None, "--json", help="write {metric: {ours_ms, baseline_ms, ratio}} here"),
) -> None:
    """Time the sandbox hot paths against the plain docker SDK, in the same run."""
    from benches.sandbox import run_bench

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
