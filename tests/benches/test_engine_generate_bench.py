"""``python -m benches.engine_generate`` end to end on a tiny model: every contender runs and the table's ratios exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benches.engine_generate import main

pytestmark = pytest.mark.unit


def test_engine_generate_bench_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = main(["--concurrency", "3", "8", "--new", "6", "--legacy-turns", "2", "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    for row in result["rows"]:
        assert row["engine"]["tokens"] == row["concurrency"] * 6 and row["engine"]["steps"] >= 5
        assert row["episode"]["tokens"] == 2 * 6 and row["generate"]["tokens"] == row["concurrency"] * 6
    assert result["weight_sync_s"]["keep"] > 0


def test_engine_generate_bench_with_groups_shares_each_prompt(tmp_path: Path) -> None:
    """``--group 4``: 8 turns on 2 prompts; the engine copies 6 of them, the unshared engine computes all 8."""
    result = main(["--concurrency", "8", "--new", "4", "--group", "4", "--skip", "episode", "generate", "--serial",
                   "--json", str(tmp_path / "bench.json")])
    row = result["rows"][0]
    assert row["engine"]["shared_prefills"] == 6 and row["engine_unshared"]["shared_prefills"] == 0
    assert row["engine"]["tokens"] == row["engine_unshared"]["tokens"] == row["engine_serial"]["tokens"] == 8 * 4
    assert result["group"] == 4
    for name in ("engine", "engine_unshared"):  # the timed wave's admissions hold every turn once; CPU: no graphs
        assert sum(row[name]["admissions"]) == 8 and row[name]["captures"] == 0
