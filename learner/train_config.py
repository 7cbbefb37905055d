"""The training run's config (``agentenv train CONFIG``): one YAML, validated before anything starts.

Why its own model rather than ``rollout.config.RolloutConfig``: a training run
has phases (warm start, RL, evaluation) with their own seeds, sampling and
optimiser settings; the rollout parts it shares (task selection, harness
rotation, effort draws) are the same pydantic types, so a field means the same
thing in both files.

Seeds: warm start and RL draw variant seeds from ``train_seeds`` (a range
starting at 0); evaluation uses ``eval.seeds``, which must be disjoint from the
training range (checked here), so the held-out pass rate is measured on
variants no training step ever saw, and on the same ones at every evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from learner.errors import LearnerConfigError
from learner.types import AdvantageConfig, LossConfig
from rollout.config import EffortDraw, TaskSelection
from rollout.harnesses.rotation import RotationPolicy

__all__ = ["EvalConfig", "ModelConfig", "RLConfig", "SFTConfig", "TrainConfig", "load_train_config"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Model):
    """A fresh tiny Qwen2-shaped model (``checkpoint: null``) or a local checkpoint directory."""

    checkpoint: str | None = None
    hidden_size: int = Field(default=64, ge=8)
    num_layers: int = Field(default=2, ge=1)
    num_heads: int = Field(default=4, ge=1)
    num_kv_heads: int = Field(default=2, ge=1)
    init_std: float = Field(default=0.02, gt=0.0)
    sliding_window: int | None = Field(default=None, ge=1, description="local attention span of the layers after the first full_attention_layers")
    full_attention_layers: int | None = Field(default=None, ge=0, description="leading full-attention layers (default 1) when sliding_window is set")
    seed: int = 0


class SFTConfig(_Model):
    """Warm start: cross-entropy on the assistant tokens of oracle episodes (one per train seed)."""

    episodes: int = Field(default=24, ge=0, description="oracle episodes rendered through the rotated harnesses")
    steps: int = Field(default=20, ge=0)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=3e-3, gt=0.0)


class RLConfig(_Model):
    """RL iterations: ``groups_per_iter`` task variants x ``group_size`` samples, then learner steps."""

    iterations: int = Field(default=10, ge=0)
    groups_per_iter: int = Field(default=4, ge=1)
    group_size: int = Field(default=8, ge=2)
    temperature: float = Field(default=1.0, gt=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    lr: float = Field(default=1e-3, gt=0.0)
    updates_per_iter: int = Field(default=1, ge=1, description="optimizer steps on each batch (minibatches)")
    continue_sft_optimizer: bool = Field(
        default=False, description="start RL's AdamW from the warm start's moments (a fresh Adam's first steps move every weight by ~lr)"
    )
    max_lag: int = Field(default=1, ge=0, description="staleness K: train only on policy_version >= version - K")
    loss: LossConfig = LossConfig.dapo()
    advantage: AdvantageConfig = AdvantageConfig()


class EvalConfig(_Model):
    """Held-out evaluation: the same seeds and tasks every time, greedy (temperature 0) by default.

    With ``temperature > 0`` the pass rate is pass@1 at that temperature (one
    sampled episode per held-out variant), the policy as RL deploys it;
    ``greedy_too`` adds the same episodes at temperature 0 as a second number.
    """

    seeds: tuple[int, ...] = tuple(range(10_000, 10_024))
    every: int = Field(default=0, ge=0, description="also evaluate every N RL iterations; 0: only before/after")
    temperature: float = Field(default=0.0, ge=0.0)
    greedy_too: bool = Field(default=False, description="when temperature > 0, also run the same episodes greedily")

    @field_validator("seeds", mode="before")
    @classmethod
    def _range(cls, v: Any) -> Any:
        if isinstance(v, dict):  # {start: 10000, count: 24}
            return tuple(range(int(v["start"]), int(v["start"]) + int(v["count"])))
        return v


class TrainConfig(_Model):
    """Everything one ``agentenv train`` run needs; see ``examples/quickstart.yaml`` for a commented one."""

    run_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    store: str | None = None
    out_dir: str = "runs"
    tasks: TaskSelection = TaskSelection(tags=("quickstart",))
    rotation: RotationPolicy = RotationPolicy(kind="round_robin")
    efforts: EffortDraw = EffortDraw(levels=("low", "high", "max"))
    train_seeds: int = Field(default=5000, ge=1, description="training variant seeds are 0 .. train_seeds-1")
    model: ModelConfig = ModelConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    eval: EvalConfig = EvalConfig()
    max_new_tokens: int = Field(default=128, ge=1, description="per-turn sampling cap")
    stop_at_call_end: bool = Field(
        default=True, description="end a sampled turn at the first </tool_call> (one call per turn), as agent RL loops do"
    )
    concurrency: int = Field(default=4, ge=1, description="episodes in flight in the rollout runner")
    pool_size: int = Field(default=2, ge=1)
    backend: str = Field(default="docker", pattern=r"^(docker|local)$")
    torch_threads: int = Field(default=2, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _disjoint(self) -> TrainConfig:
        overlap = [s for s in self.eval.seeds if 0 <= s < self.train_seeds]
        if overlap:
            raise LearnerConfigError(
                f"eval.seeds: expected none of the training seeds 0..{self.train_seeds - 1}, "
                f"got an overlap: {overlap[:5]}"
            )
        return self

    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.run_id


def load_train_config(path: str | Path, **overrides: Any) -> TrainConfig:
    """Read and validate a YAML config; errors name the file and the field (``LearnerConfigError``, a ``ConfigError``)."""
    source = Path(path)
    try:
        data = yaml.safe_load(source.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise LearnerConfigError(f"{source}: expected a readable YAML file, got {exc}") from exc
    seed = overrides.pop("seed", None)
    data.update({k: v for k, v in overrides.items() if v is not None})
    if seed is not None:  # one number re-seeds the run: model init, seed draws, sampling
        data["seed"] = seed
        data["model"] = {**(data.get("model") or {}), "seed": seed}
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise LearnerConfigError(f"{source.name}: {where}: {first['msg']}") from None
