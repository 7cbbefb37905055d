"""The grid demonstration's arithmetic and threshold checks against hand-made numbers (examples/grid_demo/report.py,
examples.grid_demo.run.build_report): every PASS and every FAIL comes from the numbers, both ways."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from examples.grid_demo.run import build_report
from examples.grid_demo.report import (
    Cost, RunCurve, check_ablation_collapses, check_compute, check_order, check_ratios, check_teacher_gains, compute_ratios,
    plot_grid, plot_lengths, ratio, strictly_rising, to_target,
)

pytestmark = pytest.mark.unit

DOMAINS, EFFORTS = ["general", "coding"], ["low", "high", "max"]


def _curve(evals: list[tuple[int, float]], per_iter: list[Cost]) -> RunCurve:
    through = [Cost()]
    for c in per_iter:
        through.append(through[-1] + c)
    return RunCurve(tuple(evals), tuple(through))


def test_cost_adds_fieldwise_and_model_tokens_are_learner_plus_scoring() -> None:
    a = Cost(episodes=32, sampled_tokens=1000, learner_tokens=5000, scoring_tokens=9000, wall_s=10.0)
    b = Cost(episodes=32, sampled_tokens=500, learner_tokens=4000, wall_s=2.5)
    s = a + b
    assert (s.episodes, s.sampled_tokens, s.learner_tokens, s.scoring_tokens, s.wall_s) == (64, 1500, 9000, 9000, 12.5)
    assert s.model_tokens == 18000 and s.measures() == {"episodes": 64, "sampled_tokens": 1500, "model_tokens": 18000,
                                                        "wall_s": 12.5}


def test_ratio_edge_cases() -> None:
    assert ratio(0.45, 0.5) == pytest.approx(0.9)
    assert ratio(0.5, 0.0) == math.inf
    assert math.isnan(ratio(0.0, 0.0))


def test_teacher_gains_pass_at_exactly_twenty_points_and_fail_below() -> None:
    init = {"general/low": 0.30, "general/max": 0.70}
    ok = check_teacher_gains(init, {"general/low": 0.50, "general/max": 0.95})   # +20.0 (float noise), +25
    assert ok.passed and "general/low +20.0" in ok.detail
    bad = check_teacher_gains(init, {"general/low": 0.96, "general/max": 0.54})   # -16.0 on max
    assert not bad.passed and "short: general/max" in bad.detail and bad.line().startswith("FAIL")


def test_ratios_need_point_nine_in_every_cell_and_nan_fails() -> None:
    teacher = {"a/low": 1.0, "a/high": 0.8, "a/max": 0.0}
    assert check_ratios({"a/low": 0.9, "a/high": 0.72, "a/max": 0.1}, teacher).passed  # 0.9, 0.9, inf
    bad = check_ratios({"a/low": 0.9, "a/high": 0.70, "a/max": 0.0}, teacher)       # 0.875; 0/0
    assert not bad.passed and "a/high" in bad.detail and "a/max" in bad.detail.split("short:")[1]


def test_order_is_strict_in_every_domain() -> None:
    med = {"general/low": 48, "general/high": 72, "general/max": 109, "coding/low": 52, "coding/high": 76, "coding/max": 76}
    assert strictly_rising([1, 2, 3]) and not strictly_rising([1, 2, 2]) and not strictly_rising([2, 1, 3])
    c = check_order("teachers", med, DOMAINS, EFFORTS)
    assert not c.passed and "not rising: coding" in c.detail and "general 48 < 72 < 109" in c.detail
    med["coding/max"] = 114
    assert check_order("teachers", med, DOMAINS, EFFORTS).passed


def test_ablation_collapses_only_when_no_domain_keeps_the_order() -> None:
    flat = {"general/low": 60, "general/high": 72, "general/max": 70, "coding/low": 70, "coding/high": 70, "coding/max": 70}
    assert check_ablation_collapses(flat, DOMAINS, EFFORTS).passed
    kept = dict(flat, **{"general/max": 100})
    c = check_ablation_collapses(kept, DOMAINS, EFFORTS)
    assert not c.passed and "still ordered: general" in c.detail


def test_episodes_to_target_is_the_first_evaluation_reaching_it() -> None:
    per = [Cost(episodes=32, wall_s=10.0)] * 4
    curve = _curve([(0, 0.2), (2, 0.5), (4, 0.8)], per)
    assert to_target(curve, 0.5) == (2, Cost(episodes=64, wall_s=20.0))
    assert to_target(curve, 0.2) == (0, Cost())
    assert to_target(curve, 0.9) == (None, Cost(episodes=128, wall_s=40.0))  # never: the whole budget, a lower bound


def test_compute_ratio_counts_the_teachers_and_says_when_it_is_a_bound() -> None:
    teachers = Cost(episodes=100, sampled_tokens=1000, learner_tokens=1000, wall_s=100.0)
    step = Cost(episodes=32, sampled_tokens=320, learner_tokens=320, scoring_tokens=320, wall_s=10.0)
    student = _curve([(0, 0.1), (2, 0.9)], [step] * 2)
    # baseline reaches 0.9 only after 20 iterations of 32 episodes: 640 episodes vs 64 + 100
    baseline = _curve([(0, 0.1), (10, 0.5), (20, 0.9)], [Cost(episodes=32, sampled_tokens=800, learner_tokens=3000, wall_s=30.0)] * 20)
    r = compute_ratios(student, baseline, teachers, 0.9)
    assert r["bound"] == "exact" and (r["student_iteration"], r["baseline_iteration"]) == (2, 20)
    assert r["ratios"]["episodes"] == pytest.approx(640 / 164)
    assert r["ratios"]["sampled_tokens"] == pytest.approx(16000 / 1640)
    assert r["ratios"]["model_tokens"] == pytest.approx(60000 / (1280 + 1000))
    assert r["ratios"]["wall_s"] == pytest.approx(600 / 120)
    assert check_compute(r).passed

    # the same baseline stopped at 4 iterations never reaches it: 128 episodes is a lower bound, and too small
    short = _curve([(0, 0.1), (4, 0.5)], [Cost(episodes=32, sampled_tokens=800, learner_tokens=3000, wall_s=30.0)] * 4)
    r = compute_ratios(student, short, teachers, 0.9)
    assert r["bound"] == "lower" and r["ratios"]["episodes"] == pytest.approx(128 / 164)
    c = check_compute(r)
    assert not c.passed and "lower bounds" in c.detail

    never = _curve([(0, 0.1), (2, 0.3)], [step] * 2)
    r = compute_ratios(never, baseline, teachers, 0.9)
    assert r["bound"] == "none" and not check_compute(r).passed
    assert "never reached 0.90" in check_compute(r).detail


def _row(p: float, tokens: float, n: int = 24) -> dict[str, float]:
    return {"pass_rate": p, "median_tokens": tokens, "n": n}


def test_build_report_from_hand_made_numbers(tmp_path: Path) -> None:
    cells = [f"{d}/{e}" for d in DOMAINS for e in EFFORTS]
    length = {"low": 50.0, "high": 75.0, "max": 110.0}
    teachers = {"cells": [{"cell": c, "init": _row(0.3, 70), "expert": _row(0.8, length[c.split("/")[1]])} for c in cells]}
    measured = {
        "student": {c: _row(0.76, length[c.split("/")[1]] + 1) for c in cells},
        "student_no_message": {c: _row(0.5, 70) for c in cells},
        "baseline": {c: _row(0.4, 70) for c in cells},
    }
    measured["student"]["coding/max"] = _row(0.6, 112)  # 0.75 of its teacher
    step = Cost(episodes=32, sampled_tokens=2000, learner_tokens=4000, scoring_tokens=8000, wall_s=30.0)
    costs = {"student": _curve([(0, 0.3), (2, 0.75)], [step] * 2),
             "baseline": _curve([(0, 0.3), (2, 0.4)], [Cost(episodes=32, sampled_tokens=2000, learner_tokens=4000, wall_s=20.0)] * 2),
             "teachers": Cost(episodes=600, sampled_tokens=40000, learner_tokens=90000, wall_s=900.0),
             "teacher_cells": {c: Cost(episodes=100) for c in cells}, "shared": Cost(episodes=120, wall_s=200.0)}
    report = build_report(DOMAINS, EFFORTS, teachers, measured, costs)
    # gains, ratios (coding/max 0.75), teachers' order, student's order, ablation, compute (never 3x here)
    assert [c["passed"] for c in report["checks"]] == [True, False, True, True, True, False], report["checks"]
    assert "short: coding/max" in report["checks"][1]["detail"]
    assert report["target"]["pass_rate"] == pytest.approx(0.72)
    by_cell = {r["cell"]: r for r in report["cells"]}
    assert by_cell["coding/max"]["ratio"] == pytest.approx(0.75) and by_cell["general/low"]["ratio"] == pytest.approx(0.95)
    tt = report["compute"]["to_target"]
    assert tt["student_iteration"] == 2 and tt["baseline_iteration"] is None and tt["bound"] == "lower"
    assert report["compute"]["student_plus_teachers"]["episodes"] == 664
    json.dumps(report)  # the report is written as JSON

    teacher = {c: by_cell[c]["teacher"] for c in cells}
    student = {c: by_cell[c]["student"] for c in cells}
    assert plot_grid(DOMAINS, EFFORTS, teacher, student, tmp_path / "grid.png").stat().st_size > 0
    series = {"teachers": {c: by_cell[c]["median_tokens"]["teacher"] for c in cells}}
    assert plot_lengths(DOMAINS, EFFORTS, series, tmp_path / "lengths.png").stat().st_size > 0
