"""``agentenv train CONFIG [--json PATH]``: the main job (warm start, RL, held-out evaluation).

The work is ``learner.job.run_training``; this adds the progress display: one
bar per phase (oracle episodes, SFT steps, each RL iteration's rollouts, each
evaluation) and a log line per step, then a table of the two pass rates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from agentenv.progress import console, phase_progress


def register(app: typer.Typer) -> None:
    app.command("train")(train)


def pass_rate_table(summary: dict[str, Any], title: str, after: str) -> Table:
    """Held-out pass rates before and after training, overall and by harness / effort."""
    table = Table(title=f"{title}: {summary['run_id']} (held-out, {summary['after_rl']['n']} episodes)")
    for col in ("split", "after warm start", after):
        table.add_column(col)
    table.add_row("all", f"{summary['pass_rate_after_warm_start']:.2f}", f"{summary['pass_rate_after_rl']:.2f}")
    for kind in ("by_harness", "by_effort"):
        first, last = summary["after_warm_start"][kind], summary["after_rl"][kind]
        for k in sorted(set(first) | set(last)):
            table.add_row(f"{kind[3:]}={k}", f"{first.get(k, 0):.2f}", f"{last.get(k, 0):.2f}")
    return table


def train(
    config: Path = typer.Argument(..., help="training config YAML (examples/quickstart.yaml)", exists=True, dir_okay=False),
    json_path: Path | None = typer.Option(None, "--json", help="write the run summary (both pass rates, splits) here"),
    store: str | None = typer.Option(None, help="override the config's store URL"),
    run_id: str | None = typer.Option(None, "--run-id", help="override the config's run_id"),
    seed: int | None = typer.Option(None, help="override the run's seed (model init, seed draws, sampling)"),
    resume: bool = typer.Option(False, "--resume", help="continue this config's killed run from its newest checkpoint"),
) -> None:
    """Warm-start on oracle episodes, then RL in Docker sandboxes, evaluated on held-out variants."""
    from learner.errors import CheckpointError, DistributedError
    from learner.job import run_training
    from learner.train_config import load_train_config
    from rollout.config import ConfigError

    try:
        cfg = load_train_config(config, store=store, run_id=run_id, seed=seed)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    with phase_progress() as reporter:
        try:
            summary = run_training(cfg, json_path=json_path, reporter=reporter, resume=resume)
        except CheckpointError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
        except DistributedError as exc:  # a rank of the sharded learner died: --resume continues
            console.print(f"[red]{exc}[/red]\n(continue with --resume from the last checkpoint)")
            raise typer.Exit(3) from None
    console.print(pass_rate_table(summary, "agentenv train", "after RL"))
    console.print(f"curve: {summary['learning_curve_png']}\nreport: {summary['report_md']}")
