"""The turn gate: where an episode in flight waits between turns while the learner trains.

Partial rollouts (Kimi K1.5, slime) need episodes that outlive one iteration:
the engine takes an iteration's batch as soon as enough groups have finished,
and the episodes still running are not thrown away but continued under the
next weights. In the synchronous engine (staleness K = 0 apart from those
stragglers) they must not sample while the learner trains, or their turns
would come from weights that are about to change mid-batch for no reason;
so the engine closes the gate before a learner step and opens it after the
publish. An episode checks the gate before each turn (never inside one), and
the time it waited is not charged to its wall-clock budget.

In the asynchronous engine the gate stays open: rollouts go on during
training, bounded by the staleness check instead.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["TurnGate"]


class TurnGate:
    """Open by default. ``close()`` holds every episode at its next turn boundary until ``open()``.

    Lives on one event loop (the runner's or the Ray worker's); not thread-safe.
    """

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = 0  # episodes held right now
        self.paused_total = 0  # turn boundaries that had to wait, since start

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def wait(self) -> float:
        """Return at once when open; else wait for ``open()``. Returns the seconds waited."""
        if self._open.is_set():
            return 0.0
        t0 = time.monotonic()
        self.waiting += 1
        self.paused_total += 1
        try:
            await self._open.wait()
        finally:
            self.waiting -= 1
        return time.monotonic() - t0
