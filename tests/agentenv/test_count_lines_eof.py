"""general/count_lines_eof keeps what the main job relies on: a tidy family below seed 1000 where both
commands pass, a full family where `wc -l` is wrong on files without their last newline."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentenv.tasks.builtin as builtin_pkg
from agentenv.task import FolderTask
from agentenv.variants import context, render

pytestmark = pytest.mark.unit

TASK = FolderTask.load(Path(builtin_pkg.__path__[0]) / "general/count_lines_eof")


def _bare(seed: int) -> bool:
    v = TASK.variant(seed)
    script = render((TASK.folder / "setup.sh").read_text(), context(v.params, v.seed), where="setup.sh")
    return "bare = True" in script


def test_tidy_family_always_ends_with_a_newline_and_the_full_family_often_does_not() -> None:
    assert not any(_bare(s) for s in range(200))
    held_out = [_bare(s) for s in range(10_000, 10_048)]
    assert 0.5 < sum(held_out) / len(held_out) < 0.85  # two in three, by the ending choice


def test_oracle_writes_wc_mostly_in_the_tidy_family_and_grep_wherever_the_newline_is_missing() -> None:
    tidy = [TASK.oracle_script(TASK.variant(s)) or "" for s in range(300)]
    wc = sum(s.startswith("wc -l") for s in tidy) / len(tidy)
    assert 0.55 < wc < 0.8
    for seed in range(10_000, 10_048):
        if _bare(seed):
            assert (TASK.oracle_script(TASK.variant(seed)) or "").startswith("grep -c ''")
