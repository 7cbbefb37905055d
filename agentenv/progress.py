"""Progress display of long jobs (train, distill, teachers train, the grid demo): one rich bar per phase.

``phase_progress()`` yields a ``RichReporter``, which fits ``learner.loop.Reporter``: ``phase`` starts a
bar (hiding the previous one), ``advance`` moves it, ``log`` prints a line above the bars. ``console``
is the one rich console they print to, shared with the commands that print tables after the bars.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

__all__ = ["RichReporter", "console", "phase_progress"]

console = Console()


class RichReporter:
    """Phases as rich progress bars; log lines printed above them."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.task: Any = None

    def phase(self, name: str, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, visible=False)
        self.task = self.progress.add_task(name, total=total, detail="")

    def advance(self, detail: str = "") -> None:
        if self.task is not None:
            self.progress.update(self.task, advance=1, detail=detail)

    def log(self, line: str) -> None:
        self.progress.console.log(line)


@contextmanager
def phase_progress() -> Iterator[RichReporter]:
    """One rich progress display for a long job's phases (train, distill, teachers train); yields its reporter."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}"), console=console,
    ) as progress:
        yield RichReporter(progress)
