"""examples.branching.compare: tree against plain, seed by seed, on hand-made summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.branching import compare

pytestmark = pytest.mark.unit


def summary(run_id: str, seed: int, sampled: list[float], tokens: float, sandbox_s: float, forward: int) -> dict:
    return {
        "run_id": run_id, "seed": seed,
        "evals": [{"iteration": 5 * i, "pass_rate": s, "greedy_pass_rate": s} for i, s in enumerate(sampled)],
        "rl": [{"iteration": i + 1, "pass_rate": 0.5, "gen_tokens_per_group": tokens, "per_group_sandbox_s": sandbox_s,
                "forward_tokens": forward} for i in range(2)],
        "timings_s": {"total_s": 100.0},
    }


def _write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_costs_are_ratios_of_the_runs_sums_and_the_goal_names_each_breach(tmp_path: Path) -> None:
    plain = [_write(tmp_path, f"p{s}", summary(f"p{s}", s, [0.3, 0.9], 400, 0.5, 1000)) for s in (0, 1)]
    cheap_good = _write(tmp_path, "t0", summary("t0", 0, [0.3, 0.9], 200, 0.25, 500))
    dear_weak = _write(tmp_path, "t1", summary("t1", 1, [0.3, 0.5], 300, 0.4, 900))
    rows = compare.pair_rows([(p, json.loads(p.read_text())) for p in plain],
                             [(t, json.loads(t.read_text())) for t in (cheap_good, dear_weak)])
    assert [r.seed for r in rows] == [0, 1]
    assert rows[0].gen_tokens_ratio == pytest.approx(0.5) and rows[0].sandbox_s_ratio == pytest.approx(0.5)
    assert rows[1].forward_tokens_ratio == pytest.approx(0.9) and rows[1].tree_gain == pytest.approx(20.0)
    bad = compare.verdict(rows, max_cost=0.6, tolerance=0.0)
    assert bad == [
        "seed 1: tree gain +20.0 < plain +60.0 - 0",
        "seed 1: generated tokens 0.75x > 0.6x",
        "seed 1: sandbox-seconds 0.80x > 0.6x",
    ]
    png, out = tmp_path / "cmp.png", tmp_path / "cmp.json"
    argv = ["--plain", *map(str, plain), "--tree", str(cheap_good), str(dear_weak), "--png", str(png), "--json", str(out)]
    assert compare.main(argv) == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and json.loads(out.read_text())["breaches"] == bad
    assert compare.main(["--plain", str(plain[0]), "--tree", str(cheap_good)]) == 0


def test_unpaired_runs_and_runs_without_costs_are_named(tmp_path: Path) -> None:
    p0 = _write(tmp_path, "p0", summary("p0", 0, [0.3, 0.9], 400, 0.5, 1000))
    t1 = _write(tmp_path, "t1", summary("t1", 1, [0.3, 0.9], 200, 0.2, 500))
    with pytest.raises(SystemExit, match="not the same seed"):
        compare.main(["--plain", str(p0), "--tree", str(t1)])
    old = summary("old", 0, [0.3, 0.9], 400, 0.5, 1000)
    for row in old["rl"]:
        del row["per_group_sandbox_s"]
    with pytest.raises(SystemExit, match="old.json: rl rows lack \\['per_group_sandbox_s'\\]"):
        compare.main(["--plain", str(_write(tmp_path, "old", old)), "--tree", str(p0)])
