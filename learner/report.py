"""The end of a training run: a learning-curve PNG, a short Markdown report, the JSON summary.

Why a picture and a page: the question a run answers ("did RL itself make the
model better on variants it never trained on?") is one number pair, but whether
to trust it needs the curve (rollout pass rate per RL iteration, held-out pass
rate at each evaluation, warm-start loss) and the splits by harness and effort.
matplotlib is imported lazily with the Agg backend (no display on servers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from learner.loop import RunHistory

__all__ = ["plot_curve", "write_outputs", "write_report"]


def plot_curve(history: RunHistory, path: Path, kind: str = "RL") -> Path:
    """Two panels: warm-start cross-entropy per step; rollout pass rate and held-out pass rate per ``kind`` (RL or
    MOPD) iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    if history.sft:
        ax0.plot([r["step"] for r in history.sft], [r["loss"] for r in history.sft], color="tab:gray")
    ax0.set(title="warm start (SFT on oracle episodes)", xlabel="SFT step", ylabel="cross-entropy")
    if history.rl:
        its = [r["iteration"] for r in history.rl]
        ax1.plot(its, [r["pass_rate"] for r in history.rl], "o-", alpha=0.6, label=f"{kind} rollouts (T sampling)")
    if history.evals:
        ax1.plot([e.iteration for e in history.evals], [e.pass_rate for e in history.evals], "s-",
                 color="tab:red", linewidth=2, label="held-out eval")
        greedy = [(e.iteration, e.greedy_pass_rate) for e in history.evals if e.greedy_pass_rate is not None]
        if greedy:
            ax1.plot(*zip(*greedy), "d--", color="tab:purple", label="held-out eval, greedy")
    ax1.set(title="verifier pass rate", xlabel=f"{kind} iteration", ylabel="pass rate", ylim=(-0.02, 1.02))
    ax1.legend(loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _kind(summary: dict[str, Any]) -> str:
    """What the iterations were: MOPD for a distill run's summary (it has a ``distill`` section), else RL."""
    return "MOPD" if "distill" in summary else "RL"


def _table(first: dict[str, float], last: dict[str, float], kind: str = "RL") -> list[str]:
    rows = [f"| split | after warm start | after {kind} |", "| --- | --- | --- |"]
    for k in sorted(set(first) | set(last)):
        rows.append(f"| {k} | {first.get(k, float('nan')):.2f} | {last.get(k, float('nan')):.2f} |")
    return rows


def write_report(summary: dict[str, Any], history: RunHistory, path: Path, png: Path) -> Path:
    """A one-page Markdown summary next to the curve."""
    a, b = summary["after_warm_start"], summary["after_rl"]
    kind = _kind(summary)
    lines = [
        f"# Training run `{summary['run_id']}`",
        "",
        f"Tasks {', '.join(summary['tasks'])}; held-out eval on {a['n']} episodes (seeds "
        f"{summary['eval_seeds'][0]}..{summary['eval_seeds'][-1]}, never trained on), temperature "
        f"{summary['eval_temperature']}, the same seeds, harnesses and efforts at every evaluation.",
        "",
        f"- pass rate after warm start: **{summary['pass_rate_after_warm_start']:.2f}**",
        f"- pass rate after {kind}: **{summary['pass_rate_after_rl']:.2f}** "
        f"({summary['improvement_points']:+.1f} points, policy version {summary['final_version']})",
        *([f"- greedy (temperature 0, same episodes): {summary['pass_rate_greedy_after_warm_start']:.2f} after warm "
           f"start, {summary['pass_rate_greedy_after_rl']:.2f} after {kind}"]
          if summary.get("pass_rate_greedy_after_rl") is not None else []),
        f"- wall time: {summary['timings_s'].get('total_s', 0):.0f} s ({json.dumps(summary['timings_s'])})",
        "",
        f"![learning curve]({png.name})",
        "",
        "## By harness",
        *_table(a["by_harness"], b["by_harness"], kind),
        "",
        "## By effort",
        *_table(a["by_effort"], b["by_effort"], kind),
        "",
        "## Evaluations",
        f"| {kind} iteration | version | pass rate | greedy |",
        "| --- | --- | --- | --- |",
        *[f"| {e.iteration} | {e.version} | {e.pass_rate:.2f} | "
          f"{'-' if e.greedy_pass_rate is None else f'{e.greedy_pass_rate:.2f}'} |" for e in history.evals],
        "",
        f"Rollouts: {summary['rollout']}. Metrics are in the store ({summary['store']}) under run "
        f"`{summary['run_id']}` (`sft/*`, `rl/*`, `eval/*`).",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_outputs(summary: dict[str, Any], history: RunHistory, out_dir: Path, json_path: Path | None = None) -> dict[str, Any]:
    """Curve, report and ``summary.json`` under ``out_dir`` (and ``json_path`` if given); returns the summary with paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot_curve(history, out_dir / "learning_curve.png", _kind(summary))
    report = write_report(summary, history, out_dir / "report.md", png)
    summary = {**summary, "learning_curve_png": str(png.resolve()), "report_md": str(report.resolve())}
    text = json.dumps(summary, indent=2, default=str)
    (out_dir / "summary.json").write_text(text)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text)
    return summary
