"""The teacher grid config: domains x effort levels, one model reference per cell, and the scorer it builds.

A grid file (YAML)::

    domains: [general, agent, coding]            # the default
    efforts:                                     # the default levels, with these taus
      low:  {tau: 0.5, max_thinking_tokens: 256}
      high: {tau: 1.0}
      max:  {tau: 2.0}
    cells:
      general/low:  {kind: hf, path: ckpt/general-low}            # a local HF checkpoint
      coding/high:  {kind: lora, base: ckpt/base, adapter: ckpt/coding-high}
      agent/max:    {kind: endpoint, base_url: http://10.0.0.5:8000/v1, model: agent-max}
      ...                                        # every domain x effort exactly once

Relative paths are resolved against the file's folder. ``build_scorer`` loads
each backend once: cells naming the same ``hf`` path share one ``HFScorer``,
cells on the same LoRA ``base`` share one ``LoRAScorer`` (one base in memory),
cells on the same endpoint and model share one ``EndpointScorer``.

``tau`` is the effort reward's length factor (``-1 if T(y) > tau * b0(x)``,
``learner.advantages.effort_override``); ``max_thinking_tokens`` an optional
generation-time cap on thinking for that level. In a grid they record what each
level's teachers were trained with (``agentenv teachers train`` writes them);
a distill run's own ``effort.tau`` / ``effort.max_thinking_tokens``, when
given, must agree with them (``distill.loop.check_effort_agrees``, an error
naming both fields).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from agentenv.configs import read_yaml, validate_config
from agentenv.intents import EFFORT_LEVELS
from teachers.scoring import DEFAULT_FLOOR, EndpointScorer, HFScorer, LoRAScorer, RoutingScorer
from teachers.types import DOMAINS, TeacherConfigError, TeacherScorer, cell_key

_STRICT = ConfigDict(extra="forbid", frozen=True)


class EffortLevel(BaseModel):
    model_config = _STRICT

    tau: float = Field(gt=0, description="the effort reward's budget factor: over tau * b0 tokens earns -1")
    max_thinking_tokens: int | None = Field(default=None, ge=1, description="thinking is closed after this many tokens")


class HFRef(BaseModel):
    """A local Hugging Face checkpoint directory (``save_pretrained`` layout)."""

    model_config = _STRICT
    kind: Literal["hf"]
    path: str


class LoRARef(BaseModel):
    """A ``peft`` LoRA adapter directory over a local base checkpoint shared with other cells."""

    model_config = _STRICT
    kind: Literal["lora"]
    base: str
    adapter: str


class EndpointRef(BaseModel):
    """An OpenAI-compatible server that returns ``prompt_logprobs`` (vLLM, ``agentenv serve``)."""

    model_config = _STRICT
    kind: Literal["endpoint"]
    base_url: str
    model: str
    timeout_s: float = Field(default=60.0, gt=0)
    api_key: str = "EMPTY"


ModelRef = Annotated[Union[HFRef, LoRARef, EndpointRef], Field(discriminator="kind")]


def _default_efforts() -> dict[str, EffortLevel]:
    return {"low": EffortLevel(tau=0.5), "high": EffortLevel(tau=1.0), "max": EffortLevel(tau=2.0)}


class TeacherGridConfig(BaseModel):
    """Domains x effort levels, each cell a ``ModelRef``; see the module docstring."""

    model_config = _STRICT

    domains: tuple[str, ...] = DOMAINS
    efforts: dict[str, EffortLevel] = Field(default_factory=_default_efforts)
    cells: dict[str, ModelRef]
    batch_tokens: int = Field(default=16384, ge=1, description="padded tokens per teacher forward (local backends)")
    floor: float = Field(default=DEFAULT_FLOOR, lt=0, description="what a -inf / NaN teacher logprob is clamped to")

    @field_validator("domains")
    @classmethod
    def _domains(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("expected at least one domain")
        bad = [d for d in v if not d or "/" in d]
        if bad:
            raise ValueError(f"a domain name must be non-empty and without '/', got {bad[0]!r}")
        if len(set(v)) != len(v):
            raise ValueError(f"expected distinct domains, got {list(v)}")
        return v

    @field_validator("efforts")
    @classmethod
    def _efforts(cls, v: dict[str, EffortLevel]) -> dict[str, EffortLevel]:
        if not v:
            raise ValueError("expected at least one effort level")
        bad = [e for e in v if e not in EFFORT_LEVELS]
        if bad:
            raise ValueError(f"effort level {bad[0]!r} unknown: the harnesses render only {', '.join(EFFORT_LEVELS)}")
        return v

    @field_validator("cells")
    @classmethod
    def _cells(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        domains, efforts = info.data.get("domains"), info.data.get("efforts")
        if domains is None or efforts is None:
            return v  # their own errors are reported
        wanted = [cell_key(d, e) for d in domains for e in efforts]
        unknown = [c for c in v if c not in wanted]
        if unknown:
            raise ValueError(f"unknown cell {unknown[0]!r}: expected 'domain/effort' with domains {', '.join(domains)} "
                             f"and efforts {', '.join(efforts)}")
        missing = [c for c in wanted if c not in v]
        if missing:
            raise ValueError(f"every domain x effort needs exactly one teacher; missing: {', '.join(missing)}")
        return {c: v[c] for c in wanted}  # grid order

    @property
    def cell_keys(self) -> list[str]:
        return list(self.cells)

    def tau(self, effort: str) -> float:
        try:
            return self.efforts[effort].tau
        except KeyError:
            raise TeacherConfigError(f"efforts: no level {effort!r} (levels: {', '.join(self.efforts)})") from None

    @classmethod
    def parse(cls, data: Any, *, source: str = "<grid>", root: str | os.PathLike[str] | None = None) -> TeacherGridConfig:
        """Validate a mapping; every error becomes one line ``source: field.path: why`` of a ``TeacherConfigError``.

        ``root``: the folder relative checkpoint and adapter paths are resolved against.
        """
        config = validate_config(cls, data, source=source, error=TeacherConfigError, what="grid fields")
        return config.resolved(root) if root is not None else config

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TeacherGridConfig:
        """Read and validate a YAML grid file (see the module docstring)."""
        where = Path(path)
        data = read_yaml(where, error=TeacherConfigError, what="grid file")
        return cls.parse(data, source=str(where), root=where.parent)

    def resolved(self, root: str | os.PathLike[str]) -> TeacherGridConfig:
        """A copy whose relative local paths are joined to ``root``."""
        base = Path(root)

        def fix(p: str) -> str:
            return p if Path(p).is_absolute() else str(base / p)

        cells: dict[str, Any] = {}
        for key, ref in self.cells.items():
            if isinstance(ref, HFRef):
                cells[key] = ref.model_copy(update={"path": fix(ref.path)})
            elif isinstance(ref, LoRARef):
                cells[key] = ref.model_copy(update={"base": fix(ref.base), "adapter": fix(ref.adapter)})
            else:
                cells[key] = ref
        return self.model_copy(update={"cells": cells})


def build_scorer(config: TeacherGridConfig, *, device: str = "cpu", dtype: Any = None) -> RoutingScorer:
    """One ``RoutingScorer`` over the grid, each backend loaded once (see the module docstring)."""
    from rollout.policy.models import load_checkpoint

    def load(path: str, cell: str, field: str) -> Any:
        try:
            return load_checkpoint(path, device=device, dtype=dtype)[0]
        except (OSError, ValueError) as exc:
            raise TeacherConfigError(f"cells.{cell}.{field}: cannot load checkpoint {path!r} ({exc})") from exc

    hf: dict[str, list[tuple[str, HFRef]]] = {}
    lora: dict[str, list[tuple[str, LoRARef]]] = {}
    endpoints: dict[tuple[str, str], list[tuple[str, EndpointRef]]] = {}
    for cell, ref in config.cells.items():
        if isinstance(ref, HFRef):
            hf.setdefault(os.path.realpath(ref.path), []).append((cell, ref))
        elif isinstance(ref, LoRARef):
            lora.setdefault(os.path.realpath(ref.base), []).append((cell, ref))
        else:
            endpoints.setdefault((ref.base_url, ref.model), []).append((cell, ref))
    scorers: dict[str, TeacherScorer] = {}
    for group in hf.values():
        cell, first = group[0]
        shared: TeacherScorer = HFScorer(load(first.path, cell, "path"), batch_tokens=config.batch_tokens,
                                         device=device, floor=config.floor)
        scorers.update({c: shared for c, _ in group})
    for lgroup in lora.values():
        cell, lfirst = lgroup[0]
        shared = LoRAScorer(load(lfirst.base, cell, "base"), {c: r.adapter for c, r in lgroup},
                            batch_tokens=config.batch_tokens, device=device, floor=config.floor)
        scorers.update({c: shared for c, _ in lgroup})
    for egroup in endpoints.values():
        _, efirst = egroup[0]
        shared = EndpointScorer(efirst.base_url, efirst.model, efirst.timeout_s, api_key=efirst.api_key, floor=config.floor)
        scorers.update({c: shared for c, _ in egroup})
    return RoutingScorer({c: scorers[c] for c in config.cells})


__all__ = ["EffortLevel", "EndpointRef", "HFRef", "LoRARef", "ModelRef", "TeacherGridConfig", "build_scorer"]
