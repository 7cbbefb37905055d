"""``agentenv eval SWEEP.yaml`` (a sweep on Ray, resumable) and ``agentenv eval compare A B``.

``eval SWEEP.yaml`` is shorthand for ``eval run SWEEP.yaml``: a first argument that
is not a subcommand goes to ``run``, so a sweep path and ``compare`` share the name.
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
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


eval_app = typer.Typer(
    cls=_DefaultToRun,
    help="Evaluation sweeps: `agentenv eval SWEEP.yaml [--resume]`, `agentenv eval compare A B` (docs/eval.md).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")


@eval_app.command("run")
def run(
    sweep: Path = typer.Argument(..., help="sweep YAML (docs/eval.md)", exists=True, dir_okay=False),
    out: Path | None = typer.Option(None, "--out", help="output folder (default runs/eval/<sweep_id>)"),
    json_path: Path | None = typer.Option(None, "--json", help="also write results.json here"),
    resume: bool = typer.Option(False, "--resume", help="continue the sweep: run only the cells not stored yet"),
    store: str | None = typer.Option(None, help="override the sweep's store URL"),
) -> None:
    """Run every cell of SWEEP on Ray (embedded, or RAY_ADDRESS), store each once, write the results."""
    from rollout.eval.__main__ import main

    argv = [str(sweep)] + (["--out", str(out)] if out else []) + (["--json", str(json_path)] if json_path else [])
    argv += (["--resume"] if resume else []) + (["--store", store] if store else [])
    code = main(argv)
    if code:
        raise typer.Exit(code)


def _side(spec: str, run_dir: Path | None) -> tuple[str, list[Any]]:
    """``A`` is a policy name (with --run), an output folder holding one policy, or ``FOLDER:POLICY``."""
    from rollout.eval.report import load_results
    from rollout.eval.types import SweepConfigError

    if run_dir is not None:
        folder, policy = run_dir, spec
    elif ":" in spec and not Path(spec).exists():
        folder_s, policy = spec.rsplit(":", 1)
        folder = Path(folder_s)
    else:
        folder, policy = Path(spec), ""
    results = load_results(folder)
    names = sorted({r.policy for r in results})
    if not policy:
        if len(names) != 1:
            raise SweepConfigError(f"{spec}: this sweep has policies {names}; name one as {spec}:POLICY or use --run")
        policy = names[0]
    if policy not in names:
        raise SweepConfigError(f"{spec}: no policy {policy!r} in {folder}; it has {names}")
    return f"{folder.name}:{policy}" if run_dir is None else policy, [r for r in results if r.policy == policy]


@eval_app.command("compare")
def compare_cmd(
    a: str = typer.Argument(..., help="A: a policy name (with --run), an output folder, or FOLDER:POLICY"),
    b: str = typer.Argument(..., help="B: like A"),
    run_dir: Path | None = typer.Option(None, "--run", help="one sweep's output folder holding both policies"),
    json_path: Path | None = typer.Option(None, "--json", help="also write the comparison as JSON here"),
    resamples: int = typer.Option(2000, help="paired bootstrap resamples (seed 0)"),
) -> None:
    """Paired comparison of A and B on the cells both scored: B - A with a paired bootstrap CI, McNemar's p,
    and how many more pairs would separate them at the observed effect."""
    from rollout.eval.stats import compare
    from rollout.eval.types import SweepConfigError

    try:
        name_a, ra = _side(a, run_dir)
        name_b, rb = _side(b, run_dir)
        c = compare(ra, rb, names=(name_a, name_b), resamples=resamples)
    except SweepConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    t = Table(title=f"{c.b} - {c.a} on {c.pairs} paired cells (same task, seed, harness, effort, sample)")
    for col in ("A rate", "B rate", "B - A", "95% CI (paired bootstrap)", "A only", "B only", "McNemar p", "pairs needed",
                "more needed"):
        t.add_column(col, justify="right")
    fmt = lambda x: "inf" if x == float("inf") else f"{x:.0f}"  # noqa: E731
    t.add_row(f"{c.a_rate:.3f}", f"{c.b_rate:.3f}", f"{c.diff:+.3f}", f"[{c.ci_low:+.3f}, {c.ci_high:+.3f}]",
              str(c.a_only), str(c.b_only), f"{c.mcnemar_p:.3g}", fmt(c.needed), fmt(c.more_needed))
    console.print(t)
    console.print(f"left out: {c.only_a} cells only in A, {c.only_b} only in B, {c.unscored} shared but not scored by both "
                  "(infrastructure or invalid)")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(c.as_dict(), indent=2, default=str))
