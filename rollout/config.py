"""The rollout run config: one YAML file says what to run, where, and how faults and staleness are handled.

Why pydantic and a file: a rollout run is launched by people (``agentenv
rollout CONFIG``) and by clusters (``ray job submit ... python -m rollout.job
CONFIG``), and both must fail before any Ray actor starts when a field is
wrong, with the field's path in the message (``policy.url: ...``), not deep
inside a worker. Every field is documented in ``docs/rollout.md``; nothing
here is changed behind the user's back once loaded.

Usage::

    cfg = load_config("examples/rollout.yaml")
    cfg.group_size, cfg.rotation.pick(0), cfg.efforts.pick(0)
"""

from __future__ import annotations

import enum
import hashlib
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentenv.configs import load_yaml_config, validate_config
from agentenv.intents import EFFORT_LEVELS
from agentenv.types import Domain
from rollout.branching import BranchRole
from rollout.errors import ConfigError
from rollout.harnesses.rotation import RotationPolicy
from rollout.store import DEFAULT_URL

__all__ = [
    "BranchingConfig",
    "ConfigError",
    "EffortDraw",
    "FleetConfig",
    "PolicyConfig",
    "RayConfig",
    "RetryConfig",
    "RolloutConfig",
    "RolloutSettings",
    "SamplingConfig",
    "StalePolicy",
    "StalenessConfig",
    "TaskSelection",
    "WorkerRetries",
    "load_config",
    "parse_config",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskSelection(_Model):
    """Which registered tasks the run uses: the intersection of every filter given.

    ``ids`` empty means "all registered tasks" before the other filters apply.
    """

    ids: tuple[str, ...] = ()
    domain: Domain | None = None
    tags: tuple[str, ...] = Field(default=(), description="a task must carry every one of these tags")


class EffortDraw(_Model):
    """The effort level of each episode, drawn per episode from ``seed`` (reproducible).

    ``levels`` empty means "no effort message" (``effort=None`` on the request).
    The draw for episode ``i`` is a pure function of ``(seed, i)``, like harness rotation.
    """

    levels: tuple[str, ...] = ("high",)
    weights: tuple[float, ...] | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> EffortDraw:
        unknown = [lv for lv in self.levels if lv not in EFFORT_LEVELS]
        if unknown:
            raise ConfigError(f"levels: unknown {unknown}; known are {list(EFFORT_LEVELS)}")
        if self.weights is not None:
            if len(self.weights) != len(self.levels):
                raise ConfigError(f"weights: need one weight per level ({len(self.levels)}), got {len(self.weights)}")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ConfigError(f"weights: must be >= 0 with a positive sum, got {list(self.weights)}")
        return self

    def pick(self, episode_index: int) -> str | None:
        """The effort level of episode ``episode_index`` (None when no levels are configured)."""
        if not self.levels:
            return None
        digest = hashlib.sha256(f"effort:{self.seed}:{episode_index}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        return rng.choices(self.levels, weights=self.weights, k=1)[0]


class PolicyConfig(_Model):
    """The model that acts. ``scripted`` replays each task's oracle (no model; tests and benchmarks),
    ``hf`` loads a local Hugging Face checkpoint in every worker, ``openai`` calls an
    OpenAI-compatible server (vLLM / SGLang / ``agentenv serve``)."""

    kind: Literal["scripted", "hf", "openai"] = "scripted"
    checkpoint: str | None = Field(default=None, description="hf: a local checkpoint folder")
    device: str = Field(default="cpu", description="hf: torch device of each worker's copy")
    url: str | None = Field(default=None, description="openai: base URL, e.g. http://host:8000/v1")
    model: str | None = Field(default=None, description="openai: the served model name")
    api_key_env: str = Field(default="OPENAI_API_KEY", description="openai: environment variable with the key")
    timeout_s: float = Field(default=120.0, gt=0, description="openai: per-request timeout")

    @model_validator(mode="after")
    def _check(self) -> PolicyConfig:
        if self.kind == "hf" and not self.checkpoint:
            raise ConfigError("checkpoint: kind 'hf' needs a local checkpoint folder, got none")
        if self.kind == "openai" and not (self.url and self.model):
            raise ConfigError(
                "url/model: kind 'openai' needs both the server url and the model name, "
                f"got url={self.url!r}, model={self.model!r}"
            )
        return self


class SamplingConfig(_Model):
    """Per-turn sampling of a model policy (the scripted policy ignores it)."""

    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: int = Field(default=512, ge=1)


class StalePolicy(str, enum.Enum):
    """What happens to a trajectory sampled by weights more than K versions behind the learner.

    ``abort_and_resume``: abort it (in flight or finished) and run the episode again
    on current weights. ``drop``: discard it and count it as dropped. Both are counted.
    """

    ABORT_AND_RESUME = "abort_and_resume"
    DROP = "drop"


class StalenessConfig(_Model):
    """The hard staleness bound: ``learner_version - trajectory.policy_version <= max_lag`` for
    every trajectory written to the store (``policy_version`` is the oldest weights of the episode)."""

    max_lag: int = Field(default=1, ge=0)
    policy: StalePolicy = StalePolicy.ABORT_AND_RESUME
    max_resumes: int = Field(default=3, ge=0, description="abort_and_resume: then the episode is dropped")


class WorkerRetries(_Model):
    """The fault budgets of the worker fleet, shared by rollout runs and eval sweeps: an episode whose
    worker died is rerun up to ``worker_lost`` times; a dead worker is restarted by Ray up to
    ``worker_restarts`` times, then re-created; a sandbox start is retried ``sandbox_acquire`` times."""

    worker_lost: int = Field(default=3, ge=0)
    worker_restarts: int = Field(default=3, ge=0)
    sandbox_acquire: int = Field(default=1, ge=0, description="EpisodeRunner's own sandbox start retries")


class RetryConfig(WorkerRetries):
    """A rollout run's fault budgets: the fleet's (``WorkerRetries``), and a ``sandbox_lost`` episode
    is run again up to ``sandbox_lost`` times."""

    sandbox_lost: int = Field(default=1, ge=0)


class RayConfig(_Model):
    """Where the workers run. ``address`` None: a job context (``RAY_ADDRESS`` set, e.g. under
    ``ray job submit``) connects to that cluster, otherwise an embedded ``ray.init`` with
    ``num_cpus`` starts in-process. Workers need one unit of ``worker_resource`` each, so they
    land on nodes that declare it (``ray start --resources '{"docker_daemon": 4}'``)."""

    address: str | None = None
    num_cpus: int = Field(default=2, ge=1, description="embedded Ray only")
    worker_resource: str | None = Field(default="docker_daemon", description="custom resource placing workers")
    worker_cpus: float = Field(default=0.5, ge=0)
    spread: bool = Field(default=True, description="place workers on as many nodes as possible (Ray's SPREAD strategy)")


class FleetConfig(_Model):
    """The rollout fleet: where episodes run and how many at once. One model, the same fields and
    defaults in a rollout run (``RolloutConfig``), a training run's ``rollout:`` and an eval sweep
    (``rollout.eval.config.SweepConfig``). Each adds its own ``retries``, both built on ``WorkerRetries``."""

    backend: Literal["docker", "local"] = Field(default="docker", description="sandboxes.backends.make_backend's name")
    workers: int = Field(default=2, ge=1)
    concurrency: int = Field(default=4, ge=1, description="episodes in flight per worker")
    pool_size: int = Field(
        default=2, ge=0,
        description="warm sandboxes per task image per worker: 2 keeps one restored at the pristine snapshot "
        "while another is handed out",
    )
    warm: bool = Field(
        default=True,
        description="before the first episode each worker starts `concurrency` sandboxes of every image the "
        "run's tasks use, so no episode waits on a container start (start-up time, paid once per run)",
    )
    grading: Literal["in_place", "fork"] = Field(
        default="in_place",
        description="in_place: grade in the agent's sandbox once its processes are killed and /tmp emptied "
        "(falls back to a fork when that is refused); fork: always in a clean copy of its files",
    )
    ray: RayConfig = Field(default_factory=RayConfig)


class BranchingConfig(_Model):
    """Tree rollouts (``rollout.branching``): each group is ``roots_per_group`` roots, each forked at turn
    boundaries into continuations that share its prefix; ``group_size`` must be ``roots_per_group`` times
    the leaves per root (``1 + points * (k - 1)``). ``kind: off`` (the default): independent episodes."""

    kind: Literal["off", "fixed", "entropy"] = "off"
    turns: tuple[int, ...] = Field(default=(), description="fixed: branch after these 0-based turn indices")
    k: int = Field(default=2, ge=2, description="continuations per branch point (the root's own included)")
    budget: int = Field(default=1, ge=1, description="entropy: branch points per root")
    max_turn: int = Field(default=8, ge=1, description="entropy: branch only after turns below this")
    roots_per_group: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> BranchingConfig:
        if self.kind == "fixed" and (not self.turns or len(set(self.turns)) != len(self.turns) or min(self.turns) < 0):
            raise ConfigError(f"turns: kind 'fixed' needs distinct turn indices >= 0, got {list(self.turns)}")
        return self

    @property
    def on(self) -> bool:
        return self.kind != "off"

    def leaves_per_root(self) -> int:
        points = len(self.turns) if self.kind == "fixed" else self.budget
        return 1 + points * (self.k - 1)

    def role(self) -> BranchRole:
        """The plan as the ``BranchRole`` template ``rollout.branching.branch_requests`` fills in per root."""
        if self.kind == "off":
            raise ConfigError("branching.kind: 'off' has no plan")
        return BranchRole(root="", kind=self.kind, turns=self.turns, k=self.k, budget=self.budget, max_turn=self.max_turn)


class RolloutSettings(FleetConfig):
    """How episodes are drawn and run, in every config that runs them: a rollout job (``RolloutConfig``) and a
    training or distill run's ``rollout:`` section. The tasks, G samples per group, harness rotation,
    effort draws, sampling, the staleness bound K, fault budgets, and the fleet (``FleetConfig``'s fields)."""

    tasks: TaskSelection = Field(default_factory=TaskSelection)
    group_size: int = Field(default=4, ge=1, description="G samples per (task, seed) group")
    rotation: RotationPolicy = Field(default_factory=RotationPolicy)
    efforts: EffortDraw = Field(default_factory=EffortDraw)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    branching: BranchingConfig = Field(default_factory=BranchingConfig)
    resume_from_snapshots: bool = Field(
        default=False,
        description="a FAST snapshot at every turn boundary; an episode whose sandbox is lost continues from the last "
        "one in a new sandbox (up to rollout.branching.MAX_RESUMES times) instead of being rerun from scratch",
    )

    @model_validator(mode="after")
    def _check_tree(self) -> RolloutSettings:
        if self.branching.on:
            per = self.branching.leaves_per_root() * self.branching.roots_per_group
            if self.group_size != per:
                raise ConfigError(
                    f"group_size: with branching it must be roots_per_group x leaves per root "
                    f"({self.branching.roots_per_group} x {self.branching.leaves_per_root()} = {per}), got {self.group_size}"
                )
        return self


class RolloutConfig(RolloutSettings):
    """A whole rollout job (``agentenv rollout``): ``RolloutSettings`` plus what a training run gives from its
    own fields instead: the run id, the store, the variant seeds and the acting policy. See ``docs/rollout.md``."""

    run_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    store: str = Field(default=DEFAULT_URL, description="SQLAlchemy URL of the trajectory store")
    seeds: tuple[int, ...] = Field(default=(0,), min_length=1, description="variant seeds; an int n means 0..n-1")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_count(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 1:
                raise ConfigError(f"an int means 'seeds 0..n-1' and must be >= 1, got {v}")
            return tuple(range(v))
        return v

    @field_validator("seeds")
    @classmethod
    def _unique(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(v)) != len(v):
            raise ConfigError(f"seeds must be distinct, got {list(v)}")
        return v

    @property
    def planned_per_task(self) -> int:
        return len(self.seeds) * self.group_size


def parse_config(data: Any, *, source: str = "<config>") -> RolloutConfig:
    """Validate a mapping; errors become one ``ConfigError``, a line ``source: field.path: why`` per problem."""
    return validate_config(RolloutConfig, data, source=source, error=ConfigError)


def load_config(path: str | Path, **overrides: Any) -> RolloutConfig:
    """Read and validate a YAML config; ``overrides`` replace top-level fields (CLI flags)."""
    return load_yaml_config(RolloutConfig, path, error=ConfigError, overrides=overrides)

