"""The teachers' contract: grid cells, scoring requests and results, the scorer protocol, errors.

A cell is one (domain, effort) pair of the teacher grid, keyed ``"domain/effort"``
(``"coding/high"``). A ``TeacherScorer`` returns a teacher's log-probabilities of
tokens that somebody else (the student) sampled, always at temperature 1: the
MOPD advantage compares two distributions, not two sampling procedures.

``ScoreRequest.token_ids`` is the whole teacher-side sequence (the teacher's
context, then the student's response ids spliced in verbatim) and
``positions`` the indices ``i`` whose ``log p(token_ids[i] | token_ids[:i])``
is wanted; position 0 has no prediction and is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agentenv.errors import ConfigError

DOMAINS: tuple[str, ...] = ("general", "agent", "coding")  # agentenv.types.Domain's values
EFFORTS: tuple[str, ...] = ("low", "high", "max")  # agentenv.intents.EFFORT_LEVELS


def cell_key(domain: str, effort: str) -> str:
    """``"domain/effort"``: how a cell is named in configs, metrics and errors."""
    return f"{domain}/{effort}"


class TeacherError(Exception):
    """Base of every error this package raises."""


class UnknownCell(TeacherError, KeyError):
    """A sample's (domain, effort) has no teacher in the grid."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TeacherConfigError(TeacherError, ConfigError):
    """A grid or effort config is malformed; the message names the file and field."""


class ScoringError(TeacherError, RuntimeError):
    """A teacher could not score a request (bad positions, endpoint failure, length)."""


class ContextMismatch(TeacherError, ValueError):
    """The re-rendered student prompt is not a prefix of the stored sample: splicing would misalign."""


@dataclass(frozen=True)
class ScoreRequest:
    cell: str
    token_ids: tuple[int, ...]
    positions: tuple[int, ...]
    sample_id: str = ""


@dataclass(frozen=True)
class ScoreResult:
    """One logprob per requested position (temperature 1). ``clamped`` counts -inf / NaN
    values replaced by the scorer's floor."""

    logprobs: tuple[float, ...]
    clamped: int = 0


@runtime_checkable
class TeacherScorer(Protocol):
    """Scores batches of requests; results come back in request order."""

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]: ...

    def close(self) -> None: ...


@runtime_checkable
class RoutedScorer(TeacherScorer, Protocol):
    """A scorer over a grid of teachers: ``cells`` names the (domain, effort) keys it can score."""

    @property
    def cells(self) -> list[str]: ...


__all__ = [
    "DOMAINS", "EFFORTS", "ContextMismatch", "RoutedScorer", "ScoreRequest", "ScoreResult", "ScoringError",
    "TeacherConfigError", "TeacherError", "TeacherScorer", "UnknownCell", "cell_key",
]
