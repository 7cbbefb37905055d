"""Same config, same ``--seed``, same run: ``agentenv train`` twice on a tiny config (real Docker
sandboxes, every harness) stores the same token ids for every episode and logs the same losses.

The two runs differ in their run ids (they hold the start time) and in wall-clock timings; nothing
of either may reach a prompt, a sampling seed or a draw. What this found: the episode seeds once came
from the run id, and codex's observations once showed each command's measured wall time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agentenv.cli import app
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TINY = {
    "rollout": {
        "tasks": {"ids": ["general/count_lines_eof"]},
        "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
        "efforts": {"levels": ["low", "high", "max"]},
        "group_size": 3,
        "sampling": {"temperature": 1.0, "max_new_tokens": 24},
        "staleness": {"max_lag": 0},
        "concurrency": 3,
    },
    "trainer": {"lr": 1e-3, "deterministic": True},
    "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
    "sft": {"episodes": 6, "steps": 3, "batch_size": 3},
    "rl": {"iterations": 2, "groups_per_iter": 2, "updates_per_iter": 1},
    "eval": {"seeds": {"start": 9000, "count": 3}, "every": 0, "temperature": 1.0},
    "train_seeds": 9000,
}


def _run(tmp_path: Path, name: str, seed: int) -> tuple[dict[str, tuple[int, ...]], list[tuple[str, int, float]]]:
    db = tmp_path / f"{name}.db"
    cfg = dict(TINY, run_id=name, seed=seed, store=f"sqlite:///{db}", out_dir=str(tmp_path / name))
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(app, ["train", str(tmp_path / f"{name}.yaml"), "--json", str(tmp_path / f"{name}.json")])
    assert result.exit_code == 0, result.output + repr(result.exception)
    with TrajectoryStore(f"sqlite:///{db}") as store:
        stored = store.query()
        run_id = stored[0].run_id
        # every number the run logged but its timings (the warm start's losses, the RL rows, the evals)
        losses = sorted((m.name, m.step, m.value) for m in store.metrics(run_id) if not m.name.endswith("_s"))
    # the episode's key without the run id: phase/task/seed/k
    tokens = {t.episode_id.split("/", 1)[1]: tuple(i for s in t.samples for i in s.token_ids) for t in stored}
    return tokens, losses


def test_the_same_seed_is_the_same_run(tmp_path: Path, base_image: str) -> None:
    a_tokens, a_losses = _run(tmp_path, "a", seed=3)
    b_tokens, b_losses = _run(tmp_path, "b", seed=3)
    assert a_tokens.keys() == b_tokens.keys() and len(a_tokens) == 6 + 4 * 3 + 2 * 3  # oracle, RL (2 iterations x 2 groups of 3), eval before and after
    differ = sorted(k for k in a_tokens if a_tokens[k] != b_tokens[k])
    assert not differ, f"{len(differ)} of {len(a_tokens)} episodes stored different tokens: {differ[:5]}"
    assert sum(name == "sft/loss" for name, _, _ in a_losses) == 3 and any(n.startswith("rl/") for n, _, _ in a_losses)
    assert a_losses == b_losses  # bitwise
    c_tokens, _ = _run(tmp_path, "c", seed=4)
    assert any(c_tokens.get(k) != v for k, v in a_tokens.items() if k.startswith("rl")), "another seed samples differently"
