"""Effort RL in the engine: the reward rule per effort level, the budgets file, the config's errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from learner.advantages import items_from_groups
from learner.effort import Budgets, EffortShaping, TaskBudget, episode_tokens, request_fields, shaping_from
from learner.errors import LearnerConfigError
from learner.train_config import EffortConfig, TrainConfig, load_train_config
from learner.types import AdvantageConfig
from rollout.types import Sample, Status, Trajectory

pytestmark = pytest.mark.unit


def _traj(eid: str, reward: float, sampled: int, effort: str, task: str = "general/t", inserted: int = 0) -> Trajectory:
    """A trajectory with ``sampled`` sampled tokens (mask 1) after a 3-token prompt and ``inserted`` forced ones."""
    n = 3 + sampled + inserted
    mask = (0, 0, 0) + (1,) * sampled + (0,) * inserted
    sample = Sample(tuple(range(n)), (0.0,) * n, mask)
    return Trajectory(episode_id=eid, run_id="r", task_id=task, domain="general", seed=0, harness="codex", effort=effort,
                      policy_version=0, status=Status.OK, reward=reward, samples=(sample,))


def test_tokens_count_what_the_policy_sampled_not_what_it_inserted() -> None:
    assert episode_tokens(_traj("a", 1.0, sampled=7, effort="low", inserted=2)) == 7


def test_effort_reward_per_level_hand_case() -> None:
    # b0 = 20; low tau 0.5 -> limit 10, max tau 2.0 -> limit 40.
    # rewards: a low 8 tokens pass -> 1; b low 12 pass -> -1 (over); c max 30 pass -> 1; d max 41 pass -> -1; e max 5 fail -> 0
    shaping = EffortShaping({"general/t": 20}, {"low": 0.5, "max": 2.0})
    group = [_traj("a", 1.0, 8, "low"), _traj("b", 1.0, 12, "low"), _traj("c", 1.0, 30, "max"),
             _traj("d", 1.0, 41, "max"), _traj("e", 0.0, 5, "max")]
    items = items_from_groups([group], AdvantageConfig(estimator="dr_grpo"), **shaping.kwargs())
    shaped = [1.0, -1.0, 1.0, -1.0, 0.0]
    mean = sum(shaped) / 5
    assert [it.advantage for it in items] == pytest.approx([r - mean for r in shaped])
    assert shaping.over_budget(group) == pytest.approx(2 / 5)
    assert shaping.limit(group[0]) == 10.0 and shaping.limit(_traj("z", 1.0, 1, "low", task="other")) is None


def test_effort_reward_at_the_limit_keeps_the_task_reward() -> None:
    shaping = EffortShaping({"general/t": 10}, 1.5)  # one factor for every level: limit 15
    group = [_traj("a", 1.0, 15, "high"), _traj("b", 1.0, 16, "high")]
    items = items_from_groups([group], AdvantageConfig(estimator="reinforce"), **shaping.kwargs())
    assert [it.advantage for it in items] == [1.0, -1.0]


def test_without_shaping_the_rewards_are_the_task_rewards() -> None:
    group = [_traj("a", 1.0, 500, "low"), _traj("b", 0.0, 5, "low")]
    assert [it.advantage for it in items_from_groups([group], AdvantageConfig(estimator="reinforce"))] == [1.0, 0.0]


def test_a_level_without_tau_is_an_error_naming_it() -> None:
    shaping = EffortShaping({"general/t": 10}, {"low": 0.5})
    with pytest.raises(LearnerConfigError, match=r"effort.tau: no factor for effort level 'max' of episode x"):
        shaping.tau_of(_traj("x", 1.0, 3, "max"))


def _budgets(**kw: Any) -> dict[str, Any]:
    detail = TaskBudget(n=4, median=20, p25=18, p75=22, mean=20.5, pass_rate=0.5).model_dump()
    return {"format": "agentenv-budgets/1", "budgets": {"general/t": 20}, "detail": {"general/t": detail}, **kw}


def test_budgets_file_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    Budgets.model_validate(_budgets()).save(path)
    assert Budgets.load(path).budgets == {"general/t": 20}
    with pytest.raises(LearnerConfigError, match=r"nope.json: cannot read the budgets file .*agentenv teachers budgets"):
        Budgets.load(tmp_path / "nope.json")
    path.write_text("{")
    with pytest.raises(LearnerConfigError, match=r"b.json: not valid JSON"):
        Budgets.load(path)
    path.write_text(json.dumps(_budgets(budgets={"general/t": "many"})))
    with pytest.raises(LearnerConfigError, match=r"b.json: budgets.general/t: "):
        Budgets.load(path)
    path.write_text(json.dumps(_budgets(budgets={"general/t": 0})))
    with pytest.raises(LearnerConfigError, match=r"b.json: budgets.general/t: expected a budget of at least 1 token, got 0"):
        Budgets.load(path)
    path.write_text(json.dumps(_budgets(format="other/2")))
    with pytest.raises(LearnerConfigError, match=r"b.json: format: "):
        Budgets.load(path)


def test_shaping_from_config_checks_every_task_has_a_budget(tmp_path: Path) -> None:
    path = Budgets.model_validate(_budgets()).save(tmp_path / "b.json")
    assert shaping_from(EffortConfig(), ["general/t"]) is None
    shaping = shaping_from(EffortConfig(budgets=str(path), tau=1.0), ["general/t"])
    assert shaping is not None and shaping.budgets == {"general/t": 20}
    with pytest.raises(LearnerConfigError, match=r"b.json: budgets: no budget for task 'agent/x' \(the file has general/t\)"):
        shaping_from(EffortConfig(budgets=str(path), tau=1.0), ["general/t", "agent/x"])


def _cfg(effort: dict[str, Any], levels: list[str] | None = None, **extra: Any) -> TrainConfig:
    rollout = {"tasks": {"ids": ["general/t"]}, "efforts": {"levels": levels if levels is not None else ["low", "high", "max"]}}
    return TrainConfig.model_validate({"run_id": "r", "rollout": rollout, "effort": effort, **extra})


@pytest.mark.parametrize(("effort", "levels", "extra", "message"), [
    ({"budgets": "b.json"}, None, {}, r"effort.tau: the effort reward needs both budgets and tau; only budgets is given"),
    ({"tau": 1.0}, None, {}, r"effort.budgets: the effort reward needs both budgets and tau; only tau is given"),
    ({"budgets": "b.json", "tau": {"low": 0.5, "high": 1.0}}, None, {},
     r"effort.tau: no factor for effort level 'max' of rollout.efforts.levels"),
    ({"budgets": "b.json", "tau": {"low": 0.5, "huge": 1.0}}, ["low"], {},
     r"effort.tau: level 'huge' is not one of rollout.efforts.levels \['low'\]"),
    ({"max_thinking_tokens": {"medium": 3}}, None, {}, r"effort.max_thinking_tokens: level 'medium' is not one of"),
    ({"budgets": "b.json", "tau": -1.0}, None, {}, r"effort.tau: expected factors > 0"),
    ({"max_thinking_tokens": 0}, None, {}, r"effort.max_thinking_tokens: expected at least 1 token, got 0"),
    ({"budgets": "b.json", "tau": 1.0}, None, {"rl": {"advantage": {"effort_tau": 2.0}}},
     r"rl.advantage: effort_tau: 2.0 is not read here; the effort reward's factor has one home, effort.tau"),
    ({"message": False}, [], {}, r"effort.message: false hides an effort message, but rollout.efforts.levels is empty"),
    ({"budget": "b.json"}, None, {}, r"effort.budget: Extra inputs are not permitted"),
])
def test_effort_config_errors_name_the_file_and_field(
    tmp_path: Path, effort: dict[str, Any], levels: list[str] | None, extra: dict[str, Any], message: str,
) -> None:
    rollout = {"tasks": {"ids": ["general/t"]}, "efforts": {"levels": levels if levels is not None else ["low", "high", "max"]}}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({"run_id": "r", "rollout": rollout, "effort": effort, **extra}))
    with pytest.raises(LearnerConfigError, match="^" + re.escape(str(path)) + ": " + message):
        load_train_config(path)


def test_requests_carry_the_level_cap_and_the_message_choice() -> None:
    cfg = _cfg({"max_thinking_tokens": {"low": 4, "high": 32}, "message": False}).effort
    assert request_fields(cfg, "low") == {"thinking_budget": 4, "show_effort": False}
    assert request_fields(cfg, "max") == {"thinking_budget": None, "show_effort": False}
    assert request_fields(cfg, "low", "oracle_effort")["thinking_budget"] is None  # the oracle samples nothing
    assert _cfg({"max_thinking_tokens": 16}).effort.thinking_budget("high") == 16
    assert _cfg({}).effort.thinking_budget("high") is None
