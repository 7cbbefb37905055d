"""The README's authoring walk-through, followed to the letter through the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

README = Path(__file__).resolve().parents[2] / "README.md"


def _commands() -> list[str]:
    text = README.read_text()
    section = text.split("<!-- authoring:start -->")[1].split("<!-- authoring:end -->")[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("agentenv ")]


def _agentenv(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentenv.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=400)


def test_readme_walkthrough_gives_a_task_that_passes_check(tmp_path: Path, base_image: str) -> None:
    commands = _commands()
    assert commands[0].startswith("agentenv new my_task --domain coding")
    assert any(c.startswith("agentenv check ./my_task") for c in commands)
    for command in commands:
        if command.startswith("agentenv debug"):
            continue  # interactive; covered by test_debug_cli
        result = _agentenv(command.split()[1:], tmp_path)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    # the same folder, checked with a JSON report
    result = _agentenv(["check", "./my_task", "--seeds", "2", "--json", "report.json"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    names = {c["name"]: c["passed"] for c in report[0]["checks"]}
    assert all(names.values()) and {"image", "hidden", "do-nothing", "oracle seed=1"} <= names.keys()


def test_check_fails_on_a_broken_oracle_and_a_leaked_test(tmp_path: Path, base_image: str) -> None:
    assert _agentenv(["new", "bad_task", "--domain", "coding"], tmp_path).returncode == 0
    folder = tmp_path / "bad_task"
    (folder / "solution" / "solve.sh").write_text("echo 'I give up'\n")
    (folder / "workspace" / "copy_of_test.py").write_bytes((folder / "tests" / "test_calc.py").read_bytes())
    result = _agentenv(["check", str(folder), "--seeds", "1", "--json", "reports/bad.json"], tmp_path)
    assert result.returncode == 1
    assert "FAIL: 1 of 1 tasks: bad_task" in result.stdout
    checks = {c["name"]: c for c in json.loads((tmp_path / "reports" / "bad.json").read_text())[0]["checks"]}
    assert not checks["hidden"]["passed"] and "copy_of_test.py is the hidden file" in checks["hidden"]["detail"]
    assert not checks["oracle seed=0"]["passed"] and checks["do-nothing"]["passed"]
