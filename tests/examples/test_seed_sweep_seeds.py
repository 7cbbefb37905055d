"""examples.seed_sweep.seeds: the per-seed rows, the main job's criterion and the band plot, on hand-made summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.seed_sweep import seeds

pytestmark = pytest.mark.unit


def summary(run_id: str, sampled: list[float], greedy: list[float | None], train: list[float]) -> dict:
    return {
        "run_id": run_id,
        "evals": [{"iteration": 5 * i, "pass_rate": s, "greedy_pass_rate": g} for i, (s, g) in enumerate(zip(sampled, greedy))],
        "rl": [{"iteration": i + 1, "pass_rate": p} for i, p in enumerate(train)],
        "timings_s": {"total_s": 900.0},
    }


def test_rows_measure_gains_and_the_worst_evaluation() -> None:
    (row,) = seeds.seed_rows([summary("a", [0.25, 0.20, 0.50], [0.30, 0.60, 0.90], [0.2, 0.4])])
    assert row.sampled_gain == pytest.approx(25.0)
    assert row.greedy_gain == pytest.approx(60.0)
    assert row.worst_sampled_points == pytest.approx(-5.0)
    assert row.worst_greedy_points == pytest.approx(30.0)


def test_criterion_names_every_breach() -> None:
    good = summary("good", [0.2, 0.3, 0.45], [0.3, 0.6, 0.9], [0.2])
    small = summary("small", [0.2, 0.3, 0.35], [0.3, 0.6, 0.9], [0.2])
    dips = summary("dips", [0.2, 0.1, 0.5], [0.3, 0.6, 0.9], [0.2])
    nogreedy = summary("nogreedy", [0.2, 0.3, 0.5], [None, None, None], [0.2])
    assert seeds.criterion_holds(seeds.seed_rows([good]), 20) == []
    breaches = seeds.criterion_holds(seeds.seed_rows([good, small, dips, nogreedy]), 20)
    assert [b.split(":")[0] for b in breaches] == ["small", "dips", "nogreedy"]
    assert "sampled gain +15.0" in breaches[0] and "fell -10.0" in breaches[1]


def test_cli_writes_the_band_png_and_the_verdict(tmp_path: Path) -> None:
    paths = []
    for i, (s, g) in enumerate([([0.2, 0.4, 0.5], [0.3, 0.7, 0.9]), ([0.1, 0.3, 0.4], [0.3, 0.5, 0.8])]):
        p = tmp_path / f"s{i}.json"
        p.write_text(json.dumps(summary(f"s{i}", s, g, [0.1, 0.3, 0.5])))
        paths.append(str(p))
    out_png, out_json = tmp_path / "band.png", tmp_path / "seeds.json"
    assert seeds.main([*paths, "--png", str(out_png), "--json", str(out_json)]) == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    verdict = json.loads(out_json.read_text())
    assert verdict["criterion_met"] and [r["run_id"] for r in verdict["seeds"]] == ["s0", "s1"]
    assert seeds.main([*paths, "--min-gain", "45"]) == 1


def test_a_broken_summary_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"run_id": "x"}')
    with pytest.raises(SystemExit, match="bad.json: field 'evals' missing"):
        seeds.main([str(bad)])
