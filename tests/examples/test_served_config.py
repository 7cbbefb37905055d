"""examples/served.yaml is the quickstart with its train turns on servers: the same run in every other setting."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from learner.train_config import load_train_config

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_served_differs_from_the_quickstart_only_in_serving(flat_config: Callable[[Path], dict[str, Any]]) -> None:
    quick = flat_config(EXAMPLES / "quickstart.yaml")
    served_cfg = load_train_config(EXAMPLES / "served.yaml")
    served = flat_config(EXAMPLES / "served.yaml")
    differ = {k for k in quick.keys() | served.keys() if quick.get(k) != served.get(k)}
    assert differ == {"run_id"} | {k for k in served if k.startswith("serving.") and served[k] is not None}
    assert served_cfg.serving is not None and len(served_cfg.serving.urls) == 2 and served_cfg.serving.transport == "disk"
