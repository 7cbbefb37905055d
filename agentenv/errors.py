"""The one exception tree of ``agentenv``.

Every class also inherits the matching built-in, so code that only knows
Python's own exceptions (``ValueError``, ``LookupError`` ...) still catches it.
Messages name the file, the field path or the argument, say what was expected
and what arrived, and add a "did you mean" hint where a near name exists.

What is *not* here on purpose: a bad model output. Malformed tool calls are
data (a tool-error observation), never an exception; see ``agentenv.env``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AgentEnvError(Exception):
    """Base of every error raised by ``agentenv``."""


class TaskSpecError(AgentEnvError, ValueError):
    """A task folder or its ``task.yaml`` is invalid.

    ``problems`` holds one line per problem (``file: field.path: message``) so a
    CLI can list them all at once instead of making the author fix one per run.
    """

    def __init__(self, message: str, problems: Iterable[str] = ()) -> None:
        self.problems: tuple[str, ...] = tuple(problems) or (message,)
        super().__init__(message)


class TemplateError(AgentEnvError, ValueError):
    """An instruction/setup/solution template failed to render (e.g. an undefined variable)."""


class TaskNotFound(AgentEnvError, LookupError):
    """No registered task has this id."""


class HarnessNotFound(AgentEnvError, LookupError):
    """No harness is registered under this name in the ``agentenv.harnesses`` group."""


class BackendNotFound(AgentEnvError, LookupError):
    """A backend name that ``sandboxes.backends.make_backend`` does not know."""


class ConfigError(AgentEnvError, ValueError):
    """A config file or section is invalid; the message names the file, the field path, what was expected
    and what arrived (``agentenv.configs``). Each package's own config error inherits it."""


class SetupError(AgentEnvError, RuntimeError):
    """A task's setup script failed in the sandbox (the message holds its output tail)."""


class OracleError(AgentEnvError, RuntimeError):
    """The oracle solution failed: a broken task, never an agent failure."""


class EpisodeStateError(AgentEnvError, RuntimeError):
    """An env method was called in the wrong state (``step`` before ``reset`` or after the end)."""


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


__all__ = [
    "AgentEnvError",
    "BackendNotFound",
    "ConfigError",
    "EpisodeStateError",
    "HarnessNotFound",
    "OracleError",
    "SetupError",
    "TaskNotFound",
    "TaskSpecError",
    "TemplateError",
    "did_you_mean",
]
