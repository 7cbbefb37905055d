"""The sweep file: policies x task selection x harnesses x efforts x variant seeds x k samples.

One YAML file (``examples/eval.yaml``; every field in ``docs/eval.md``) says what
to evaluate. It is validated before Ray starts, and errors name the file and the
field path (``examples/eval.yaml: policies[1].url: ...``).

Which fields may change between a run and its ``--resume`` is decided here too
(``SweepConfig.locked``): the axes may grow (more seeds, another policy, another
effort: only the new cells run), but anything that would change the result of a
cell already stored (a policy's weights, sampling or endpoint; the backend; the
grading mode) is refused by name, since mixing both in one table would be a lie.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentenv.configs import load_yaml_config, validate_config
from agentenv.intents import EFFORT_LEVELS
from rollout.config import FleetConfig, SamplingConfig, TaskSelection, WorkerRetries
from rollout.eval.types import SweepConfigError

__all__ = ["PolicySpec", "StatsConfig", "SweepConfig", "SweepRetries", "load_sweep", "parse_sweep", "weights_hash"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".json", ".model", ".txt")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def weights_hash(checkpoint: str) -> str:
    """Content hash of a local checkpoint folder (weights, config, tokenizer files); ``tiny`` is the
    seeded tiny model built from its config, identified by name and seed."""
    if checkpoint == "tiny":
        return "tiny-seed0"
    root = Path(checkpoint)
    if not (root / "config.json").is_file():
        raise SweepConfigError(
            f"checkpoint: expected a local checkpoint folder with config.json or 'tiny', got {checkpoint!r}"
        )
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _WEIGHT_FILES):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


class PolicySpec(_Model):
    """One named policy of a sweep, with its own sampling.

    ``oracle`` replays each task's oracle (a reference: 1.0 everywhere),
    ``do_nothing`` submits at once (a reference: 0.0 everywhere), ``checkpoint``
    is a local Hugging Face folder or ``tiny``, ``openai`` an OpenAI-compatible
    endpoint (``url`` + ``model``) called by at most ``max_concurrency``
    episodes at once across all workers, with backoff on 429 / 5xx.
    """

    name: str = Field(pattern=_NAME)
    kind: Literal["oracle", "do_nothing", "checkpoint", "openai"]
    checkpoint: str | None = Field(default=None, description="checkpoint: local folder or 'tiny'")
    device: str = "cpu"
    url: str | None = None
    model: str | None = None
    version: int | None = Field(default=None, description="openai: the served weights' version, part of the cell key")
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = Field(default=120.0, gt=0)
    max_concurrency: int = Field(default=8, ge=1, description="openai: episodes in flight against this endpoint")
    max_retries: int = Field(default=3, ge=0, description="openai: HTTP retries per request (429 / 5xx)")
    backoff_s: float = Field(default=0.5, ge=0)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)

    @model_validator(mode="after")
    def _check(self) -> PolicySpec:
        if self.kind == "checkpoint" and not self.checkpoint:
            raise ValueError("checkpoint: kind 'checkpoint' needs a local folder or 'tiny', got none")
        if self.kind == "openai" and not (self.url and self.model):
            raise ValueError(f"url/model: kind 'openai' needs both, got url={self.url!r}, model={self.model!r}")
        return self

    @property
    def samples_model(self) -> bool:
        return self.kind in ("checkpoint", "openai")

    @property
    def endpoint(self) -> str | None:
        return f"{self.url}#{self.model}" if self.kind == "openai" else None

    def identity(self) -> dict[str, Any]:
        """What of this policy changes a result: kind, weights or endpoint + version, sampling."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "checkpoint":
            out["weights"] = weights_hash(str(self.checkpoint))
        if self.kind == "openai":
            out.update(url=self.url, model=self.model, version=self.version if self.version is not None else 0)
        if self.samples_model:
            out["sampling"] = self.sampling.model_dump(mode="json")
        return out


def identity_id(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


class SweepRetries(WorkerRetries):
    """The fleet's budgets (``worker_lost``, ``worker_restarts``, ``sandbox_acquire``: ``WorkerRetries``) and
    ``infrastructure``: reruns of an episode whose outcome is infrastructure (lost sandbox, endpoint
    errors after the policy's own HTTP retries, runner error)."""

    infrastructure: int = Field(default=2, ge=0)
    backoff_s: float = Field(default=1.0, ge=0, description="wait before an infrastructure rerun (doubles)")


class StatsConfig(_Model):
    resamples: int = Field(default=1000, ge=100, description="bootstrap resamples")
    seed: int = 0


class SweepConfig(FleetConfig):
    """A whole sweep: its axes, and the fleet that runs it (``FleetConfig``'s fields, with the same
    defaults as a rollout run). See ``docs/eval.md`` for every field."""

    sweep_id: str = Field(min_length=1, pattern=_NAME)
    store: str = "sqlite:///runs/eval.db"
    out: str | None = Field(default=None, description="output folder; default runs/eval/<sweep_id>")
    policies: tuple[PolicySpec, ...] = Field(min_length=1)
    tasks: TaskSelection = Field(default_factory=TaskSelection)
    harnesses: tuple[str, ...] = Field(default=("claude_code", "codex", "kimi_code"), min_length=1)
    efforts: tuple[str, ...] = Field(default=("high",), min_length=1)
    seeds: tuple[int, ...] = Field(default=(0,), min_length=1)
    samples: int = Field(default=1, ge=1, description="k samples per variant (task, seed, harness, effort)")
    retries: SweepRetries = Field(default_factory=SweepRetries)
    stats: StatsConfig = Field(default_factory=StatsConfig)

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_count(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 1:
                raise ValueError(f"an int means 'seeds 0..n-1' and must be >= 1, got {v}")
            return tuple(range(v))
        return v

    @field_validator("seeds", "harnesses", "efforts")
    @classmethod
    def _unique(cls, v: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"values must be distinct, got {list(v)}")
        return v

    @field_validator("harnesses")
    @classmethod
    def _known_harness(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        from rollout.harnesses import list_harnesses

        known = set(list_harnesses())
        bad = [h for h in v if h not in known]
        if bad:
            raise ValueError(f"unknown harness {bad}; known are {sorted(known)}")
        return v

    @field_validator("efforts")
    @classmethod
    def _known_effort(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [e for e in v if e not in EFFORT_LEVELS]
        if bad:
            raise ValueError(f"unknown effort {bad}; known are {list(EFFORT_LEVELS)}")
        return v

    @field_validator("policies")
    @classmethod
    def _unique_names(cls, v: tuple[PolicySpec, ...]) -> tuple[PolicySpec, ...]:
        names = [p.name for p in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"policy names must be distinct, got {dup} more than once")
        return v

    @property
    def out_dir(self) -> Path:
        return Path(self.out or os.path.join("runs", "eval", self.sweep_id))

    def policy(self, name: str) -> PolicySpec:
        for p in self.policies:
            if p.name == name:
                return p
        raise SweepConfigError(f"policy: no policy named {name!r}; the sweep has {[p.name for p in self.policies]}")

    def locked(self) -> dict[str, Any]:
        """Fields that change the result of a cell already stored: they must not change on resume."""
        return {"backend": self.backend, "grading": self.grading}


def parse_sweep(data: Any, *, source: str = "<sweep>") -> SweepConfig:
    """Validate a mapping; errors become one ``SweepConfigError``, a line ``source: field.path: why`` per problem."""
    return validate_config(SweepConfig, data, source=source, error=SweepConfigError, what="sweep fields")


def load_sweep(path: str | Path, **overrides: Any) -> SweepConfig:
    """Read and validate a sweep YAML; ``overrides`` replace top-level fields (CLI flags)."""
    return load_yaml_config(SweepConfig, path, error=SweepConfigError, overrides=overrides, what="sweep file")
