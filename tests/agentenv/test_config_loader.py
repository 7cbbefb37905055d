"""agentenv.configs: every config reads through one loader; its errors name the file, the field path,
what the field expected and what arrived, and list every problem at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentenv.configs import ConfigError, format_loc, load_yaml_config, read_yaml, validate_config
from distill.types import DistillConfigError
from learner.errors import LearnerConfigError
from learner.train_config import TrainConfig, load_train_config
from rollout.config import ConfigError as RolloutConfigError
from rollout.config import RolloutConfig, load_config
from rollout.eval.config import load_sweep
from rollout.eval.types import SweepConfigError
from teachers.grid import TeacherGridConfig
from teachers.types import TeacherConfigError

pytestmark = pytest.mark.unit


def _write(tmp_path: Path, data: object, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("loc", "prefix", "shown"), [
    (("policies", 1, "url"), "", "policies[1].url"),
    (("rollout", "sampling", "temperature"), "", "rollout.sampling.temperature"),
    (("model", "hiden_size"), "base", "base.model.hiden_size"),
    ((0, "x"), "", "[0].x"),
    ((), "", "(top level)"),
    ((), "teachers", "teachers"),
])
def test_format_loc_writes_the_path_a_user_types(loc: tuple, prefix: str, shown: str) -> None:
    assert format_loc(loc, prefix) == shown


def test_an_error_names_the_file_the_field_and_expected_vs_got(tmp_path: Path) -> None:
    path = _write(tmp_path, {"run_id": "r", "workers": 0})
    with pytest.raises(RolloutConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: workers: Input should be greater than or equal to 1, got 0"


def test_an_unknown_key_gets_the_nearest_known_one(tmp_path: Path) -> None:
    path = _write(tmp_path, {"run_id": "r", "retries": {"sandbox_lots": 2}})
    with pytest.raises(RolloutConfigError, match=r"retries.sandbox_lots: Extra inputs are not permitted "
                                                 r"\(did you mean 'sandbox_lost'\?\); expected one of sandbox_acquire, "):
        load_config(path)


def test_every_problem_is_listed_the_first_on_the_first_line(tmp_path: Path) -> None:
    path = _write(tmp_path, {"run_id": "r", "workers": 0, "concurrency": "many", "sampling": {"top_p": 2}})
    with pytest.raises(RolloutConfigError) as info:
        load_config(path)
    lines = str(info.value).split("\n")
    assert len(lines) == 3 and lines[0].startswith(f"{path}: workers: ")
    assert f"  {path}: concurrency: Input should be a valid integer" in lines[1] and "got 'many'" in lines[1]
    assert lines[2].startswith(f"  {path}: sampling.top_p: Input should be less than or equal to 1, got 2")


def test_a_validators_own_message_arrives_as_written(tmp_path: Path) -> None:
    path = _write(tmp_path, {"run_id": "r", "seeds": [1, 1]})
    with pytest.raises(RolloutConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: seeds: seeds must be distinct, got [1, 1]"  # no "Value error, "


def test_a_whole_config_rule_names_its_fields_without_a_path(tmp_path: Path) -> None:
    path = _write(tmp_path, {"run_id": "r", "rollout": {"group_size": 1}})
    with pytest.raises(LearnerConfigError) as info:
        load_train_config(path)
    assert str(info.value).startswith(f"{path}: rollout.group_size: group-relative advantages need >= 2 samples")


def test_unreadable_malformed_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope.yaml: cannot read the config file \(no such file\); expected a readable"):
        read_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML"):
        read_yaml(bad)
    with pytest.raises(ConfigError, match=r"list.yaml: expected a mapping of config fields, got list"):
        load_yaml_config(RolloutConfig, _write(tmp_path, [1, 2], "list.yaml"))


def test_overrides_replace_top_level_fields_unless_none(tmp_path: Path) -> None:
    path = _write(tmp_path, {"run_id": "r", "workers": 3})
    cfg = load_yaml_config(RolloutConfig, path, overrides={"run_id": "s", "workers": None})
    assert (cfg.run_id, cfg.workers) == ("s", 3)


def test_a_section_reports_its_path_inside_the_file() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(TrainConfig, {"run_id": "x", "model": {"hiden_size": 8}}, source="teachers.yaml", prefix="base")
    assert str(info.value).startswith("teachers.yaml: base.model.hiden_size: Extra inputs are not permitted "
                                      "(did you mean 'hidden_size'?)")


def test_each_package_raises_its_own_config_error_under_one_base(tmp_path: Path) -> None:
    bad = _write(tmp_path, {"x": 1}, "bad.yaml")
    for load, error in ((load_config, RolloutConfigError), (load_sweep, SweepConfigError),
                        (load_train_config, LearnerConfigError), (TeacherGridConfig.load, TeacherConfigError)):
        with pytest.raises(error) as info:
            load(bad)
        assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
        assert str(info.value).startswith(f"{bad}: ")
    assert issubclass(DistillConfigError, ConfigError)
