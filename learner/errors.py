"""The one exception tree of ``learner``.

Every class also inherits the matching built-in, so callers that only know
Python's own exceptions (``ValueError``, ``FileNotFoundError`` ...) still catch
them. Messages name the file, the field or the argument, and say what was
expected and what arrived.

``LearnerConfigError`` is also a ``rollout.errors.ConfigError``: a training
config embeds rollout settings, and the CLI reports both kinds the same way.
"""

from __future__ import annotations

from rollout.errors import ConfigError


class LearnerError(Exception):
    """Base of every error raised by ``learner``."""


class LearnerConfigError(LearnerError, ConfigError):
    """A training config file, a config field (``LossConfig.kl_coef`` ...) or an argument is invalid."""


class ShapeError(LearnerError, ValueError):
    """Per-token sequences of one item disagree in length, or items do not fit the batch layout."""


class EmptyBatch(LearnerError, ValueError):
    """A step was given no items, or items with no loss tokens: there is nothing to train on."""


class UnsupportedModel(LearnerError, ValueError):
    """The model's architecture lacks what an option needs (a ``.layers`` stack, a linear head, varlen attention)."""


class CheckpointError(LearnerError, OSError):
    """A checkpoint could not be read or written."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """A checkpoint folder, or a file a checkpoint must hold, is missing (the learner never downloads one)."""


class CheckpointMismatch(CheckpointError, ValueError):
    """A checkpoint does not fit what loads it: tensors missing or extra, another config, another run."""


class DistributedError(LearnerError, RuntimeError):
    """A rank of the sharded learner, a collective or the group failed (a dead peer, a timeout)."""


class RendezvousTimeout(DistributedError, LearnerConfigError, TimeoutError):
    """The ranks did not all meet at rank 0's address within ``trainer.distributed_timeout_s``."""


class LearnerGroupError(DistributedError):
    """A rank of ``learner.group.LearnerGroup`` died or failed; ``rank`` names it (None: the group as a whole)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


__all__ = [
    "CheckpointError",
    "CheckpointMismatch",
    "CheckpointNotFound",
    "DistributedError",
    "EmptyBatch",
    "LearnerConfigError",
    "LearnerError",
    "LearnerGroupError",
    "RendezvousTimeout",
    "ShapeError",
    "UnsupportedModel",
]
