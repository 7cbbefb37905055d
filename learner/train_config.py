"""The training run's config (``agentenv train CONFIG``): one YAML, validated before anything starts.

Built from the parts' own configs instead of re-declaring their fields:
``rollout:`` is a ``rollout.config.RolloutSettings`` (tasks, harness rotation,
effort draws, sampling, group size, the staleness bound K, fault budgets, and
the fleet: backend, workers, concurrency, pool size, grading, Ray placement;
the same field means the same thing in a rollout job, an eval sweep and a
training run) and ``trainer:`` is a ``learner.types.TrainerConfig``
(optimizer, schedule, micro-batching, device precision and every GPU fast-path
option ``benches.learner_gpu`` measures). What is the training run's own: the
phases (``sft``, ``rl``, ``eval``), the model, the runner, checkpoints, and ``serving:``
(``learner.types.ServingConfig``): inference servers the train turns are sampled on, each learner
version published to them (``learner.serving``).

A setting two parts both read is given once; a second, conflicting one is an
error naming both fields, never silently rewritten: ``rl.loss.temperature``
(the temperature the loss recomputes logprobs at) must equal
``rollout.sampling.temperature`` (what the rollouts sampled at) and is taken
from it when unset. What a rollout job has and a training run gives from its
own fields is not in ``rollout:`` (``rollout_job`` builds the job's config from
them): ``run_id`` and ``store`` are the run's, variant seeds are drawn from
``train_seeds`` (and ``eval.seeds``), and the policy is the learner's model.
The effort reward's factor is ``effort.tau`` (``rl.advantage.effort_tau`` is
refused, naming it).

Seeds: warm start and RL draw variant seeds from ``train_seeds`` (a range
starting at 0); evaluation uses ``eval.seeds``, which must be disjoint from the
training range (checked here), so the held-out pass rate is measured on
variants no training step ever saw, and on the same ones at every evaluation.

Modes, by the staleness bound K = ``rollout.staleness.max_lag``: K = 0 is the
synchronous loop; K >= 1 samples the next K iterations' groups while the
learner trains; ``rl.partial_rollouts`` (K >= 1) instead holds rollouts during
each learner step and carries unfinished episodes into the next iteration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentenv.configs import read_yaml, validate_config
from learner.errors import LearnerConfigError
from learner.types import AdvantageConfig, LossConfig, ServingConfig, TrainerConfig
from rollout.config import RolloutConfig, RolloutSettings
from rollout.store import DEFAULT_URL

__all__ = [
    "CheckpointConfig", "EffortConfig", "EvalConfig", "ModelConfig", "RLConfig", "SFTConfig", "TrainConfig", "load_train_config",
]


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
    device: str = Field(default="cpu", description="the learner's torch device (cuda, cuda:1, cpu)")
    rollout_device: str = Field(default="cpu", description="where the rollout policy's copy samples (in-process and Ray workers)")


class SFTConfig(_Model):
    """Warm start: cross-entropy on the assistant tokens of oracle episodes (one per train seed)."""

    episodes: int = Field(default=24, ge=0, description="oracle episodes rendered through the rotated harnesses")
    steps: int = Field(default=20, ge=0)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=3e-3, gt=0.0)
    variant_seeds: int | None = Field(
        default=None, ge=1, description="draw the warm start's variant seeds from 0 .. variant_seeds-1 only (a task's "
        "simpler family, e.g. general/count_lines_eof's tidy seeds < 1000); None: the whole train_seeds range",
    )


class RLConfig(_Model):
    """RL iterations: ``groups_per_iter`` task variants x ``rollout.group_size`` samples, then learner steps.

    Sampling (temperature, top_p, max_new_tokens) is ``rollout.sampling``; the
    optimizer (lr, warmup, ...) is ``trainer``; the staleness bound K is
    ``rollout.staleness.max_lag``.
    """

    iterations: int = Field(default=10, ge=0)
    groups_per_iter: int = Field(default=4, ge=1)
    updates_per_iter: int = Field(default=1, ge=1, description="optimizer steps on each batch (minibatches)")
    continue_sft_optimizer: bool = Field(
        default=False, description="start RL's AdamW from the warm start's moments (a fresh Adam's first steps move every weight by ~lr)"
    )
    partial_rollouts: bool = Field(
        default=False, description="cut each iteration's batch when groups_per_iter groups are done; hold the rest "
        "during the learner step and continue them under the new weights (needs rollout.staleness.max_lag >= 1)",
    )
    partial_oversample: int = Field(default=2, ge=0, description="partial_rollouts: groups in flight beyond groups_per_iter")
    loss: LossConfig = LossConfig.dapo()
    advantage: AdvantageConfig = AdvantageConfig()

    @field_validator("advantage")
    @classmethod
    def _one_tau(cls, v: AdvantageConfig) -> AdvantageConfig:
        if v.effort_tau is not None:
            raise LearnerConfigError(
                f"effort_tau: {v.effort_tau} is not read here; the effort reward's factor has one home, effort.tau "
                "(beside effort.budgets): move it there"
            )
        return v


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


class EffortConfig(_Model):
    """Effort levels in training (Kimi K3 effort RL; ``learner.effort``, ``docs/teachers.md``).

    ``budgets`` (a file from ``agentenv teachers budgets``: b0 per task) with
    ``tau`` turns on the effort reward in RL: ``-1 if T(y) > tau * b0(x) else
    R_task``. ``tau`` is one number or one per effort level; it is the factor's one
    home in a run's config (``rl.advantage.effort_tau`` is refused, naming it).
    ``max_thinking_tokens`` (one number or per level) closes the model's
    thinking after that many tokens per turn in every sampled episode (RL and
    evaluation). ``message: false`` renders prompts without the effort message
    (an expert trained for one cell, which scores without it too).
    ``oracle_styles`` makes the warm start's demonstrations follow each
    episode's effort level: low = the call, high = a short plan then the call,
    max = plan, call, then a verifying call.
    """

    budgets: str | None = Field(default=None, description="budgets file (JSON, b0 per task id)")
    tau: float | dict[str, float] | None = None
    max_thinking_tokens: int | dict[str, int] | None = None
    message: bool = True
    oracle_styles: bool = False

    def thinking_budget(self, effort: str | None) -> int | None:
        """The thinking cap of an episode at ``effort`` (None: uncapped)."""
        caps = self.max_thinking_tokens
        return caps.get(effort or "") if isinstance(caps, dict) else caps


class CheckpointConfig(_Model):
    """Resume points: after every ``every`` RL iterations, ``out_dir/run_id/checkpoints/iter-NNNNNN``
    (model in Hugging Face format, optimizer, scheduler, RNG, data position, pending groups);
    the newest ``keep`` are kept. ``every: 0`` writes none (and ``--resume`` can only restart)."""

    every: int = Field(default=1, ge=0)
    keep: int = Field(default=2, ge=1)


class TrainConfig(_Model):
    """Everything one ``agentenv train`` run needs; see ``examples/quickstart.yaml`` for a commented one."""

    run_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    store: str | None = None
    out_dir: str = "runs"
    runner: Literal["inprocess", "ray"] = Field(
        default="inprocess", description="where episodes run: this process (the embedded default), or Ray workers"
    )
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    serving: ServingConfig | None = Field(
        default=None, description="sample train turns on these inference servers and publish each version to them "
        "(learner.serving); None: a copy of the model in this process (or on each Ray worker)",
    )
    trainer: TrainerConfig = TrainerConfig(lr=1e-3, micro_batch_tokens=4096, logprobs_at_loss_tokens=True)
    train_seeds: int = Field(default=5000, ge=1, description="training variant seeds are 0 .. train_seeds-1")
    model: ModelConfig = ModelConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    effort: EffortConfig = EffortConfig()
    stop_at_call_end: bool = Field(
        default=True, description="end a sampled turn at the first </tool_call> (one call per turn), as agent RL loops do"
    )
    torch_threads: int = Field(default=2, ge=1)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _one_place_each(cls, data: Any) -> Any:
        """What a rollout job's config has and a training run gives from its own fields: named when given in ``rollout:``."""
        if not isinstance(data, dict) or not isinstance(data.get("rollout"), dict):
            return data
        for key, home in (("run_id", "the run's own run_id"), ("store", "the run's own store"),
                          ("seeds", "train_seeds (and eval.seeds): training draws variant seeds from them"),
                          ("policy", "the learner's own model (model:): training samples from it, in this process, or "
                                     "on inference servers given under serving: (urls, model)")):
            if key in data["rollout"]:
                raise LearnerConfigError(f"rollout.{key}: not a setting of a training run's rollout: section; it is {home}; "
                                         "remove it")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        overlap = [s for s in self.eval.seeds if 0 <= s < self.train_seeds]
        if overlap:
            raise LearnerConfigError(
                f"eval.seeds: expected none of the training seeds 0..{self.train_seeds - 1}, "
                f"got an overlap: {overlap[:5]}"
            )
        sampled = self.rollout.sampling.temperature
        if "temperature" in self.rl.loss.model_fields_set and self.rl.loss.temperature != sampled:
            raise LearnerConfigError(
                f"rl.loss.temperature: {self.rl.loss.temperature} conflicts with rollout.sampling.temperature: "
                f"{sampled}; the loss must score tokens at the temperature they were sampled at: set one"
            )
        if sampled <= 0:
            raise LearnerConfigError(
                "rollout.sampling.temperature: RL samples need a temperature > 0 (their logprobs are trained on), got 0"
            )
        if self.rollout.branching.on and self.runner == "ray":
            raise LearnerConfigError(
                "rollout.branching: tree rollouts need a root and its leaves in one process (runner: inprocess); "
                "on Ray workers they would be split (not done yet): set runner: inprocess or branching.kind: off"
            )
        if self.rollout.group_size < 2:
            raise LearnerConfigError(
                f"rollout.group_size: group-relative advantages need >= 2 samples per variant, got {self.rollout.group_size}"
            )
        if self.rl.partial_rollouts and self.rollout.staleness.max_lag < 1:
            raise LearnerConfigError(
                "rl.partial_rollouts: an episode continued under the next weights is one version behind, so it needs "
                f"rollout.staleness.max_lag >= 1, got {self.rollout.staleness.max_lag}"
            )
        self._check_effort()
        self._check_sharded_learner()
        if self.serving is not None and self.runner != "inprocess":
            raise LearnerConfigError(
                f"serving: episodes through servers run in the learner's process (runner: inprocess); got runner: "
                f"{self.runner!r}: drop one of them"
            )
        return self

    # ---- the sharded learner (trainer.world_size; learner.group) ----
    def _check_sharded_learner(self) -> None:
        if self.trainer.world_size is None:
            return
        if self.model.device not in ("cpu", "cuda"):
            raise LearnerConfigError(f"model.device: with trainer.world_size each rank gets its own device from Ray; "
                                     f"give 'cpu' or 'cuda', got {self.model.device!r}")

    def _check_effort(self) -> None:
        effort, levels = self.effort, self.rollout.efforts.levels
        if (effort.budgets is None) != (effort.tau is None):
            given, missing = ("budgets", "tau") if effort.tau is None else ("tau", "budgets")
            raise LearnerConfigError(f"effort.{missing}: the effort reward needs both budgets and tau; only {given} is given")
        taus = effort.tau.values() if isinstance(effort.tau, dict) else [] if effort.tau is None else [effort.tau]
        if any(t <= 0 for t in taus):
            raise LearnerConfigError(f"effort.tau: expected factors > 0, got {effort.tau}")
        caps = effort.max_thinking_tokens
        if any(c < 1 for c in (caps.values() if isinstance(caps, dict) else [] if caps is None else [caps])):
            raise LearnerConfigError(f"effort.max_thinking_tokens: expected at least 1 token, got {caps}")
        for name in ("tau", "max_thinking_tokens"):
            per = getattr(self.effort, name)
            unknown = [lv for lv in per if lv not in levels] if isinstance(per, dict) else []
            if unknown:
                raise LearnerConfigError(f"effort.{name}: level {unknown[0]!r} is not one of rollout.efforts.levels "
                                         f"{list(levels)}")
        if isinstance(self.effort.tau, dict):
            uncovered = [lv for lv in levels if lv not in self.effort.tau] or ([] if levels else ["(no level)"])
            if uncovered:
                raise LearnerConfigError(f"effort.tau: no factor for effort level {uncovered[0]!r} of rollout.efforts.levels "
                                         f"{list(levels)}; give one per level, or one number")
        if not self.effort.message and not levels:
            raise LearnerConfigError("effort.message: false hides an effort message, but rollout.efforts.levels is empty")

    @property
    def trajectory_store(self) -> str:
        """The trajectory store's URL: ``store``, else the default SQLite file."""
        return self.store or DEFAULT_URL

    def rollout_job(self, run_id: str | None = None) -> RolloutConfig:
        """The rollout job this run's episodes are: ``rollout:`` with the run's id (``run_id``: a phase's own) and store."""
        return RolloutConfig(**dict(self.rollout), run_id=run_id or self.run_id, store=self.trajectory_store)

    @property
    def max_lag(self) -> int:
        """The staleness bound K: no trained sample is more than K versions behind the learner."""
        return self.rollout.staleness.max_lag

    def loss_config(self) -> LossConfig:
        """``rl.loss`` at the rollouts' sampling temperature (checked equal above when given)."""
        return self.rl.loss.model_copy(update={"temperature": self.rollout.sampling.temperature})

    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.run_id


def load_train_config(path: str | Path, **overrides: Any) -> TrainConfig:
    """Read and validate a YAML config; errors name the file and the field (``LearnerConfigError``, a ``ConfigError``).

    ``overrides`` replace top-level fields when not None; ``seed`` re-seeds the whole run (``seed`` and ``model.seed``).
    """
    data = read_yaml(path, error=LearnerConfigError)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LearnerConfigError(f"{path}: expected a mapping of config fields, got {type(data).__name__}")
    seed = overrides.pop("seed", None)
    data.update({k: v for k, v in overrides.items() if v is not None})
    if seed is not None:  # one number re-seeds the run: model init, seed draws, sampling
        data["seed"] = seed
        data["model"] = {**(data.get("model") or {}), "seed": seed}
    return validate_config(TrainConfig, data, source=str(path), error=LearnerConfigError)
