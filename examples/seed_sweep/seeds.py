"""Several seeds of one training config, side by side: a table, the criterion, a band plot.

``python -m examples.seed_sweep.seeds SUMMARY.json ... [--png PATH] [--json PATH] [--min-gain 20]``

Each SUMMARY is what ``agentenv train ... --json`` (or ``out_dir/run_id/summary.json``) wrote. One
run proves little: a learning claim is the range over seeds. For every run the table shows the
held-out pass rate, sampled (at the evaluation temperature) and greedy, after the warm start and
after RL, the gains in points, and the lowest evaluation relative to the warm start. The criterion
(the main job's): every seed gains at least ``--min-gain`` points, sampled and greedy, and no
evaluation falls below the warm start. The PNG draws the mean over seeds with the min-max range as
a band: held-out sampled, held-out greedy, and the training rollouts' pass rate per RL iteration.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["SeedRow", "criterion_holds", "load_summary", "plot_band", "save_png", "seed_rows"]


@dataclass(frozen=True)
class SeedRow:
    run_id: str
    sampled_before: float
    sampled_after: float
    greedy_before: float | None
    greedy_after: float | None
    #: the lowest evaluation minus the warm start's, in points (sampled; greedy), negative = fell below
    worst_sampled_points: float
    worst_greedy_points: float | None
    total_s: float

    @property
    def sampled_gain(self) -> float:
        return 100.0 * (self.sampled_after - self.sampled_before)

    @property
    def greedy_gain(self) -> float | None:
        if self.greedy_before is None or self.greedy_after is None:
            return None
        return 100.0 * (self.greedy_after - self.greedy_before)


def load_summary(path: Path) -> dict[str, Any]:
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{path}: not a readable training summary: {exc}") from exc
    for key in ("run_id", "evals", "rl"):
        if key not in summary:
            raise SystemExit(f"{path}: field {key!r} missing: not a training summary")
    if not summary["evals"]:
        raise SystemExit(f"{path}: field 'evals' is empty: the run has no evaluation")
    return summary


def seed_rows(summaries: list[dict[str, Any]]) -> list[SeedRow]:
    rows = []
    for s in summaries:
        evals = s["evals"]
        first, last = evals[0], evals[-1]
        sampled = [e["pass_rate"] for e in evals]
        greedy = [e.get("greedy_pass_rate") for e in evals]
        has_greedy = all(g is not None for g in greedy)
        rows.append(SeedRow(
            run_id=s["run_id"],
            sampled_before=first["pass_rate"], sampled_after=last["pass_rate"],
            greedy_before=first.get("greedy_pass_rate"), greedy_after=last.get("greedy_pass_rate"),
            worst_sampled_points=100.0 * (min(sampled[1:], default=sampled[0]) - sampled[0]),
            worst_greedy_points=100.0 * (min(greedy[1:], default=greedy[0]) - greedy[0]) if has_greedy else None,
            total_s=float(s.get("timings_s", {}).get("total_s", 0.0)),
        ))
    return rows


def criterion_holds(rows: list[SeedRow], min_gain: float) -> list[str]:
    """What fails the criterion, one line per breach; empty when every seed meets it."""
    breaches = []
    for r in rows:
        if r.sampled_gain < min_gain:
            breaches.append(f"{r.run_id}: sampled gain {r.sampled_gain:+.1f} points < {min_gain:g}")
        if r.greedy_gain is None:
            breaches.append(f"{r.run_id}: no greedy evaluation (eval.greedy_too is off)")
        elif r.greedy_gain < min_gain:
            breaches.append(f"{r.run_id}: greedy gain {r.greedy_gain:+.1f} points < {min_gain:g}")
        if r.worst_sampled_points < 0:
            breaches.append(f"{r.run_id}: a sampled evaluation fell {r.worst_sampled_points:.1f} points below the warm start")
        if r.worst_greedy_points is not None and r.worst_greedy_points < 0:
            breaches.append(f"{r.run_id}: a greedy evaluation fell {r.worst_greedy_points:.1f} points below the warm start")
    return breaches


def _band(series: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """x, mean, min, max over the runs at the x values every run has."""
    common = sorted(set.intersection(*(set(x for x, _ in s) for s in series)))
    xs, mean, lo, hi = [], [], [], []
    for x in common:
        ys = [dict(s)[x] for s in series]
        xs.append(x)
        mean.append(sum(ys) / len(ys))
        lo.append(min(ys))
        hi.append(max(ys))
    return xs, mean, lo, hi


def save_png(fig: Any, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` (its folder made) at the sweep's resolution, and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_band(summaries: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    held = {
        "held-out, sampled": ([[(e["iteration"], e["pass_rate"]) for e in s["evals"]] for s in summaries], "tab:red"),
        "held-out, greedy": ([[(e["iteration"], e["greedy_pass_rate"]) for e in s["evals"]
                               if e.get("greedy_pass_rate") is not None] for s in summaries], "tab:purple"),
    }
    for label, (series, color) in held.items():
        if all(series):
            xs, mean, lo, hi = _band(series)
            ax0.plot(xs, mean, "o-", color=color, label=f"{label} (mean)")
            ax0.fill_between(xs, lo, hi, color=color, alpha=0.2, label=f"{label} (range)")
    ax0.set(title=f"held-out pass rate, {len(summaries)} seeds", xlabel="RL iteration", ylabel="pass rate",
            ylim=(-0.02, 1.02))
    ax0.legend(loc="best", fontsize=8)
    train = [[(r["iteration"], r["pass_rate"]) for r in s["rl"]] for s in summaries]
    if all(train):
        xs, mean, lo, hi = _band(train)
        ax1.plot(xs, mean, "o-", color="tab:blue", label="training rollouts (mean)")
        ax1.fill_between(xs, lo, hi, color="tab:blue", alpha=0.2, label="training rollouts (range)")
    ax1.set(title="RL rollout pass rate (verifier)", xlabel="RL iteration", ylabel="pass rate", ylim=(-0.02, 1.02))
    ax1.legend(loc="best", fontsize=8)
    return save_png(fig, path)


def _print_table(rows: list[SeedRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    def pts(v: float | None) -> str:
        return "-" if v is None else f"{v:+.1f}"

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    table = Table(title="held-out pass rate by seed (points)")
    for col in ("run", "sampled", "gain", "greedy", "gain", "worst vs warm start", "wall s"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.run_id, f"{r.sampled_before:.2f} -> {r.sampled_after:.2f}", pts(r.sampled_gain),
                      f"{rate(r.greedy_before)} -> {rate(r.greedy_after)}", pts(r.greedy_gain),
                      f"{pts(r.worst_sampled_points)} / {pts(r.worst_greedy_points)}", f"{r.total_s:.0f}")
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.seed_sweep.seeds", description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="+", type=Path)
    parser.add_argument("--png", type=Path, default=None, help="the band plot")
    parser.add_argument("--json", type=Path, default=None, help="the per-seed rows and the verdict")
    parser.add_argument("--min-gain", type=float, default=20.0, help="points, sampled and greedy (default 20)")
    args = parser.parse_args(argv)
    summaries = [load_summary(p) for p in args.summaries]
    rows = seed_rows(summaries)
    _print_table(rows)
    breaches = criterion_holds(rows, args.min_gain)
    print("criterion met by every seed" if not breaches else "criterion NOT met:\n  " + "\n  ".join(breaches))
    if args.png:
        print(f"band plot: {plot_band(summaries, args.png)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "min_gain_points": args.min_gain, "criterion_met": not breaches, "breaches": breaches,
            "seeds": [asdict(r) | {"sampled_gain": r.sampled_gain, "greedy_gain": r.greedy_gain} for r in rows],
        }, indent=2))
    return 0 if not breaches else 1


if __name__ == "__main__":
    sys.exit(main())
