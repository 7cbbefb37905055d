"""AgentENV: verifiable tasks in sandboxes, graded by physical checks.

The single-env entry point is ``agentenv.make`` (a ``gymnasium.Env``); the
task registry is ``agentenv.get_task`` / ``agentenv.list_tasks``. They are
imported on first use so ``import agentenv`` stays cheap for workers that only
need the contracts in ``agentenv.types``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentenv.env import make
    from agentenv.registry import get_task, list_tasks

_LAZY = {"make": "agentenv.env", "get_task": "agentenv.registry", "list_tasks": "agentenv.registry"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentenv' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["get_task", "list_tasks", "make"]
