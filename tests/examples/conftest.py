"""What the example-config tests share: a config as one flat mapping, to list the settings two twins differ in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from learner.train_config import load_train_config


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out |= _flat(value, f"{prefix}.{key}" if prefix else key)
        return out
    return {prefix: tree}


@pytest.fixture
def flat_config() -> Callable[[Path], dict[str, Any]]:
    """``flat_config(path)``: the train config at ``path``, resolved, as ``{"rollout.group_size": 8, ...}``."""
    return lambda path: _flat(load_train_config(path).model_dump())
