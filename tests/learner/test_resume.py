"""``agentenv train CONFIG --resume`` after a SIGKILL: the same final iteration, no episode stored or trained
twice, the checkpoint loadable by ``from_pretrained``. Real Docker sandboxes, the tiny model, in-process.

Asynchronous (K = 1), so the checkpoint holds groups in flight: the resumed run submits them again and
reads back the ones the killed run had already stored."""

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

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = {
    "run_id": "resume-test",
    "rollout": {
        "tasks": {"ids": ["general/answer_number"]},
        "rotation": {"kind": "round_robin", "harnesses": ["claude_code", "codex", "kimi_code"]},
        "efforts": {"levels": ["low", "high", "max"]},
        "group_size": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 16},
        "staleness": {"max_lag": 1},
        "concurrency": 2,
        "pool_size": 1,
    },
    "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
    "sft": {"episodes": 2, "steps": 2, "batch_size": 2},
    "rl": {"iterations": 4, "groups_per_iter": 2, "loss": {"kl_coef": 0.05}},
    "eval": {"seeds": {"start": 9000, "count": 2}},
    "train_seeds": 9000,
    "torch_threads": 1,
    "checkpoint": {"every": 1, "keep": 2},
}


def test_a_killed_run_resumes_to_the_same_final_iteration_exactly_once(tmp_path: Path, base_image: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG | {"store": store_url, "out_dir": str(tmp_path / "runs")}))
    checkpoints = tmp_path / "runs" / "resume-test" / "checkpoints"

    first = start_learner_job(cfg)
    deadline = time.time() + 600
    while time.time() < deadline and first.poll() is None:
        latest = checkpoints / "LATEST"
        if latest.is_file() and latest.read_text().strip() >= "iter-000002":
            break
        time.sleep(0.2)
    assert first.poll() is None, f"the run ended before it could be killed:\n{first.communicate()[0][-3000:]}"
    os.killpg(first.pid, signal.SIGKILL)  # no cleanup of any kind: a lost machine
    first.wait(timeout=60)
    killed_at = (checkpoints / "LATEST").read_text().strip()

    summary_path = tmp_path / "summary.json"
    second = start_learner_job(cfg, "--resume", "--json", str(summary_path))
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-6000:]
    assert "resumed resume-test-" in out, out[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["final_version"] == 4 and [r["iteration"] for r in summary["rl"]] == [1, 2, 3, 4], summary["rl"]
    assert [e["iteration"] for e in summary["evals"]] == [0, 4]
    stale = sum(r["dropped_stale"] for r in summary["rl"])
    assert summary["trained_episodes"] == summary["trained_unique"] == 4 * 2 * 2 - stale, summary  # none twice
    assert all(r["max_lag"] <= 1 for r in summary["rl"]), summary["rl"]

    with TrajectoryStore(store_url) as store:
        stored = store.query(run_id=summary["run_id"])
    ids = [t.episode_id for t in stored]
    assert len(ids) == len(set(ids)) == 2 + 4 * 2 * 2 + 2 * 2, sorted(ids)  # every planned episode stored once

    latest = checkpoints / (checkpoints / "LATEST").read_text().strip()
    assert latest.name == "iter-000004" and killed_at < latest.name
    model = AutoModelForCausalLM.from_pretrained(latest / "trainer" / "model", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(latest / "trainer" / "model", local_files_only=True)
    assert model.config.hidden_size == 32 and tok.encode("hello")
    assert sorted(p.name for p in checkpoints.glob("iter-*")) == ["iter-000003", "iter-000004"]  # keep: 2
