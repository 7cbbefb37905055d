"""``agentenv teachers train`` end to end on tiny models: real Docker sandboxes and verifiers, a couple of minutes.

Plumbing, not learning (the measured grid is in docs/teachers.md): one shared
warm start, budgets measured on it, one expert per cell trained from it with its
cell's effort level (its budget, tau and thinking cap in the requests and the
reward), checkpoints that ``teachers.grid`` loads as the grid, and cells that
actually differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from agentenv.cli import app
from learner.effort import Budgets
from rollout.policy.models import load_checkpoint
from rollout.store import TrajectoryStore
from teachers.grid import TeacherGridConfig, build_scorer
from teachers.types import ScoreRequest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TINY = {
    "name": "tiny-teachers",
    "domains": {"general": ["general/count_lines"]},
    "efforts": {"low": {"tau": 0.8, "max_thinking_tokens": 2}, "max": {"tau": 2.0}},
    "budget_seeds": 3,
    "base": {
        "rollout": {"rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
                    "group_size": 2, "sampling": {"temperature": 1.0, "max_new_tokens": 24}, "staleness": {"max_lag": 0},
                    "concurrency": 3},
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
        "eval": {"seeds": {"start": 9000, "count": 3}, "temperature": 1.0},
        "train_seeds": 9000,
    },
    "warm_start": {"episodes": 6, "steps": 3, "batch_size": 3},
    "expert": {"sft": {"episodes": 3, "steps": 2, "batch_size": 3}, "rl": {"iterations": 1, "groups_per_iter": 1}},
}


def test_teachers_train_end_to_end(tmp_path: Path, base_image: str) -> None:
    db = tmp_path / "store.db"
    cfg = dict(TINY, store=f"sqlite:///{db}", out_dir=str(tmp_path / "runs"))
    (tmp_path / "teachers.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, ["teachers", "train", str(tmp_path / "teachers.yaml"), "--json", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    summary = json.loads(out.read_text())

    budgets = Budgets.load(summary["budgets_file"])
    assert set(budgets.budgets) == {"general/count_lines"} and budgets.detail["general/count_lines"].n == 3
    assert [r["cell"] for r in summary["cells"]] == ["general/low", "general/max"]
    for row in summary["cells"]:
        for phase in ("init", "after_sft", "expert"):
            assert 0.0 <= row[phase]["pass_rate"] <= 1.0 and row[phase]["n"] == 3
        assert len(row["rl"]) == 1 and "over_budget" in row["rl"][0]  # the effort reward was on

    # One shared warm start: every expert's first evaluation ran the warm start's weights.
    warm, _ = load_checkpoint(summary["warm_start"]["checkpoint"])
    experts = {r["cell"]: load_checkpoint(r["checkpoint"])[0] for r in summary["cells"]}
    a, b = (dict(m.named_parameters()) for m in experts.values())
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the two cells are not copies
    assert any(not torch.equal(a[k], dict(warm.named_parameters())[k]) for k in a)

    _, tok = load_checkpoint(summary["warm_start"]["checkpoint"])
    with TrajectoryStore(f"sqlite:///{db}") as store:
        runs = {r["cell"]: store.query(run_id=r["run_id"]) for r in summary["cells"]}
    for cell, trajs in runs.items():
        effort = cell.split("/")[1]
        assert trajs and {t.effort for t in trajs} == {effort}  # every episode of the cell at its level
        demos = [tok.decode(list(t.samples[0].token_ids)) for t in trajs if "/sft/" in t.episode_id]
        assert demos and all(("<think>Plan:" in d) == (effort == "max") for d in demos)  # the cell's style
        assert not any("Reasoning" in d or "effort" in d.lower() for d in demos)  # no effort message

    grid = TeacherGridConfig.load(summary["grid"])
    assert grid.cell_keys == ["general/low", "general/max"] and grid.efforts["low"].max_thinking_tokens == 2
    scorer = build_scorer(grid)
    ids = tuple(range(1, 12))
    low_lp, max_lp = scorer.score([ScoreRequest("general/low", ids, (5, 6)), ScoreRequest("general/max", ids, (5, 6))])
    assert low_lp.logprobs != max_lp.logprobs
