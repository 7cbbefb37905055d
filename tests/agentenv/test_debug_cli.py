"""`agentenv debug` driven through a real terminal (pexpect), as a person would use it."""

from __future__ import annotations

import sys
from pathlib import Path

import pexpect
import pytest

from agentenv.scaffold import scaffold

pytestmark = pytest.mark.docker

PROMPT = "agentenv> "


def test_debug_repl_shell_oracle_verify_snapshot_restore(tmp_path: Path, base_image: str) -> None:
    folder = scaffold("dbg_task", "coding", tmp_path)
    child = pexpect.spawn(sys.executable, ["-m", "agentenv.cli", "debug", str(folder), "--seed", "3"],
                          encoding="utf-8", timeout=120, dimensions=(50, 200))
    try:
        child.expect("multiplied by 5")  # the instruction of seed 3
        child.expect_exact(PROMPT)

        def run(line: str, *expect: str) -> None:
            child.sendline(line)
            for text in expect:
                child.expect_exact(text)
            child.expect_exact(PROMPT)

        run("ls", "calc.py", "[exit 0]")
        run(":diff", "no changes since setup")
        run(":verify", "reward 0 FAIL")
        run(":snapshot", "snapshot s1")
        run(":oracle", "oracle done")
        run(":diff", "M calc.py")
        run(":verify", "reward 1 PASS")
        run(':tool read_file {"path": "calc.py"}', "return x * 5", "[ok]")
        run(":restore s1", "restored s1")
        run("grep -c NotImplementedError calc.py", "1", "[exit 0]")
        run(":oracle", "oracle done")
        run(":reset", "reset to the state after setup")
        run(":diff", "no changes since setup")
        run(":tool nope {}", "expected one of exec_shell")
        run(":bogus", "unknown command :bogus")
        child.sendline(":quit")
        child.expect_exact("sandbox closed")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
