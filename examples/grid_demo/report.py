"""The 3 x 3 demonstration's arithmetic: per-cell table, compute table, the issue's thresholds, two PNGs.

Pure functions over numbers that ``examples.grid_demo.run`` measured (held-out pass rates and median
sampled tokens per cell, and what each run cost); nothing here runs a model or a sandbox, so every
threshold is checked against hand-made numbers in ``tests/examples/test_grid_report.py``.

The thresholds (issue #15), each a ``Check`` with PASS or FAIL computed from the numbers:

1. every teacher beats the shared init on its own cell by at least 20 points;
2. the student's pass rate divided by its teacher's is at least 0.9 in every cell;
3. the median output tokens rise low < high < max in every domain, for the teachers and for the student;
4. without the effort message the student's ordering collapses: the strict order holds in no domain;
5. the student needs at least 3x less compute than multi-task RL to reach 90% of the teachers' mean
   pass rate, the teachers' own training included: ``baseline_to_target / (student_to_target +
   teachers)`` >= 3 in sandbox episodes, generated tokens, model tokens (learner + forward-only
   scoring) and wall time. A run that never reaches the target within its budget has cost *at least*
   its whole budget: for the baseline that makes the ratio a lower bound (PASS only if the bound
   is >= 3); for the student it is a FAIL (no ratio).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = [
    "Check", "Cost", "RunCurve", "cell", "check_ablation_collapses", "check_compute", "check_order", "check_ratios",
    "check_teacher_gains", "compute_ratios", "plot_grid", "plot_lengths", "ratio", "strictly_rising", "to_target",
]

MIN_GAIN_POINTS = 20.0
MIN_RATIO = 0.9
MIN_COMPUTE_FACTOR = 3.0
TARGET_FRACTION = 0.9


def cell(domain: str, effort: str) -> str:
    return f"{domain}/{effort}"


@dataclass(frozen=True)
class Cost:
    """What a piece of training spent. ``scoring_tokens``: forward-only tokens (MOPD's teacher contexts and the
    student's own logprob pass); ``learner_tokens``: tokens through the learner's forward and backward."""

    episodes: int = 0
    sampled_tokens: int = 0
    learner_tokens: int = 0
    scoring_tokens: int = 0
    wall_s: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(Cost)})

    @property
    def model_tokens(self) -> int:
        return self.learner_tokens + self.scoring_tokens

    def measures(self) -> dict[str, float]:
        """The four quantities the compute threshold compares."""
        return {"episodes": self.episodes, "sampled_tokens": self.sampled_tokens, "model_tokens": self.model_tokens,
                "wall_s": self.wall_s}

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "model_tokens": self.model_tokens}


@dataclass(frozen=True)
class RunCurve:
    """One run's held-out evaluations ``(iteration, pass_rate)`` and its cost through each iteration
    (``cost_through[i]``: iterations 1..i; ``cost_through[0]`` is zero)."""

    evals: tuple[tuple[int, float], ...]
    cost_through: tuple[Cost, ...]

    @property
    def total(self) -> Cost:
        return self.cost_through[-1]


def to_target(curve: RunCurve, target: float) -> tuple[int | None, Cost]:
    """The first evaluated iteration whose pass rate is >= ``target`` and the cost through it; ``(None, total)``
    when no evaluation reaches it (the cost is then a lower bound)."""
    for it, rate in sorted(curve.evals):
        if rate >= target - 1e-12:
            return it, curve.cost_through[it]
    return None, curve.total


def ratio(student: float, teacher: float) -> float:
    """student / teacher; +inf when only the teacher is 0, NaN when both are (a NaN never passes)."""
    if teacher > 0:
        return student / teacher
    return math.inf if student > 0 else math.nan


def strictly_rising(values: Sequence[float]) -> bool:
    return all(a < b for a, b in zip(values, values[1:]))


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}: {self.detail}"


def check_teacher_gains(init: Mapping[str, float], teacher: Mapping[str, float], min_points: float = MIN_GAIN_POINTS) -> Check:
    gains = {c: 100.0 * (teacher[c] - init[c]) for c in teacher}
    bad = [c for c, g in gains.items() if g < min_points - 1e-9]
    detail = ", ".join(f"{c} {g:+.1f}" for c, g in gains.items())
    return Check(f"every teacher >= +{min_points:.0f} points over the shared init on its cell", not bad,
                 detail + (f" (short: {', '.join(bad)})" if bad else ""))


def check_ratios(student: Mapping[str, float], teacher: Mapping[str, float], min_ratio: float = MIN_RATIO) -> Check:
    ratios = {c: ratio(student[c], teacher[c]) for c in teacher}
    bad = [c for c, r in ratios.items() if not (r >= min_ratio - 1e-9)]  # NaN fails; 18/24 over 20/24 is 0.9
    detail = ", ".join(f"{c} {r:.2f}" for c, r in ratios.items())
    return Check(f"student / teacher >= {min_ratio} in every cell", not bad,
                 detail + (f" (short: {', '.join(bad)})" if bad else ""))


def check_order(who: str, medians: Mapping[str, float], domains: Sequence[str], efforts: Sequence[str]) -> Check:
    """Median tokens strictly rising along ``efforts`` (low, high, max) in every domain."""
    rows = {d: [medians[cell(d, e)] for e in efforts] for d in domains}
    bad = [d for d, v in rows.items() if not strictly_rising(v)]
    detail = "; ".join(f"{d} {' < '.join(f'{x:.0f}' for x in v) if strictly_rising(v) else ' / '.join(f'{x:.0f}' for x in v)}"
                       for d, v in rows.items())
    return Check(f"median tokens {' < '.join(efforts)} in every domain ({who})", not bad,
                 detail + (f" (not rising: {', '.join(bad)})" if bad else ""))


def check_ablation_collapses(medians: Mapping[str, float], domains: Sequence[str], efforts: Sequence[str]) -> Check:
    """Without the effort message the strict order must hold in no domain."""
    rows = {d: [medians[cell(d, e)] for e in efforts] for d in domains}
    kept = [d for d, v in rows.items() if strictly_rising(v)]
    detail = "; ".join(f"{d} {' / '.join(f'{x:.0f}' for x in v)}" for d, v in rows.items())
    return Check("without the effort message the student's length order collapses", not kept,
                 detail + (f" (still ordered: {', '.join(kept)})" if kept else ""))


def compute_ratios(student: RunCurve, baseline: RunCurve, teachers: Cost, target: float) -> dict[str, Any]:
    """Each side's cost to reach ``target`` and baseline / (student + teachers) per measure.

    ``bound``: ``"exact"``, ``"lower"`` (the baseline never reached the target: its whole budget is a
    lower bound on its cost, so the ratio is too) or ``"none"`` (the student never reached it).
    """
    s_it, s_cost = to_target(student, target)
    b_it, b_cost = to_target(baseline, target)
    bound = "none" if s_it is None else "lower" if b_it is None else "exact"
    denom = s_cost + teachers
    ratios = {}
    for k, b in b_cost.measures().items():
        d = denom.measures()[k]
        ratios[k] = math.nan if s_it is None else (b / d if d > 0 else math.inf)
    return {"target": target, "student_iteration": s_it, "baseline_iteration": b_it, "student_to_target": s_cost.as_dict(),
            "baseline_to_target": b_cost.as_dict(), "teachers": teachers.as_dict(),
            "student_plus_teachers": denom.as_dict(), "ratios": ratios, "bound": bound}


def check_compute(result: Mapping[str, Any], factor: float = MIN_COMPUTE_FACTOR) -> Check:
    ratios: Mapping[str, float] = result["ratios"]
    detail = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
    if result["bound"] == "none":
        return Check(f">= {factor:.0f}x less compute for the student, teachers included", False,
                     f"the student never reached {result['target']:.2f} within its budget")
    ok = all(v >= factor for v in ratios.values())
    note = " (lower bounds: the baseline never reached the target)" if result["bound"] == "lower" else ""
    return Check(f">= {factor:.0f}x less compute for the student, teachers included", ok, detail + note)


# ------------------------------------------------------------------ pictures


def plot_grid(domains: Sequence[str], efforts: Sequence[str], teacher: Mapping[str, float], student: Mapping[str, float],
              path: Path) -> Path:
    """Three heatmaps, domain x effort: teacher pass rate, student pass rate, student / teacher."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def grid(values: Mapping[str, float]) -> list[list[float]]:
        return [[values[cell(d, e)] for e in efforts] for d in domains]

    ratios = {c: ratio(student[c], teacher[c]) for c in teacher}
    panels = [("teacher (own cell)", grid(teacher), (0.0, 1.0)), ("student (effort message)", grid(student), (0.0, 1.0)),
              (f"student / teacher (bar {MIN_RATIO})", grid(ratios), (0.0, 1.2))]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (title, data, (lo, hi)) in zip(axes, panels):
        shown = [[min(x, hi) if math.isfinite(x) else hi for x in row] for row in data]
        im = ax.imshow(shown, vmin=lo, vmax=hi, cmap="viridis")
        for i, row in enumerate(data):
            for j, x in enumerate(row):
                ax.text(j, i, "n/a" if math.isnan(x) else f"{x:.2f}", ha="center", va="center",
                        color="white" if (x if math.isfinite(x) else hi) < (lo + hi) / 2 else "black")
        ax.set_xticks(range(len(efforts)), efforts)
        ax.set_yticks(range(len(domains)), domains)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle("held-out pass rate per cell (domain x effort)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_lengths(domains: Sequence[str], efforts: Sequence[str], series: Mapping[str, Mapping[str, float]], path: Path) -> Path:
    """One panel per domain: median sampled tokens per effort level, one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(domains), figsize=(4 * len(domains), 3.6), squeeze=False)
    for ax, d in zip(axes[0], domains):
        for name, medians in series.items():
            ax.plot(list(efforts), [medians[cell(d, e)] for e in efforts], "o-", label=name)
        ax.set(title=d, xlabel="effort level", ylabel="median sampled tokens per episode")
    axes[0][0].legend(loc="best", fontsize=8)
    fig.suptitle("held-out output length by effort")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
