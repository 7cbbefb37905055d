"""Lazy package faces: a package's ``__init__`` names its public API without importing it.

Each library package lists its public names and the module that defines each; ``import rollout``
then costs nothing (no torch, no Ray, no Docker client), and ``rollout.EpisodeRunner`` imports
``rollout.episode`` on first use. ``tests/test_exported_members.py`` pins every package's list, so
the public API changes only on purpose.

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"SandboxPool": "sandboxes.pool"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The ``__getattr__``, ``__dir__`` and ``__all__`` of ``package``, whose public names are the keys
    of ``exports`` (name -> the module that defines it)."""
    names = sorted(exports)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, list(names)
