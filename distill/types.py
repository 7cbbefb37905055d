"""The distillation contract: the MOPD config, the run config around it, and the errors.

``agentenv distill CONFIG`` reads one YAML: a training run's fields (``run_id``,
``rollout``, ``trainer``, ``model``, ``sft``, ``rl``, ``eval``, ...: a
``learner.train_config.TrainConfig``, the same engine and the same meaning) plus
one ``distill:`` section, ``MOPDConfig``::

    distill:
      teachers: grids/tiny.yaml      # a teachers.grid file (relative to this config), or the grid inline
      clip: 5.0                      # R: A_t = clip(sg(logp_teacher - logp_student), -R, R)
      alpha: 0.0                     # + alpha * A_outcome (rl.advantage over each group's rewards)
      student_logprobs: learner      # or rollout: the sampling-time logprobs (needs temperature 1)
      teacher_device: cpu

What the section does not repeat: the loss (``rl.loss``, the learner's one
loss; set ``is_correction: mis`` for masked importance weights), sampling
(``rollout.sampling``) and the effort draws (``rollout.efforts``), which the
grid must cover (checked when the run starts, naming the field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentenv.configs import read_yaml, validate_config

from learner.errors import LearnerConfigError
from learner.train_config import TrainConfig
from rollout.config import ConfigError
from teachers.types import UnknownCell

__all__ = [
    "DistillConfig", "DistillConfigError", "DistillError", "MOPDConfig", "UnroutableSample", "load_distill_config",
]


class DistillError(Exception):
    """Base of every error this package raises."""


class DistillConfigError(DistillError, ConfigError):
    """A distill config is malformed or does not fit its grid; the message names the file and the field."""


class UnroutableSample(DistillError, UnknownCell):
    """A sample's (domain, effort) cell has no teacher; the message names the cell, the episode and the grid."""


class MOPDConfig(BaseModel):
    """The ``distill:`` section; see the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    teachers: str | dict[str, Any] = Field(description="a teachers.grid YAML path (relative to the config) or the grid inline")
    clip: float = Field(default=5.0, gt=0.0, description="R: the per-token advantage is clipped to [-R, R]")
    alpha: float = Field(default=0.0, ge=0.0, description="weight of the group-normalised outcome advantage")
    student_logprobs: Literal["learner", "rollout"] = Field(
        default="learner",
        description="learner: the learner's current weights score the sampled tokens at temperature 1 (one forward "
        "per batch; right for partial rollouts sampled by several versions); rollout: the sampling-time logprobs",
    )
    teacher_device: str = Field(default="cpu", description="torch device of the local teacher backends")
    teacher_context: Literal["without_effort", "student"] = Field(
        default="without_effort",
        description="without_effort: the teacher scores after the harness render without the effort message (only the "
        "student sees it; for teachers trained without it); student: after the student's own prompt, effort message "
        "included (for teachers that were trained seeing it; the ablation)",
    )


class DistillConfig(TrainConfig):
    """A training run whose advantages come from teachers: ``TrainConfig`` plus ``distill: MOPDConfig``."""

    distill: MOPDConfig

    @model_validator(mode="after")
    def _mopd(self) -> DistillConfig:
        if not self.rollout.efforts.levels:
            raise LearnerConfigError(
                "rollout.efforts.levels: MOPD routes each sample to its (domain, effort) teacher, so every episode needs "
                "an effort level; got none"
            )
        if self.distill.student_logprobs == "rollout" and self.rollout.sampling.temperature != 1.0:
            raise LearnerConfigError(
                f"distill.student_logprobs: 'rollout' takes the sampling-time logprobs, which are at "
                f"rollout.sampling.temperature={self.rollout.sampling.temperature}, but teachers score at temperature 1; "
                "use 'learner' or sample at 1.0"
            )
        return self


def load_distill_config(path: str | Path, **overrides: Any) -> tuple[DistillConfig, Path]:
    """Read and validate a distill YAML; returns the config and the folder relative paths resolve against.

    Errors are ``DistillConfigError`` (a ``rollout.config.ConfigError``) naming the file and the field.
    ``overrides`` (``store``, ``run_id``, ``seed``) replace top-level fields when not None.
    """
    source = Path(path)
    data = read_yaml(source, error=DistillConfigError)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DistillConfigError(f"{source}: expected a mapping of config fields, got {type(data).__name__}")
    seed = overrides.pop("seed", None)
    data.update({k: v for k, v in overrides.items() if v is not None})
    if seed is not None:  # one number re-seeds the run, as agentenv train --seed does
        data["seed"] = seed
        data["model"] = {**(data.get("model") or {}), "seed": seed}
    if "distill" not in data:
        raise DistillConfigError(f"{source}: distill: missing; expected a section with at least 'teachers'")
    cfg = validate_config(DistillConfig, data, source=str(source), error=DistillConfigError)
    return cfg, source.parent
