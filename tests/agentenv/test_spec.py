"""task.yaml errors name the file, the field path, what was expected, and a near-miss hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentenv.errors import AgentEnvError, TaskSpecError
from agentenv.scaffold import scaffold
from agentenv.spec import load_spec

pytestmark = pytest.mark.unit


def _task(tmp_path: Path, yaml_text: str, instruction: str = "Do it.\n") -> Path:
    folder = tmp_path / "foo"
    (folder / "solution").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.yaml").write_text(yaml_text)
    (folder / "instruction.md").write_text(instruction)
    (folder / "solution" / "solve.sh").write_text("true\n")
    return folder


def _problems(folder: Path) -> str:
    with pytest.raises(TaskSpecError) as info:
        load_spec(folder)
    return str(info.value)


def test_unknown_verifier_type_names_file_path_expected_and_hint(tmp_path: Path) -> None:
    msg = _problems(_task(tmp_path, "domain: coding\nverifiers:\n  - type: unittest\n"))
    assert "foo/task.yaml: verifiers.0.type: expected one of unit_tests|db_state|" in msg
    assert "got 'unittest' (did you mean 'unit_tests'?)" in msg


def test_unknown_keys_get_did_you_mean_at_every_depth(tmp_path: Path) -> None:
    msg = _problems(_task(tmp_path, "domain: coding\ninstructon: x\nlimits: {max_turn: 3}\n"
                          "verifiers:\n  - type: unit_tests\n    fail_to_pas: [a]\n"))
    assert "task.yaml: unknown key 'instructon' (did you mean 'instruction'?)" in msg
    assert "limits: unknown key 'max_turn' (did you mean 'max_turns'?)" in msg
    assert "verifiers.0: unknown key 'fail_to_pas' (did you mean 'fail_to_pass'?)" in msg
    assert "3 problems" in msg


def test_enum_and_missing_field(tmp_path: Path) -> None:
    msg = _problems(_task(tmp_path, "domain: codng\n"))
    assert "domain: expected one of general|agent|coding, got 'codng' (did you mean 'coding'?)" in msg
    assert "verifiers: required field is missing" in msg


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    msg = _problems(_task(tmp_path, "domain: coding\nverifiers: [\n"))
    assert "task.yaml: line" in msg and "invalid YAML" in msg


def test_folder_problems_missing_files_and_undeclared_template_names(tmp_path: Path) -> None:
    folder = _task(tmp_path, "domain: coding\nsetup: setup.sh\nparams:\n  n: {type: int, low: 5, high: 1}\n"
                   "verifiers:\n  - type: answer\n    expected: '1'\n", instruction="Count {{ nn }}.\n")
    msg = _problems(folder)
    assert "setup: file 'setup.sh' not found" in msg
    assert "params.n: expected low <= high, got low=5 high=1" in msg
    assert "instruction.md: uses {{ nn }} but no parameter 'nn' is declared (did you mean 'n'?)" in msg


def test_errors_inherit_builtins(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        load_spec(tmp_path / "missing")
    assert issubclass(TaskSpecError, AgentEnvError)


def test_scaffold_loads_and_id_defaults_to_folder_name(tmp_path: Path) -> None:
    folder = scaffold("my_task", "coding", tmp_path)
    spec = load_spec(folder)
    assert spec.id == "my_task" and spec.domain.value == "coding"
    (folder / "task.yaml").write_text((folder / "task.yaml").read_text().replace("id: my_task", "# no id"))
    assert load_spec(folder).id == "my_task"
