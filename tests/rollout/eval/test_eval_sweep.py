"""Sweeps for real: Ray workers, Docker sandboxes, the SQLite store. Every planned cell stored exactly once,
the references score 1.0 and 0.0, the outputs load, and a resume runs only what is missing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sweep_files import sweep_data

from rollout.eval.config import parse_sweep
from rollout.eval.report import load_results, write_outputs
from rollout.eval.runner import run_sweep
from rollout.eval.types import Outcome, ResumeRefused
from rollout.store import TrajectoryStore

pytestmark = [pytest.mark.ray, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]


def stored_once(cfg: Any, planned: list[str]) -> None:
    with TrajectoryStore(cfg.store) as store:
        ids = Counter(t.episode_id for t in store.iter_trajectories(run_id=cfg.sweep_id))
    assert sorted(ids) == sorted(planned) and set(ids.values()) == {1}


def test_sweep_references_outputs_resume_and_refusals(local_ray: Any, tmp_path: Path) -> None:
    cfg = parse_sweep(sweep_data(tmp_path))
    run = run_sweep(cfg)
    assert run.complete and len(run.results) == 2 * 2 * 2 * 2  # policies x tasks x harnesses x efforts
    planned = [r.episode_id for r in run.results]
    stored_once(cfg, planned)
    by = {p: {r.outcome for r in run.results if r.policy == p} for p in ("oracle", "nothing")}
    assert by == {"oracle": {Outcome.PASSED}, "nothing": {Outcome.FAILED}}, [(r.episode_id, r.status, r.error) for r in run.results]
    assert {(r.harness, r.effort) for r in run.results} == {(h, e) for h in ("claude_code", "codex") for e in ("low", "high")}
    assert all(r.tool_calls >= 1 for r in run.results if r.policy == "oracle")

    doc = write_outputs(run, cfg.out_dir)
    out = cfg.out_dir
    saved = json.loads((out / "results.json").read_text())
    assert saved["by_policy"]["oracle"]["pass_rate"] == 1.0 and saved["by_policy"]["nothing"]["pass_rate"] == 0.0
    assert saved["by_policy"]["oracle"]["n"] == 8 and saved["by_policy"]["oracle"]["infrastructure"] == 0
    assert {r["effort"] for r in doc["effort_frontier"]} == {"low", "high"}
    for png in ("heatmap_task_harness_oracle.png", "heatmap_task_harness_nothing.png", "heatmap_domain_effort.png",
                "frontier_tokens_score.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| oracle | 8 | 1.00" in (out / "report.md").read_text()
    import datasets
    import pandas as pd

    df = pd.read_parquet(out / "episodes.parquet")
    assert len(df) == 16 and set(df["outcome"]) == {"passed", "failed"}
    ds = datasets.load_dataset("parquet", data_files=str(out / "episodes.parquet"), split="train")
    assert ds.num_rows == 16 and "thinking_tokens" in ds.column_names
    assert sorted(r.episode_id for r in load_results(out)) == sorted(planned)

    # without --resume an existing sweep is refused; with it and nothing new, nothing runs
    with pytest.raises(ResumeRefused, match="--resume"):
        run_sweep(cfg)
    again = run_sweep(cfg, resume=True)
    assert again.counters["ran"] == 0 and again.complete
    # more seeds and another effort: only the new cells run
    grown = parse_sweep(sweep_data(tmp_path, sweep_id=cfg.sweep_id, seeds=2, efforts=["low", "high", "max"]))
    more = run_sweep(grown, resume=True)
    assert more.complete and len(more.results) == 2 * 2 * 2 * 3 * 2
    assert more.counters["skipped"] == 16 and more.counters["ran"] == 48 - 16
    stored_once(grown, [r.episode_id for r in more.results])
    # a changed field that changes stored results is refused by name
    with pytest.raises(ResumeRefused, match=r"grading: was 'in_place', now 'fork'"):
        run_sweep(parse_sweep(sweep_data(tmp_path, sweep_id=cfg.sweep_id, grading="fork")), resume=True)


def test_model_policies_local_checkpoint_and_agentenv_serve_through_openai(local_ray: Any, tmp_path: Path) -> None:
    from rollout.policy.hf import HFPolicy
    from rollout.policy.models import save_checkpoint, tiny_model
    from rollout.serve import create_app, serve_in_thread

    ckpt = tmp_path / "ckpt"
    save_checkpoint(*tiny_model(seed=0), ckpt)
    sampling = {"temperature": 1.0, "max_new_tokens": 16}
    with serve_in_thread(create_app(HFPolicy(str(ckpt)), "tiny")) as url:
        data = sweep_data(tmp_path, tasks={"ids": ["general/count_lines"]}, efforts=["high"], harnesses=["codex"], workers=1, concurrency=4, policies=[
            {"name": "ckpt", "kind": "checkpoint", "checkpoint": str(ckpt), "sampling": sampling},
            {"name": "served", "kind": "openai", "url": url, "model": "tiny", "max_concurrency": 1, "sampling": sampling},
        ])
        cfg = parse_sweep(data)
        run = run_sweep(cfg)
    assert run.complete and len(run.results) == 2
    assert all(r.outcome is not Outcome.INFRASTRUCTURE for r in run.results), [(r.policy, r.status, r.error) for r in run.results]
    ck = [r for r in run.results if r.policy == "ckpt"]
    sv = [r for r in run.results if r.policy == "served"]
    assert all(r.completion_tokens > 0 and r.prompt_tokens > 0 for r in ck)  # token-exact: counted on our side
    assert all(r.completion_tokens > 0 and r.prompt_tokens > 0 for r in sv)  # chat: the server's prompt token ids
    assert run.counters["endpoints"][f"{url}#tiny"]["peak"] == 1  # the endpoint bound held
    with TrajectoryStore(cfg.store) as store, store.engine.connect() as conn:
        from sqlalchemy import select

        from rollout.store import RunRow

        lock = conn.execute(select(RunRow.config).where(RunRow.run_id == cfg.sweep_id)).scalar_one()
    assert lock["policies"]["served"]["version"] == 0 and len(lock["policies"]["ckpt"]["weights"]) == 16
