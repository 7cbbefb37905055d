"""Which harness poses each episode: a seeded, reproducible rotation policy.

The pick for episode ``i`` is a pure function of ``(policy, i)`` -- not of how
many picks came before or which worker asks -- so a run replays exactly,
workers can pick independently, and a resumed run picks what the first run
would have. The chosen name is what the runner records on the trajectory.

Kinds:

* ``uniform``: each harness equally likely;
* ``weighted``: probabilities proportional to ``weights``;
* ``round_robin``: ``harnesses[(i + offset) % n]``, with the offset drawn from the seed;
* ``fixed``: always ``harnesses[0]``.

``harnesses`` names emulated harnesses (``rollout.harnesses``) and native programs
(``native:codex``; the older spelling ``cli:codex`` is read as it).
"""

from __future__ import annotations

import hashlib
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollout.harnesses import canonical_harness, list_harnesses
from rollout.harnesses.native import NATIVE_HARNESSES


class RotationPolicy(BaseModel):
    """Per-run rotation config (it comes from run config files, so it is pydantic)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["uniform", "weighted", "round_robin", "fixed"] = "uniform"
    harnesses: tuple[str, ...] = Field(default=("claude_code", "codex", "kimi_code"), min_length=1)
    weights: tuple[float, ...] | None = None
    seed: int = 0

    @field_validator("harnesses", mode="before")
    @classmethod
    def _native_alias(cls, value: object) -> object:
        """``cli:codex`` (the older name) is read as ``native:codex``: a config keeps one spelling from here on."""
        if isinstance(value, (list, tuple)):
            return tuple(canonical_harness(v) if isinstance(v, str) else v for v in value)
        return value

    @model_validator(mode="after")
    def _check(self) -> RotationPolicy:
        known = set(list_harnesses()) | set(NATIVE_HARNESSES)  # the native programs rotate beside the emulated harnesses
        unknown = [h for h in self.harnesses if h not in known]
        if unknown:
            raise ValueError(f"harnesses: unknown {unknown}; known are {sorted(known)}")
        if self.kind == "weighted":
            if self.weights is None or len(self.weights) != len(self.harnesses):
                raise ValueError(f"weights: need one weight per harness ({len(self.harnesses)}), got {self.weights}")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError(f"weights: must be >= 0 with a positive sum, got {self.weights}")
        elif self.weights is not None:
            raise ValueError(f"weights: only used by kind='weighted', got kind={self.kind!r}")
        if self.kind == "fixed" and len(self.harnesses) != 1:
            raise ValueError(f"harnesses: kind='fixed' takes exactly one harness, got {list(self.harnesses)}")
        return self

    def _rng(self, salt: str) -> random.Random:
        digest = hashlib.sha256(f"{self.seed}:{salt}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def pick(self, episode_index: int) -> str:
        """The harness name for episode ``episode_index`` (0-based)."""
        if episode_index < 0:
            raise ValueError(f"episode_index must be >= 0, got {episode_index}")
        names = self.harnesses
        if self.kind == "fixed":
            return names[0]
        if self.kind == "round_robin":
            offset = self._rng("offset").randrange(len(names))
            return names[(episode_index + offset) % len(names)]
        rng = self._rng(str(episode_index))
        if self.kind == "weighted":
            assert self.weights is not None
            return rng.choices(names, weights=self.weights, k=1)[0]
        return names[rng.randrange(len(names))]

    def schedule(self, n: int, start: int = 0) -> list[str]:
        """Picks for episodes ``start .. start + n - 1``."""
        return [self.pick(i) for i in range(start, start + n)]


__all__ = ["RotationPolicy"]
