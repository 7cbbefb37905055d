"""``python -m examples.grid_demo.run`` end to end on tiny models in real Docker sandboxes (about 35 s on a quiet 2-core machine).

Plumbing, not learning (the measured demonstration is in docs/distill.md): two domains x two effort levels of
teachers from one warm start, the MOPD student and the RL baseline on the same episode budget, every cell
evaluated for the student with and without the effort message and for the baseline, costs read back from
the store, every threshold given a verdict, the JSON and both PNGs written; ``--reuse`` reads every stage back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from examples.grid_demo.run import main
from rollout.policy.models import load_checkpoint
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TINY = {
    "name": "tiny-grid",
    "teachers": {
        "domains": {"general": ["general/count_lines"], "coding": ["coding/fix_add"]},
        "efforts": {"low": {"tau": 0.8, "max_thinking_tokens": 2}, "max": {"tau": 2.0}},
        "budget_seeds": 2,
        "base": {
            "rollout": {"rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
                        "group_size": 2, "sampling": {"temperature": 1.0, "max_new_tokens": 24},
                        "staleness": {"max_lag": 0}, "concurrency": 3},
            "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
            "eval": {"seeds": {"start": 9000, "count": 2}, "temperature": 1.0},
            "train_seeds": 9000,
        },
        "warm_start": {"episodes": 4, "steps": 2, "batch_size": 2},
        "expert": {"sft": {"episodes": 2, "steps": 1, "batch_size": 2}, "rl": {"iterations": 1, "groups_per_iter": 1},
                   "by_effort": {"max": {"rl": {"iterations": 2}, "lr": 1.0e-4}}},
    },
    "budget": {"iterations": 2, "groups_per_iter": 1},
    "eval_every": 1,
}


def test_grid_demo_end_to_end(tmp_path: Path, base_image: str) -> None:
    db = tmp_path / "store.db"
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(dict(TINY, out_dir=str(tmp_path / "runs"), store=f"sqlite:///{db}"), sort_keys=False))
    assert main([str(config), "--json", str(tmp_path / "report.json")]) == 0
    report = json.loads((tmp_path / "report.json").read_text())

    cells = ["general/low", "general/max", "coding/low", "coding/max"]
    assert [r["cell"] for r in report["cells"]] == cells
    for row in report["cells"]:
        assert row["n"] == 2 and set(row["median_tokens"]) == {"init", "teacher", "student", "student_no_message", "baseline"}
    assert [c["verdict"] for c in report["checks"]] == ["PASS" if c["passed"] else "FAIL" for c in report["checks"]]
    assert len(report["checks"]) == 6
    assert Path(report["grid_png"]).stat().st_size > 0 and Path(report["lengths_png"]).stat().st_size > 0

    compute = report["compute"]
    assert compute["student"]["episodes"] == compute["baseline"]["episodes"] == 2 * 1 * 2  # the same episode budget
    assert compute["student"]["scoring_tokens"] > compute["student"]["learner_tokens"] > 0  # teacher + own forward
    assert compute["baseline"]["scoring_tokens"] == 0
    # four cells: 2 demonstrations each, RL 1 x 1 x 2 (max: 2 x 1 x 2, its by_effort override)
    assert compute["teachers"]["episodes"] == 2 * (2 + 2) + 2 * (2 + 4)
    assert compute["student_plus_teachers"]["episodes"] == compute["student"]["episodes"] + compute["teachers"]["episodes"]
    assert compute["shared_warm_start"]["episodes"] == 4 + 2 * 2  # demonstrations + budget episodes
    assert [it for it, _ in compute["curves"]["student"]["evals"]] == [0, 1, 2]

    # Only the student's prompts carry the effort message; the ablation's and the teachers' do not.
    teachers = json.loads(Path(report["runs"]["teachers"]).read_text())
    _, tok = load_checkpoint(teachers["warm_start"]["checkpoint"])
    with TrajectoryStore(f"sqlite:///{db}") as store:
        evals = [t for t in store.query() if "/cell-" in t.episode_id]
    def first_prompt(t: Any) -> str:  # what the episode showed the model before its first sampled token
        sample = t.samples[0]
        end = sample.loss_mask.index(1) if 1 in sample.loss_mask else len(sample.loss_mask)
        return tok.decode(list(sample.token_ids[:end])).lower()

    shown = {name: [("effort" in first_prompt(t)) for t in evals if f"/{name}/" in t.episode_id]
             for name in ("student", "student_no_message", "baseline")}
    assert len(shown["student"]) == len(shown["student_no_message"]) == 8
    assert all(shown["student"]) and all(shown["baseline"]) and not any(shown["student_no_message"])

    before = (tmp_path / "runs" / "tiny-grid" / "teachers" / "summary.json").stat().st_mtime
    assert main([str(config), "--reuse", "--json", str(tmp_path / "again.json")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["cells"] == report["cells"] and again["stage_seconds"] == {}  # every stage read back, none rerun
    assert (tmp_path / "runs" / "tiny-grid" / "teachers" / "summary.json").stat().st_mtime == before
