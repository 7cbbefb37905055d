"""``agentenv train`` end to end on a tiny config: real Docker sandboxes, real verifiers, a couple of minutes.

It checks the plumbing, not learning (the quickstart's numbers are measured by
running ``examples/quickstart.yaml``): the JSON summary has both held-out pass
rates with their splits, the curve and the report exist, the metrics are in the
store, every episode of every phase was stored once, and the rollout policy
ended on the learner's last version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agentenv.cli import app
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TINY = {
    "run_id": "test-train",
    "rollout": {
        "tasks": {"ids": ["general/answer_number"]},
        "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
        "efforts": {"levels": ["low", "high", "max"]},
        "group_size": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 16},
        "staleness": {"max_lag": 0},
        "concurrency": 3,
    },
    "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
    "sft": {"episodes": 3, "steps": 2, "batch_size": 2},
    "rl": {"iterations": 2, "groups_per_iter": 1, "updates_per_iter": 1, "loss": {"kl_coef": 0.05}},
    "eval": {"seeds": {"start": 9000, "count": 3}, "every": 1, "temperature": 1.0, "greedy_too": True},
    "train_seeds": 9000,
}


def test_train_end_to_end(tmp_path: Path, base_image: str) -> None:
    db = tmp_path / "store.db"
    cfg = dict(TINY, store=f"sqlite:///{db}", out_dir=str(tmp_path / "runs"))
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "train.yaml"), "--json", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)

    summary = json.loads(out.read_text())
    for key in ("pass_rate_after_warm_start", "pass_rate_after_rl"):
        assert 0.0 <= summary[key] <= 1.0
    for when in ("after_warm_start", "after_rl"):
        assert set(summary[when]["by_harness"]) <= {"claude_code", "codex", "kimi_code"}
        assert summary[when]["by_effort"] and summary[when]["n"] == 3
    assert [e["iteration"] for e in summary["evals"]] == [0, 1, 2]  # every=1: before, between, after
    assert Path(summary["learning_curve_png"]).read_bytes()[:4] == b"\x89PNG"
    report = Path(summary["report_md"]).read_text()
    assert "pass rate after RL" in report and "greedy (temperature 0, same episodes)" in report
    for key in ("pass_rate_greedy_after_warm_start", "pass_rate_greedy_after_rl"):
        assert 0.0 <= summary[key] <= 1.0

    run_id = summary["run_id"]
    with TrajectoryStore(f"sqlite:///{db}") as store:
        names = {m.name for m in store.metrics(run_id)}
        assert {"sft/loss", "eval/pass_rate", "eval/pass_rate_greedy", "rl/pass_rate"} <= names
        assert any(n.startswith("eval/pass_rate/harness=") for n in names)
        stored = store.query(run_id=run_id)
    # 3 oracle + 2 x 2 RL + 3 x 3 eval episodes, sampled and greedy, each stored once
    assert len(stored) == 3 + 4 + 2 * 9
    assert sum("/eval_greedy" in t.episode_id for t in stored) == 9
    assert len({t.episode_id for t in stored}) == len(stored)
    rl = [t for t in stored if "/rl" in t.episode_id]
    assert all(t.samples and t.samples[0].logprobs for t in rl)
    # The rollout policy ended on the learner's last version: versions only grow, by at most one per
    # RL update, and every episode of a phase ran on the version published before that phase began.
    versions = [e["version"] for e in summary["evals"]]
    rl_cfg = TINY["rl"]
    assert versions == sorted(versions) and versions[0] == 0, versions  # the warm start publishes version 0
    assert versions[-1] == rl_cfg["iterations"], versions  # one published version per RL iteration
    assert summary["final_version"] == versions[-1]

    def ran_on(phase: str) -> set[int]:
        return {t.policy_version for t in stored if f"/{phase}/" in t.episode_id}

    for i, version in enumerate(versions):
        assert ran_on(f"eval{i}") == ran_on(f"eval_greedy{i}") == {version}, (i, versions)
    assert ran_on("rl1") == {versions[0]} and ran_on("rl2") == {versions[1]}, versions
