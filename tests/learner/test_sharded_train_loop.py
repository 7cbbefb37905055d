"""``python -m learner.job`` with ``trainer.world_size: 2``: the training run on the sharded learner (two CPU
ranks over gloo, Ray actors), a rank killed mid-run, then ``--resume``. Real Docker sandboxes, the tiny model.

The killed rank fails the run with an error naming it (exit 3, not a hang); the resumed run reaches the same
final iteration from the last checkpoint with no episode stored or trained twice, and its checkpoint's
Hugging Face export loads with ``from_pretrained``."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from learner_jobs import start_learner_job
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.docker, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = {
    "run_id": "sharded-test",
    "rollout": {
        "tasks": {"ids": ["general/answer_number"]},
        "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
        "efforts": {"levels": ["low", "high", "max"]},
        "group_size": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 16},
        "staleness": {"max_lag": 0},
        "concurrency": 2,
        "pool_size": 1,
    },
    "trainer": {"lr": 1e-3, "micro_batch_tokens": 4096, "logprobs_at_loss_tokens": True, "world_size": 2,
                "distributed_timeout_s": 60},
    "model": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1},
    "sft": {"episodes": 2, "steps": 2, "batch_size": 2},
    "rl": {"iterations": 4, "groups_per_iter": 1, "loss": {"kl_coef": 0.05}},
    "eval": {"seeds": {"start": 9000, "count": 2}},
    "train_seeds": 9000,
    "torch_threads": 2,
    "checkpoint": {"every": 1, "keep": 2},
}


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [root]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _rank_pids(root: int) -> list[int]:
    pids = []
    for pid in _descendants(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("ray::LearnerRank"):
            pids.append(pid)
    return pids


def test_a_killed_rank_stops_the_run_and_resume_finishes_it_exactly_once(tmp_path: Path, base_image: str) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG | {"store": store_url, "out_dir": str(tmp_path / "runs")}))
    checkpoints = tmp_path / "runs" / "sharded-test" / "checkpoints"

    first = start_learner_job(cfg)
    deadline = time.time() + 600
    while time.time() < deadline and first.poll() is None:
        latest = checkpoints / "LATEST"
        if latest.is_file() and latest.read_text().strip() >= "iter-000002":
            break
        time.sleep(0.2)
    assert first.poll() is None, f"the run ended before a rank could be killed:\n{first.communicate()[0][-3000:]}"
    ranks = _rank_pids(first.pid)
    assert len(ranks) == 2, ranks
    os.kill(ranks[1], signal.SIGKILL)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 3, out[-4000:]
    assert "of 2 died" in out or "of 2 failed" in out, out[-4000:]
    killed_at = (checkpoints / "LATEST").read_text().strip()

    summary_path = tmp_path / "summary.json"
    second = start_learner_job(cfg, "--resume", "--json", str(summary_path))
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-6000:]
    assert "resumed sharded-test-" in out, out[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["final_version"] == 4 and [r["iteration"] for r in summary["rl"]] == [1, 2, 3, 4], summary["rl"]
    assert summary["trained_episodes"] == summary["trained_unique"] == 4 * 2, summary  # none twice
    with TrajectoryStore(store_url) as store:
        ids = [t.episode_id for t in store.query(run_id=summary["run_id"])]
    assert len(ids) == len(set(ids)) == 2 + 4 * 2 + 2 * 2, sorted(ids)  # every planned episode stored once

    from transformers import AutoModelForCausalLM

    latest = checkpoints / (checkpoints / "LATEST").read_text().strip()
    assert latest.name == "iter-000004" and killed_at < latest.name
    assert (latest / "trainer" / "dcp" / ".metadata").is_file()
    model = AutoModelForCausalLM.from_pretrained(latest / "trainer" / "model", local_files_only=True)
    assert model.config.hidden_size == 32
