"""``benches.rollout.CpuMeter``: host-wide busy CPU from /proc/stat, which the bench reports per episode."""

from __future__ import annotations

import time

import pytest

from benches.rollout import CpuMeter

pytestmark = pytest.mark.unit


def test_cpu_meter_sees_a_busy_loop() -> None:
    meter = CpuMeter()
    meter.start()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 s of this process's own CPU
        pass
    meter.stop()
    assert meter.cpu_s >= 0.2, "a 0.3 s busy loop shows up in the host's busy time"
    assert 0.0 < meter.busy_cores <= (__import__("os").cpu_count() or 1)


def test_cpu_meter_before_start_reads_nothing() -> None:
    meter = CpuMeter()
    assert meter.cpu_s == 0.0 and meter.busy_cores == 0.0
