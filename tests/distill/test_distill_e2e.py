"""``agentenv distill`` end to end: tiny teachers from a config, a tiny student, real Docker sandboxes and verifiers.

Two MOPD iterations on general/answer_number with efforts low / high / max, with partial rollouts
(K = 1: episodes still running when a batch is cut wait, then continue under the new weights): it
checks the plumbing, not learning (docs/distill.md has the measured run). The
summary has both held-out pass rates and one MOPD row per iteration with the
per-cell metrics of the cells the efforts drew; the metrics are in the store;
every episode was stored once; the rollout policy ended on the last version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agentenv.cli import app
from distill.tiny_grid import write_tiny_grid
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_distill_end_to_end(tmp_path: Path, base_image: str) -> None:
    grid = write_tiny_grid(tmp_path / "teachers", per="domain", hidden_size=32, num_layers=1)
    cfg = {
        "run_id": "test-distill",
        "store": f"sqlite:///{tmp_path / 'store.db'}",
        "out_dir": str(tmp_path / "runs"),
        "rollout": {
            "tasks": {"ids": ["general/answer_number"]},
            "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
            "efforts": {"levels": ["low", "high", "max"]},
            "group_size": 2,
            "sampling": {"temperature": 1.0, "max_new_tokens": 16},
            "staleness": {"max_lag": 1},  # partial rollouts: held during each step, continued under new weights
            "concurrency": 3,
        },
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "init_std": 0.1},
        "sft": {"episodes": 0},
        "rl": {"iterations": 2, "groups_per_iter": 2, "partial_rollouts": True, "partial_oversample": 1,
               "loss": {"is_correction": "mis", "kl_coef": 0.0}},
        "eval": {"seeds": {"start": 9000, "count": 3}},
        "train_seeds": 9000,
        "distill": {"teachers": str(grid.relative_to(tmp_path)), "clip": 5.0, "alpha": 0.1},
    }
    config = tmp_path / "distill.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, ["distill", str(config), "--json", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "last MOPD step, per cell" in result.output

    summary = json.loads(out.read_text())
    assert 0.0 <= summary["pass_rate_after_warm_start"] <= 1.0 and 0.0 <= summary["pass_rate_after_rl"] <= 1.0
    steps = summary["distill"]["steps"]
    assert len(steps) == 2 and summary["final_version"] == 2
    for row in steps:
        cells = {k.split("/cell=")[1] for k in row if "/cell=" in k}
        assert cells and cells <= {"general/low", "general/high", "general/max"}
        assert row["mopd/tokens"] > 0 and row["mopd/kl"] == row["mopd/kl"]  # scored, finite
        assert any(k.startswith("mopd/len/effort=") for k in row)
    for row in summary["rl"]:
        assert "mopd/kl" in row and row.get("grad_norm", 0.0) > 0.0  # the teachers' advantage reached the loss

    with TrajectoryStore(cfg["store"]) as store:
        names = {m.name for m in store.metrics(summary["run_id"])}
        assert {"rl/mopd/kl", "rl/mopd/adv_mean", "rl/mopd/clip_frac", "rl/mopd/clamped", "eval/pass_rate"} <= names
        stored = store.query(run_id=summary["run_id"])
    assert len(stored) == 2 * 2 * 2 + 2 * 3  # 2 iterations x 2 groups x 2 samples, 2 evaluations x 3
    assert len({t.episode_id for t in stored}) == len(stored)

