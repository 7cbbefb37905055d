"""The teachers-train config and the budgets' summary: errors name the file and the field; b0 is the median."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.types import Sample, Status, Trajectory
from teachers.budgets import BudgetError, budget_requests, summarize
from teachers.train import TeacherTrainConfig
from teachers.types import TeacherConfigError

pytestmark = pytest.mark.unit

GOOD: dict[str, Any] = {"domains": {"general": ["general/count_lines"]}, "efforts": {"low": {"tau": 0.5}, "max": {"tau": 2}}}


def _load(tmp_path: Path, data: dict[str, Any]) -> TeacherTrainConfig:
    path = tmp_path / "teachers.yaml"
    path.write_text(yaml.safe_dump(data))
    return TeacherTrainConfig.load(path)


def test_a_good_config_loads_with_its_cells_and_relative_budgets(tmp_path: Path) -> None:
    cfg = _load(tmp_path, {**GOOD, "budgets": "b.json"})
    assert cfg.cells == [("general", "low"), ("general", "max")] and cfg.budgets == str(tmp_path / "b.json")
    tc = cfg.train_config("x", cfg.warm_start, cfg.expert.rl, ["low"], {"message": False})
    assert tc.rollout.tasks.ids == ("general/count_lines",) and tc.rollout.efforts.levels == ("low",)


def test_a_level_override_changes_only_that_levels_experts(tmp_path: Path) -> None:
    cfg = _load(tmp_path, {**GOOD, "expert": {"rl": {"iterations": 4, "groups_per_iter": 2},
                                              "by_effort": {"max": {"rl": {"iterations": 1}, "sft": {"steps": 5}, "lr": 1e-4}}}})
    sft, rl, lr = cfg.expert.for_level("max")
    assert (rl.iterations, rl.groups_per_iter, sft.steps, lr) == (1, 2, 5, 1e-4)
    assert cfg.expert.for_level("low") == (cfg.expert.sft, cfg.expert.rl, None)
    tc = cfg.train_config("x", sft, rl, ["max"], {"message": False}, trainer={"lr": lr})
    assert tc.trainer.lr == 1e-4 and tc.rl.iterations == 1


@pytest.mark.parametrize(("change", "message"), [
    ({"domains": {}}, r"domains: expected at least one domain"),
    ({"domains": {"general": []}}, r"domains: domain 'general' has no task ids"),
    ({"efforts": {"medium": {"tau": 1}}}, r"efforts: expected effort levels among low, high, max"),
    ({"efforts": {"low": {"tau": 0}}}, r"efforts.low.tau: Input should be greater than 0"),
    ({"base": {"rl": {"iterations": 3}}}, r"base: 'rl' is set by the recipe per phase"),
    ({"base": {"rollout": {"tasks": {"ids": ["x"]}}}}, r"base: rollout.tasks comes from domains: / efforts:"),
    ({"base": {"model": {"hiden_size": 3}}}, r"base.model.hiden_size: Extra inputs are not permitted"),
    ({"warm_start": {"steps": -1}}, r"warm_start.steps: Input should be greater than or equal to 0"),
    ({"expert": {"rl": {"iterations": 1, "loss": {"nope": 1}}}}, r"expert.rl.loss.nope: Extra inputs are not permitted"),
    ({"expert": {"by_effort": {"high": {"rl": {"iterations": 1}}}}}, r"expert.by_effort: level 'high' is not one of efforts"),
    ({"expert": {"by_effort": {"max": {"rl": {"iteratons": 1}}}}}, r"expert: by_effort.max: iteratons: Extra inputs"),
    ({"expert": {"by_effort": {"max": {"lr": 0}}}}, r"expert.by_effort.max.lr: Input should be greater than 0"),
])
def test_config_errors_name_the_file_and_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(TeacherConfigError, match=r"teachers.yaml: " + message):
        _load(tmp_path, {**GOOD, **change})


def test_unreadable_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TeacherConfigError, match=r"nope.yaml: cannot read the teachers config"):
        TeacherTrainConfig.load(tmp_path / "nope.yaml")


def _traj(eid: str, task: str, sampled: int, effort: str, status: Status = Status.OK, reward: float = 1.0) -> Trajectory:
    mask = (0, 0) + (1,) * sampled
    sample = Sample(tuple(range(len(mask))), (0.0,) * len(mask), mask)
    return Trajectory(episode_id=eid, run_id="r", task_id=task, domain="general", seed=0, harness="codex", effort=effort,
                      policy_version=0, status=status, reward=reward, samples=(sample,))


def test_b0_is_the_median_of_the_scorable_episodes() -> None:
    trajs = [_traj("a", "t", 10, "low"), _traj("b", "t", 30, "high", reward=0.0), _traj("c", "t", 20, "max"),
             _traj("d", "t", 1000, "max", status=Status.ERROR)]  # infrastructure: says nothing of the policy
    budgets = summarize(trajs, checkpoint="ckpt")
    assert budgets.budgets == {"t": 20} and budgets.checkpoint == "ckpt"
    d = budgets.detail["t"]
    assert (d.n, d.median, d.p25, d.p75, d.mean) == (3, 20, 15, 25, 20)
    assert d.pass_rate == pytest.approx(2 / 3) and d.by_effort == {"high": 30, "low": 10, "max": 20}
    with pytest.raises(BudgetError, match=r"task 'u': none of its 1 episodes is scorable \(statuses: \['error'\]\)"):
        summarize([_traj("e", "u", 5, "low", status=Status.ERROR)])


def test_budget_requests_rotate_harness_and_effort_and_hide_the_message_when_asked() -> None:
    reqs = budget_requests(["t"], run_id="r", seeds=range(4), harnesses=["codex", "kimi_code"], efforts=["low", "max"],
                           show_effort=False)
    assert [(r.harness, r.effort, r.show_effort) for r in reqs] == [
        ("codex", "low", False), ("kimi_code", "max", False), ("codex", "low", False), ("kimi_code", "max", False)]
    assert len({r.sampling.seed for r in reqs if r.sampling}) == 4 and all(r.thinking_budget is None for r in reqs)
