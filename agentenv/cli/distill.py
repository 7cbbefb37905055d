"""``agentenv distill CONFIG [--json PATH]``: MOPD, the student distilled from the domain x effort teachers.

The work is ``distill.loop.run_distill`` (the training engine with the teachers'
per-token advantage); this adds the progress display (one bar per phase, a
MOPD line per learner step) and, at the end, the pass rates and a table of the
last step's per-cell numbers.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def register(app: typer.Typer) -> None:
    app.command("distill")(distill)


def distill(
    config: Path = typer.Argument(..., help="distill config YAML (examples/distill.yaml)", exists=True, dir_okay=False),
    json_path: Path | None = typer.Option(None, "--json", help="write the run summary (pass rates, MOPD metrics) here"),
    store: str | None = typer.Option(None, help="override the config's store URL"),
    run_id: str | None = typer.Option(None, "--run-id", help="override the config's run_id"),
    seed: int | None = typer.Option(None, help="override the run's seed (model init, seed draws, sampling)"),
    resume: bool = typer.Option(False, "--resume", help="continue this config's killed run from its newest checkpoint"),
) -> None:
    """Distil the teacher grid into one student on-policy (MOPD), evaluated on held-out variants."""
    from agentenv.cli.train import pass_rate_table, phase_progress
    from distill.loop import run_distill
    from distill.types import load_distill_config
    from learner.errors import CheckpointError
    from rollout.config import ConfigError
    from teachers.types import TeacherConfigError

    try:
        cfg, root = load_distill_config(config, store=store, run_id=run_id, seed=seed)
    except ConfigError as exc:
        console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from None
    with phase_progress() as reporter:
        try:
            summary = run_distill(cfg, root, json_path=json_path, reporter=reporter, resume=resume)
        except (ConfigError, TeacherConfigError, CheckpointError) as exc:
            console.print(str(exc), style="red", markup=False)
            raise typer.Exit(2) from None
    console.print(pass_rate_table(summary, "agentenv distill", "after MOPD"))
    steps = summary["distill"]["steps"]
    if steps:
        last_step = steps[-1]
        cells = sorted({k.split("/cell=")[1] for k in last_step if "/cell=" in k})
        cell_table = Table(title="last MOPD step, per cell")
        for col in ("cell", "tokens", "KL(student||teacher)", "advantage mean", "std", "clipped", "clamped"):
            cell_table.add_column(col)
        for c in cells:
            s = f"/cell={c}"
            cell_table.add_row(c, f"{last_step['mopd/tokens' + s]:.0f}", f"{last_step['mopd/kl' + s]:.3f}",
                               f"{last_step['mopd/adv_mean' + s]:+.3f}", f"{last_step['mopd/adv_std' + s]:.3f}",
                               f"{100 * last_step['mopd/clip_frac' + s]:.1f}%", f"{last_step['mopd/clamped' + s]:.0f}")
        console.print(cell_table)
    console.print(f"curve: {summary['learning_curve_png']}\nreport: {summary['report_md']}")
