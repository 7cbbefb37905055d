"""``agentenv teachers budgets`` and ``agentenv teachers train``: effort budgets and the expert grid.

``budgets CHECKPOINT --task ID ... --out FILE`` samples the cold-start model's
episodes of each task in real sandboxes and writes b0 per task
(``teachers/budgets.py``). ``train TEACHERS.yaml`` runs the expert recipe
(``teachers/train.py``): one shared warm start, the budgets, then one expert
per domain x effort cell, and a ``grid.yaml`` that ``teachers.grid`` loads.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()
app = typer.Typer(help="The teacher grid: effort budgets, the domain x effort experts.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="teachers")


@app.command("budgets")
def budgets(
    checkpoint: Path = typer.Argument(..., help="the cold-start model (a local HF checkpoint folder)", exists=True, file_okay=False),
    task: list[str] = typer.Option(..., "--task", help="a task id (repeat for more)"),
    out: Path = typer.Option(..., "--out", help="the budgets file to write (JSON)"),
    seeds: int = typer.Option(12, help="episodes per task (training seeds 0..N-1)"),
    harness: list[str] = typer.Option(["claude_code", "codex", "kimi_code"], "--harness", help="rotated harnesses"),
    effort: list[str] = typer.Option(["low", "high", "max"], "--effort", help="rotated effort levels"),
    effort_message: bool = typer.Option(True, "--effort-message/--no-effort-message",
                                        help="show the effort message (off for a model trained without it)"),
    temperature: float = typer.Option(1.0, help="sampling temperature (the training temperature)"),
    max_new_tokens: int = typer.Option(96, help="per-turn token cap"),
    backend: str = typer.Option("docker", help="sandbox backend: docker or local"),
    store: str | None = typer.Option(None, help="trajectory store URL (default: the project's SQLite file)"),
    seed: int = typer.Option(0, help="sampling seed"),
) -> None:
    """Measure b0 per task on the cold-start model: the median sampled tokens of its episodes."""
    from agentenv.errors import AgentEnvError
    from rollout.config import ConfigError
    from teachers.budgets import describe, measure_checkpoint
    from teachers.types import TeacherError

    try:
        result = measure_checkpoint(checkpoint, task, out=out, seeds=range(seeds), harnesses=harness, efforts=effort,
                                    show_effort=effort_message, temperature=temperature, max_new_tokens=max_new_tokens,
                                    backend=backend, store=store, seed=seed)
    except (TeacherError, ConfigError, AgentEnvError, FileNotFoundError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    table = Table(title=f"budgets b0 (median sampled tokens per episode) -> {out}")
    for col in ("task", "b0", "n", "p25", "p75", "pass rate", "median by effort"):
        table.add_column(col)
    for row in describe(result):
        by_effort = ", ".join(f"{k} {v:.0f}" for k, v in row.get("by_effort", {}).items())
        table.add_row(row["task"], str(row["b0"]), str(row.get("n", "")), f"{row.get('p25', 0):.0f}",
                      f"{row.get('p75', 0):.0f}", f"{row.get('pass_rate', 0):.2f}", by_effort)
    console.print(table)


@app.command("train")
def train(
    config: Path = typer.Argument(..., help="teachers config YAML (examples/teachers.yaml)", exists=True, dir_okay=False),
    json_path: Path | None = typer.Option(None, "--json", help="also write the summary here"),
) -> None:
    """Train one expert per domain x effort cell from one shared warm start; write their grid.yaml."""
    from agentenv.cli.train import phase_progress

    from rollout.config import ConfigError
    from teachers.train import TeacherTrainConfig, train_teachers
    from teachers.types import TeacherError

    try:
        cfg = TeacherTrainConfig.load(config)
    except (TeacherError, ConfigError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    with phase_progress() as reporter:
        try:
            summary = train_teachers(cfg, reporter=reporter, json_path=json_path)
        except (TeacherError, ConfigError) as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from None
    table = Table(title=f"agentenv teachers train: {summary['name']} (held-out pass rate, median sampled tokens)")
    for col in ("cell", "shared init", "after cell SFT", "expert", "gain", "tokens init -> expert"):
        table.add_column(col)
    for row in summary["cells"]:
        table.add_row(row["cell"], f"{row['init']['pass_rate']:.2f}", f"{row['after_sft']['pass_rate']:.2f}",
                      f"{row['expert']['pass_rate']:.2f}", f"{row['gain_points']:+.1f}",
                      f"{row['init']['median_tokens']:.0f} -> {row['expert']['median_tokens']:.0f}")
    console.print(table)
    console.print(f"grid: {summary['grid']}\nbudgets: {summary['budgets_file']}")
