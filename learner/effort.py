"""Effort levels in training: the per-task budget file, the effort-RL reward rule, the per-episode caps.

Kimi K3's effort RL gives a trajectory ``y`` of prompt ``x`` at effort level ``e``::

    r(y) = -1               if T(y) > tau_e * b0(x)
           R_task(y)        otherwise

``b0(x)`` is the task's budget, measured once on the cold-start model
(``agentenv teachers budgets``, ``teachers/budgets.py``, which writes the file
read here); ``tau_e`` is the level's factor; ``T(y)`` counts the tokens the
policy *sampled* in the whole episode, every turn and every tool call's
arguments (the agentic count: an agent spends its effort in calls as much as in
thinking). Tokens the policy inserted (a thinking budget's forced close tag,
loss mask 0) are not the model's spending and are not counted.

The rule itself is ``learner.advantages.effort_override``; this module gives
the engine what it needs to apply it per trajectory (``budget_of``, ``tau_of``,
``tokens_of`` for ``items_from_groups``) and what each episode request carries
(the level's thinking cap, whether the prompt shows the effort message).

>>> budgets = Budgets.load("runs/teachers/budgets.json")        # doctest: +SKIP
>>> budgets.budgets["general/count_lines"]
61
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentenv.configs import validate_config

from learner.errors import LearnerConfigError
from rollout.types import Trajectory

__all__ = ["BUDGETS_FORMAT", "Budgets", "EffortShaping", "TaskBudget", "episode_tokens", "request_fields", "shaping_from"]

BUDGETS_FORMAT: Literal["agentenv-budgets/1"] = "agentenv-budgets/1"


def episode_tokens(t: Trajectory) -> int:
    """T(y): every token the policy sampled in the episode (loss mask 1), all turns and samples."""
    return sum(s.num_sampled for s in t.samples)


class TaskBudget(BaseModel):
    """How one task's b0 was measured: ``n`` cold-start episodes, their token counts' quantiles."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(ge=1)
    median: float
    p25: float
    p75: float
    mean: float
    pass_rate: float = Field(ge=0.0, le=1.0)
    by_effort: dict[str, float] = Field(default_factory=dict, description="median tokens per effort level measured")


class Budgets(BaseModel):
    """The budgets file: ``budgets[task_id] = b0`` (tokens), with how each was measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["agentenv-budgets/1"] = BUDGETS_FORMAT
    measure: str = "median sampled tokens per episode (T(y)) of the cold-start model, over its episodes of the task"
    checkpoint: str = ""
    temperature: float = 1.0
    budgets: dict[str, int]
    detail: dict[str, TaskBudget] = Field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Budgets:
        """Read a budgets file; a bad one is a ``LearnerConfigError`` naming the file and the field."""
        where = Path(path)
        try:
            data = json.loads(where.read_text(encoding="utf-8"))
        except OSError as exc:
            raise LearnerConfigError(f"{where}: cannot read the budgets file ({exc.strerror or exc}); "
                                     "write one with `agentenv teachers budgets`") from None
        except json.JSONDecodeError as exc:
            raise LearnerConfigError(f"{where}: not valid JSON: {exc}") from None
        budgets = validate_config(cls, data, source=str(where), error=LearnerConfigError, what="budgets fields")
        bad = [k for k, v in budgets.budgets.items() if v < 1]
        if bad:
            raise LearnerConfigError(f"{where}: budgets.{bad[0]}: expected a budget of at least 1 token, "
                                     f"got {budgets.budgets[bad[0]]}")
        return budgets

    def save(self, path: str | os.PathLike[str]) -> Path:
        where = Path(path)
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return where

    def require(self, task_ids: Sequence[str], *, source: str) -> None:
        """Every task of the run needs a budget; the error names the file and the missing task."""
        missing = [t for t in task_ids if t not in self.budgets]
        if missing:
            raise LearnerConfigError(
                f"{source}: budgets: no budget for task {missing[0]!r} (the file has {', '.join(sorted(self.budgets)) or 'none'}); "
                "measure it with `agentenv teachers budgets`"
            )


@dataclass(frozen=True)
class EffortShaping:
    """The effort reward's inputs per trajectory, for ``learner.advantages.items_from_groups``.

    ``tau`` is one factor for every trajectory, or one per effort level (a
    trajectory's ``effort`` picks it; a level without one is an error naming it).
    """

    budgets: Mapping[str, int]
    tau: float | Mapping[str, float]
    source: str = "budgets"

    def budget_of(self, t: Trajectory) -> int | None:
        return self.budgets.get(t.task_id)

    def tau_of(self, t: Trajectory) -> float:
        if not isinstance(self.tau, Mapping):
            return float(self.tau)
        try:
            return float(self.tau[t.effort])
        except KeyError:
            raise LearnerConfigError(
                f"effort.tau: no factor for effort level {t.effort!r} of episode {t.episode_id} "
                f"(levels given: {', '.join(self.tau)})"
            ) from None

    def limit(self, t: Trajectory) -> float | None:
        """tau_e * b0(x): the token count over which the trajectory earns -1 (None: unbudgeted)."""
        b0 = self.budget_of(t)
        return None if b0 is None else self.tau_of(t) * b0

    def kwargs(self) -> dict[str, Callable[[Trajectory], Any]]:
        """The keyword arguments ``items_from_groups`` takes for the rule."""
        return {"budget_of": self.budget_of, "tau_of": self.tau_of, "tokens_of": episode_tokens}

    def over_budget(self, trajectories: Sequence[Trajectory]) -> float:
        """The fraction of trajectories over their limit (the share the rule set to -1)."""
        limits = [(episode_tokens(t), self.limit(t)) for t in trajectories]
        counted = [n > lim for n, lim in limits if lim is not None]
        return sum(counted) / len(counted) if counted else 0.0


def shaping_from(effort: Any, task_ids: Sequence[str]) -> EffortShaping | None:
    """The run's ``EffortShaping`` from its ``effort:`` config (``None``: no effort reward).

    The budgets file is read and checked against the run's tasks now, so a
    missing budget fails before any episode runs.
    """
    if effort.budgets is None or effort.tau is None:
        return None
    budgets = Budgets.load(effort.budgets)
    budgets.require(task_ids, source=str(effort.budgets))
    return EffortShaping(budgets.budgets, effort.tau, source=str(effort.budgets))


def request_fields(effort_cfg: Any, effort: str | None, policy: str = "train") -> dict[str, Any]:
    """What an ``EpisodeRequest`` at ``effort`` carries of the ``effort:`` config: its thinking cap (model
    policies only) and whether the prompt shows the effort message."""
    sampled = not policy.startswith("oracle")
    return {"thinking_budget": effort_cfg.thinking_budget(effort) if sampled else None, "show_effort": effort_cfg.message}
