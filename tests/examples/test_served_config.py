"""examples/served.yaml is the quickstart with its train turns on servers: the same run in every other setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from learner.train_config import load_train_config

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out |= _flat(value, f"{prefix}.{key}" if prefix else key)
        return out
    return {prefix: tree}


def test_served_differs_from_the_quickstart_only_in_serving() -> None:
    quick = _flat(load_train_config(EXAMPLES / "quickstart.yaml").model_dump())
    served_cfg = load_train_config(EXAMPLES / "served.yaml")
    served = _flat(served_cfg.model_dump())
    differ = {k for k in quick.keys() | served.keys() if quick.get(k) != served.get(k)}
    assert differ == {"run_id"} | {k for k in served if k.startswith("serving.") and served[k] is not None}
    assert served_cfg.serving is not None and len(served_cfg.serving.urls) == 2 and served_cfg.serving.transport == "disk"
