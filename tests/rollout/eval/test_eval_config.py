"""Sweep files, cell keys, the resume lock (on a real SQLite store), endpoint bounds and `eval compare`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sweep_files import sweep_data, write_sweep
from typer.testing import CliRunner

from rollout.eval.cells import check_lock, plan_cells
from rollout.eval.config import load_sweep, parse_sweep
from rollout.eval.report import write_parquet
from rollout.eval.types import CellKey, EpisodeResult, Outcome, ResumeRefused, SweepConfigError
from rollout.eval.worker import EndpointLimit
from rollout.store import TrajectoryStore
from rollout.types import Status, Trajectory

pytestmark = pytest.mark.unit

TINY = {"name": "tiny", "kind": "checkpoint", "checkpoint": "tiny", "sampling": {"temperature": 1.0}}


def test_bad_fields_are_named_with_the_file(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, sweep_data(tmp_path, harnesses=["claude_code", "cladue"]))
    with pytest.raises(SweepConfigError, match=r"sweep.yaml: harnesses: .*unknown harness \['cladue'\]"):
        load_sweep(path)
    with pytest.raises(SweepConfigError, match=r"efforts: .*unknown effort \['medium'\]"):
        parse_sweep(sweep_data(tmp_path, efforts=["medium"]))
    with pytest.raises(SweepConfigError, match=r"policies\[1\]: url/model: kind .openai. needs both"):
        parse_sweep(sweep_data(tmp_path, policies=[TINY, {"name": "x", "kind": "openai"}]))
    with pytest.raises(SweepConfigError, match=r"policy names must be distinct, got \['a'\]"):
        parse_sweep(sweep_data(tmp_path, policies=[{"name": "a", "kind": "oracle"}, {"name": "a", "kind": "do_nothing"}]))
    with pytest.raises(SweepConfigError, match=r"policies\[0\].kind"):
        parse_sweep(sweep_data(tmp_path, policies=[{"name": "a", "kind": "orcale"}]))
    with pytest.raises(SweepConfigError, match="cannot read the sweep file \\(no such file\\)"):
        load_sweep(tmp_path / "missing.yaml")


def test_cell_keys_hold_everything_that_changes_a_result(tmp_path: Path) -> None:
    cfg = parse_sweep(sweep_data(tmp_path, policies=[TINY], seeds=2, samples=2))
    idents = {"tiny": cfg.policies[0].identity()}
    plan = plan_cells(cfg, ["general/answer_number"], idents)
    assert len(plan) == 2 * 2 * 2 * 2  # seeds x harnesses x efforts x samples
    assert len({req.episode_id for _, req in plan}) == len(plan)
    assert all(req.sampling is not None and req.sampling.temperature == 1.0 for _, req in plan)
    base = CellKey("tiny", "id1", "t", 0, "codex", "high", 0)
    variants = [CellKey("tiny", "id2", "t", 0, "codex", "high", 0), CellKey("tiny", "id1", "t", 0, "codex", "low", 0),
                CellKey("tiny", "id1", "t", 1, "codex", "high", 0), CellKey("tiny", "id1", "t", 0, "bash", "high", 0),
                CellKey("tiny", "id1", "t", 0, "codex", "high", 1)]
    assert len({base.episode_id("s"), *(v.episode_id("s") for v in variants)}) == 6
    hot = parse_sweep(sweep_data(tmp_path, policies=[{**TINY, "sampling": {"temperature": 0.5}}]))
    assert hot.policies[0].identity() != cfg.policies[0].identity()


def test_resume_lock_refuses_changed_results_by_field_and_allows_new_cells(tmp_path: Path) -> None:
    data = sweep_data(tmp_path, policies=[{"name": "oracle", "kind": "oracle"}, TINY])
    cfg = parse_sweep(data)
    store = TrajectoryStore(cfg.store)
    idents = {p.name: p.identity() for p in cfg.policies}
    check_lock(store, cfg, idents, resume=False)
    store.put(Trajectory("x", cfg.sweep_id, "t", "general", 0, "codex", "high", 0, Status.OK, 1.0))
    with pytest.raises(ResumeRefused, match="pass --resume"):
        check_lock(store, cfg, idents, resume=False)
    hot = parse_sweep({**data, "policies": [{"name": "oracle", "kind": "oracle"}, {**TINY, "sampling": {"temperature": 0.7}}]})
    with pytest.raises(ResumeRefused, match=r"policies\[tiny\].sampling.temperature: was 1.0, now 0.7"):
        check_lock(store, hot, {p.name: p.identity() for p in hot.policies}, resume=True)
    with pytest.raises(ResumeRefused, match=r"backend: was 'docker', now 'local'"):
        check_lock(store, parse_sweep({**data, "backend": "local"}), idents, resume=True)
    grown = parse_sweep({**data, "seeds": 4, "policies": [*data["policies"], {"name": "nothing", "kind": "do_nothing"}]})
    lock = check_lock(store, grown, {p.name: p.identity() for p in grown.policies}, resume=True)
    assert set(lock["policies"]) == {"oracle", "tiny", "nothing"}
    store.close()


def test_endpoint_limit_bounds_in_flight_and_backs_off_on_429() -> None:
    async def main() -> EndpointLimit:
        lim = EndpointLimit(3)
        async def one() -> None:
            async with lim.slot():
                await asyncio.sleep(0.01)
        await asyncio.gather(*(one() for _ in range(12)))
        assert lim.peak == 3
        bad = Trajectory("e", "r", "t", "g", 0, "codex", "high", 0, Status.POLICY_ERROR, 0.0,
                         error="p: chat request failed after 4 attempt(s): HTTP 429: slow down")
        lim.feedback(bad)
        lim.feedback(bad)
        assert lim.limit == pytest.approx(3 * 0.8 * 0.8) and lim.throttled == 2
        for _ in range(10):
            lim.feedback(Trajectory("e", "r", "t", "g", 0, "codex", "high", 0, Status.OK, 1.0))
        assert lim.limit == 3.0
        return lim

    asyncio.run(main())


def _result(policy: str, task: str, outcome: Outcome) -> EpisodeResult:
    return EpisodeResult(f"s/{policy}/{task}", policy, "id", task, "general", 0, "codex", "high", 0, "ok", outcome,
                         1.0 if outcome is Outcome.PASSED else 0.0)


def test_eval_compare_command(tmp_path: Path) -> None:
    from agentenv.cli import app

    rows = [_result("a", f"t{i}", Outcome.PASSED if i < 3 else Outcome.FAILED) for i in range(12)]
    rows += [_result("b", f"t{i}", Outcome.PASSED if i < 10 else Outcome.FAILED) for i in range(12)]
    (tmp_path / "run").mkdir()
    write_parquet(rows, tmp_path / "run" / "episodes.parquet")
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(app, ["eval", "compare", "a", "b", "--run", str(tmp_path / "run"), "--json", str(out)])
    assert res.exit_code == 0, res.output
    c = json.loads(out.read_text())
    assert c["pairs"] == 12 and c["b_only"] == 7 and c["a_only"] == 0
    assert c["diff"] == pytest.approx(7 / 12) and c["mcnemar_p"] == pytest.approx(2 / 128)
    assert "B - A" in res.output or "b - a" in res.output
    bad = CliRunner().invoke(app, ["eval", "compare", "a", "zz", "--run", str(tmp_path / "run")])
    assert bad.exit_code == 2 and "no policy 'zz'" in bad.output


def _lock_task(tmp_path: Path, image: str) -> str:
    folder = tmp_path / "locked_task"
    (folder / "tests").mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_text(
        "id: eval/locked_task\ndomain: general\ndescription: a task the resume lock watches\n"
        f"environment: {{image: '{image}'}}\nverifiers:\n  - {{type: answer, expected: '7'}}\n"
    )
    (folder / "instruction.md").write_text("Answer 7.\n")
    (folder / "solution").mkdir(exist_ok=True)
    (folder / "solution" / "solve.sh").write_text("#!/bin/sh\necho 7\n")
    return str(folder)


def test_resume_is_refused_after_a_task_is_edited_naming_the_task(tmp_path: Path) -> None:
    from rollout.eval.cells import task_locks

    cfg = parse_sweep(sweep_data(tmp_path, policies=[{"name": "oracle", "kind": "oracle"}]))
    store = TrajectoryStore(cfg.store)
    idents = {p.name: p.identity() for p in cfg.policies}
    task = _lock_task(tmp_path, "agentenv-base:latest")
    check_lock(store, cfg, idents, resume=False, tasks=task_locks([task, "general/answer_number"], "local"))
    store.put(Trajectory("x", cfg.sweep_id, task, "general", 0, "codex", "high", 0, Status.OK, 1.0))
    check_lock(store, cfg, idents, resume=True, tasks=task_locks([task, "general/answer_number"], "local"))  # unchanged
    (Path(task) / "instruction.md").write_text("Answer 8.\n")
    with pytest.raises(ResumeRefused, match=r"tasks\[.*locked_task\]: the task was edited"):
        check_lock(store, cfg, idents, resume=True, tasks=task_locks([task], "local"))
    store.close()


@pytest.mark.docker
def test_resume_is_refused_after_a_tasks_image_is_rebuilt_naming_the_image(tmp_path: Path, docker_client: object) -> None:
    import io

    from rollout.eval.cells import record_images, task_locks

    tag = f"agentenv-optout-lock:{tmp_path.name[-12:].lower().replace('_', '-')}"

    def build(label: str) -> str:
        dockerfile = f"FROM agentenv-base:latest\nLABEL agentenv.test.lock={label}\n".encode()
        image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)  # type: ignore[attr-defined]
        return str(image.id)

    cfg = parse_sweep(sweep_data(tmp_path, policies=[{"name": "oracle", "kind": "oracle"}]))
    store = TrajectoryStore(cfg.store)
    idents = {p.name: p.identity() for p in cfg.policies}
    task = _lock_task(tmp_path, tag)
    try:
        lock = check_lock(store, cfg, idents, resume=False, tasks=task_locks([task], "docker"))
        assert lock["tasks"][task]["image_id"] is None  # not built yet: recorded once it is
        first = build("one")
        record_images(store, cfg, task_locks([task], "docker"))
        store.put(Trajectory("x", cfg.sweep_id, task, "general", 0, "codex", "high", 0, Status.OK, 1.0))
        lock = check_lock(store, cfg, idents, resume=True, tasks=task_locks([task], "docker"))
        assert lock["tasks"][task]["image_id"] == first
        assert build("two") != first
        with pytest.raises(ResumeRefused, match=rf"tasks\[.*locked_task\]: image '{tag}' was rebuilt"):
            check_lock(store, cfg, idents, resume=True, tasks=task_locks([task], "docker"))
    finally:
        store.close()
        docker_client.images.remove(tag, force=True)  # type: ignore[attr-defined]
