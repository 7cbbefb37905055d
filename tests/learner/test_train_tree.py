"""``agentenv train`` with tree rollouts on a tiny config (real Docker, real verifiers): the plumbing only.

Each RL group is one root forked after its first turn into two continuations (``rollout.branching``),
with resume from snapshots on: every planned leaf is stored once with its branch record, the leaf's
token prefix is its root's, and the rl rows carry the group costs.
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
    "run_id": "test-train-tree",
    "rollout": {
        "tasks": {"ids": ["general/answer_number"]},
        # bash: a text turn does not end the episode, so the tiny model's roots reach their branch point
        "rotation": {"kind": "round_robin", "harnesses": ["bash"]},
        "efforts": {"levels": ["low", "high"]},
        "group_size": 2,
        "branching": {"kind": "fixed", "turns": [0], "k": 2},
        "resume_from_snapshots": True,
        "sampling": {"temperature": 1.0, "max_new_tokens": 16},
        "staleness": {"max_lag": 0},
        "concurrency": 2,
    },
    "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
    "sft": {"episodes": 2, "steps": 1, "batch_size": 2},
    # the learner side of a tree configured as a user would (learner.tree); the random tiny model earns 0, so no
    # step runs here: shared == unshared training is tested in tests/learner/test_tree.py
    "rl": {"iterations": 2, "groups_per_iter": 1, "updates_per_iter": 1, "advantage": {"estimator": "grpo", "tree": True}},
    "trainer": {"lr": 1e-3, "micro_batch_tokens": 4096, "logprobs_at_loss_tokens": True, "prefix_sharing": True},
    "eval": {"seeds": {"start": 9000, "count": 2}, "every": 0, "temperature": 1.0, "greedy_too": False},
    "train_seeds": 9000,
}


def test_train_with_tree_rollouts(tmp_path: Path, base_image: str) -> None:
    db = tmp_path / "store.db"
    cfg = dict(TINY, store=f"sqlite:///{db}", out_dir=str(tmp_path / "runs"))
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "summary.json"
    result = CliRunner().invoke(app, ["train", str(tmp_path / "train.yaml"), "--json", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    summary = json.loads(out.read_text())
    assert all(row["leaves_per_group"] == 2 for row in summary["rl"]), summary["rl"]
    assert all(row["gen_tokens_per_group"] > 0 and row["learner_tokens_per_group"] > 0 for row in summary["rl"])
    with TrajectoryStore(f"sqlite:///{db}") as store:
        rl = [t for t in store.query(run_id=summary["run_id"]) if "/rl" in t.episode_id]
    assert len(rl) == 4 and len({t.episode_id for t in rl}) == 4, [t.episode_id for t in rl]  # 2 groups x 2 leaves, once
    roots = {t.episode_id: t for t in rl if not t.verifier["branch"]["parent"]}
    leaves = [t for t in rl if t.verifier["branch"]["parent"]]
    assert len(roots) == len(leaves) == 2 and all(t.episode_id.endswith("/b0.1") for t in leaves)
    assert any(not t.verifier["branch"]["failed"] for t in leaves), [t.verifier["branch"] for t in leaves]
    for leaf in leaves:
        root, b = roots[leaf.verifier["branch"]["parent"]], leaf.verifier["branch"]
        if b["failed"]:  # the root submitted at turn 0: the leaf ran whole, and says so
            assert b["prefix_turns"] == 0
            continue
        n = b["prefix_tokens"]
        assert leaf.samples[0].token_ids[:n] == root.samples[0].token_ids[:n] and leaf.harness == root.harness
        assert leaf.turns[0] == root.turns[0] and b["snapshot"] and b["turn"] == 0
