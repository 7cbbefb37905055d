"""examples/quickstart_cuda.yaml is the main job on a GPU: it must stay the quickstart in every setting but where
the learner and the rollout engine run, in fp32 as on the CPU (and its run id), or the H200 run stops being comparable with the CPU one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_quickstart_cuda_differs_from_the_quickstart_only_in_devices(flat_config: Callable[[Path], dict[str, Any]]) -> None:
    cpu = flat_config(EXAMPLES / "quickstart.yaml")
    gpu = flat_config(EXAMPLES / "quickstart_cuda.yaml")
    differ = {k: (cpu.get(k), gpu.get(k)) for k in cpu.keys() | gpu.keys() if cpu.get(k) != gpu.get(k)}
    assert differ == {"run_id": ("quickstart", "quickstart_cuda"), "model.device": ("cpu", "cuda"),
                      "model.rollout_device": ("cpu", "cuda"), "trainer.bf16": (None, False)}
