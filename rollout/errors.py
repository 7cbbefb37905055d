"""The one exception tree of ``rollout``.

Every class also inherits the matching built-in, so callers that only know
Python's own exceptions (``ValueError``, ``ConnectionError`` ...) still catch
them. Messages name the file, the field or the argument, and say what was
expected and what arrived.

What is *not* here on purpose: a failed episode. A sandbox lost, a policy that
errored or a turn limit reached is a ``Trajectory`` with a ``status`` and an
``error``, never an exception that kills a worker (see ``rollout.episode``).
``rollout.attempt.EpisodeLost`` belongs to this tree but never leaves the runner:
an attempt raises it for the runner to retry on a fresh sandbox.

``rollout.policy.types.PolicyError`` (a model client failed) still lives beside
the policy contract; it is meant to join this tree.
"""

from __future__ import annotations

from agentenv.errors import ConfigError as _ConfigError


class RolloutError(Exception):
    """Base of every error raised by ``rollout``."""


class ConfigError(RolloutError, _ConfigError):
    """A rollout config file, one of its fields, or a component's argument is invalid.

    The message names the file and the field path (``run.yaml: staleness.max_lag: ...``)
    or the argument (``Scheduler: workers ...``).
    """


class RecordError(RolloutError, ValueError):
    """A ``Sample`` or ``Trajectory`` field is invalid, or a record is read in a shape it does not have."""


class StoreError(RolloutError, ValueError):
    """A trajectory store was given an invalid URL, filter value or argument."""


class UnknownFilter(StoreError, TypeError):
    """A trajectory filter keyword the store does not know (a ``TypeError`` like any unknown keyword)."""


class StalenessError(RolloutError, ValueError):
    """A policy version went backwards: published versions only grow."""


class WorkerLost(RolloutError, ConnectionError):
    """The worker running an episode died (process killed, node lost); the episode must be rerun."""


class WorkerClosed(RolloutError, RuntimeError):
    """An episode was sent to a worker that has been closed."""


class UnsupportedPolicy(RolloutError, TypeError):
    """A policy object offers neither ``set_weights`` nor ``set_version``, so a worker cannot update it."""


class UnsupportedTask(RolloutError, TypeError):
    """A task of a kind this tool cannot run (e.g. the baseline benchmark runs folder tasks only)."""


class ServeError(RolloutError, RuntimeError):
    """``agentenv serve`` could not start its HTTP server within its deadline."""


__all__ = [
    "ConfigError",
    "RecordError",
    "RolloutError",
    "ServeError",
    "StalenessError",
    "StoreError",
    "UnknownFilter",
    "UnsupportedPolicy",
    "UnsupportedTask",
    "WorkerClosed",
    "WorkerLost",
]
