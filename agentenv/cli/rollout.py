"""``agentenv rollout CONFIG`` (a run on embedded Ray, with a progress bar) and ``agentenv rollout bench``.

``rollout CONFIG`` is shorthand for ``rollout run CONFIG``: the group routes any
first argument that is not a subcommand to ``run``, so a config path and the
``bench`` subcommand share one command name without ambiguity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

console = Console()


class _DefaultToRun(TyperGroup):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer vendors its own click Context
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


rollout_app = typer.Typer(
    cls=_DefaultToRun,
    help="Run episodes on Ray and store trajectories: `agentenv rollout CONFIG`, `agentenv rollout bench`.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(rollout_app, name="rollout")


@rollout_app.command("run")
def run(
    config: Path = typer.Argument(..., help="rollout config YAML (docs/rollout.md)", exists=True, dir_okay=False),
    store: str | None = typer.Option(None, help="override the config's store URL"),
    run_id: str | None = typer.Option(None, "--run-id", help="override the config's run_id"),
) -> None:
    """Run CONFIG on an embedded Ray (or RAY_ADDRESS / ray.address) and store every episode once."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rollout.config import ConfigError, load_config
    from rollout.job import run_rollout

    try:
        cfg = load_config(config, store=store, run_id=run_id)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    counts: dict[str, int] = {}
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}"), console=console,
    ) as progress:
        bar = progress.add_task(cfg.run_id, total=None, detail="starting Ray")

        def on_start(scheduler: Any) -> None:
            r = scheduler.report
            progress.update(bar, total=r.planned, completed=r.skipped, detail="")

        def on_event(event: str, _req: Any, traj: Any) -> None:
            counts[event] = counts.get(event, 0) + 1
            if event in ("stored", "drop"):
                progress.advance(bar)
            if traj is not None and event == "stored":
                counts[traj.status.value] = counts.get(traj.status.value, 0) + 1
            shown = ("ok", "sandbox_lost", "policy_error", "invalid", "retry", "rerun", "resume", "drop")
            progress.update(bar, detail=" ".join(f"{k}={counts[k]}" for k in shown if counts.get(k)))

        try:
            report = run_rollout(cfg, on_event=on_event, on_start=on_start)
        except ConfigError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
    table = Table(title=f"rollout {cfg.run_id} -> {cfg.store}")
    table.add_column("planned", justify="right")
    for col in ("stored", "ok", "failed", "retried", "rerun", "resumed", "dropped", "skipped", "restarts"):
        table.add_column(col, justify="right")
    r = report
    table.add_row(*map(str, (r.planned, r.stored, r.ok, r.failed, r.retried, r.rerun, r.resumed, r.dropped,
                             r.skipped, r.worker_restarts)))
    console.print(table)
    console.print(f"{r.elapsed_s:.1f}s, {r.stored / max(r.elapsed_s, 1e-9):.2f} episodes/s; statuses {r.by_status}")
    if not r.accounted:
        console.print("[red]not every planned episode is accounted for[/red]")
        raise typer.Exit(1)


@rollout_app.command("bench")
def bench(
    json_path: Path | None = typer.Option(None, "--json", help="also write the results as JSON here"),
    workers: int = typer.Option(2, help="Ray workers"),
    concurrency: int = typer.Option(2, help="episodes in flight per worker"),
    group_size: int = typer.Option(8, "--group-size", "-G", help="episodes per task: one GRPO group (and per baseline pass)"),
    pool_size: int = typer.Option(0, "--pool-size", help="spare sandboxes per image per worker beyond the warmed ones"),
) -> None:
    """Episodes/s and tool calls/s, Ray workers x concurrency vs the sequential plain-docker baseline."""
    from benches.rollout import run_bench

    result = run_bench(
        workers=workers, concurrency=concurrency, group_size=group_size, pool_size=pool_size, log=console.log
    )
    table = Table(title=f"rollout bench: {result['tasks']} built-in tasks x {group_size}, scripted oracle policy")
    for col in ("runner", "episodes", "wall s", "episodes/s", "tool calls/s", "ok", "CPU s/episode", "busy cores"):
        table.add_column(col, justify="right" if col != "runner" else "left")
    for name in ("baseline", "ray"):
        m = result[name]
        table.add_row(m["label"], str(m["episodes"]), f"{m['wall_s']:.1f}", f"{m['episodes_per_s']:.2f}",
                      f"{m['tool_calls_per_s']:.2f}", str(m["ok"]), f"{m['cpu_s_per_episode']:.2f}",
                      f"{m['busy_cores']:.2f}")
    console.print(table)
    split = Table(title="where the time goes, per episode (ray run; seconds, mean)")
    for col in ("policy", "sandbox", "verifier", "store", "other", "total"):
        split.add_column(col, justify="right")
    s = result["split"]
    split.add_row(*(f"{s[k]:.3f}" for k in ("policy_s", "sandbox_s", "verifier_s", "store_s", "other_s", "total_s")))
    console.print(split)
    console.print(
        f"ratio (episodes/s, ray / baseline): [bold]{result['ratio']:.2f}x[/bold] (target >= {result['target']}x); "
        f"start-up (Ray workers, warm pools) {result['ray']['startup_s']:.1f}s is paid once per run and not in wall s; "
        f"counting it: {result['ratio_with_startup']:.2f}x"
    )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2, sort_keys=True))
        console.print(f"wrote {json_path}")
