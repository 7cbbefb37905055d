"""The distill config: errors name the file and the field; a grid that does not cover the run is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agentenv.cli import app
from distill.loop import check_routable, load_grid
from distill.types import DistillConfigError, load_distill_config
from rollout.config import ConfigError

pytestmark = pytest.mark.unit

GRID = {"cells": {f"{d}/{e}": {"kind": "hf", "path": "ckpt"} for d in ("general", "agent", "coding")
                  for e in ("low", "high", "max")}}


def _write(tmp_path: Path, **changes: Any) -> Path:
    cfg: dict[str, Any] = {"run_id": "x", "out_dir": str(tmp_path), "rollout": {"tasks": {"ids": ["general/answer_number"]},
                           "efforts": {"levels": ["low", "high", "max"]}}, "distill": {"teachers": GRID}}
    cfg.update(changes)
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_valid_config_loads_with_its_folder(tmp_path: Path) -> None:
    cfg, root = load_distill_config(_write(tmp_path))
    assert root == tmp_path and cfg.distill.clip == 5.0 and cfg.distill.student_logprobs == "learner"
    grid = load_grid(cfg, root)
    assert grid.cells["coding/max"].path == str(tmp_path / "ckpt")  # type: ignore[union-attr]  # relative to the config


@pytest.mark.parametrize(("changes", "message"), [
    ({"distill": {"teachers": GRID, "clip": 0}}, "distill.clip: Input should be greater than 0"),
    ({"distill": {"teachers": GRID, "alpah": 1}}, "distill.alpah: Extra inputs are not permitted"),
    ({"distill": {"clip": 1.0}}, "distill.teachers: Field required"),
    ({"distill": {"teachers": GRID, "student_logprobs": "rollout"},
      "rollout": {"tasks": {"ids": ["general/answer_number"]}, "sampling": {"temperature": 0.7}}},
     "distill.student_logprobs: 'rollout' takes the sampling-time logprobs"),
    ({"rollout": {"tasks": {"ids": ["general/answer_number"]}, "efforts": {"levels": []}}},
     "rollout.efforts.levels: MOPD routes each sample"),
])
def test_errors_name_the_file_and_the_field(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(DistillConfigError) as info:
        load_distill_config(_write(tmp_path, **changes))
    assert isinstance(info.value, ConfigError)
    assert str(info.value).startswith(str(tmp_path / "distill.yaml")) and message in str(info.value), str(info.value)


def test_a_config_without_the_distill_section_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({"run_id": "x", "rollout": {}}))
    with pytest.raises(DistillConfigError, match=r"d.yaml: distill: missing"):
        load_distill_config(path)


def test_a_grid_that_does_not_cover_the_run_is_refused_naming_the_field(tmp_path: Path) -> None:
    grid = {"efforts": {"low": {"tau": 0.5}, "high": {"tau": 1.0}},
            "cells": {f"{d}/{e}": {"kind": "hf", "path": "nowhere"} for d in ("general", "agent", "coding") for e in ("low", "high")}}
    cfg, root = load_distill_config(_write(tmp_path, distill={"teachers": grid},
                                           rollout={"tasks": {"ids": ["general/answer_number"]}, "efforts": {"levels": ["low", "max"]}}))
    with pytest.raises(DistillConfigError, match=r"rollout.efforts.levels: 'max' has no teachers in the grid .* 'general/max'"):
        check_routable(load_grid(cfg, root), {"general/answer_number": "general"}, cfg)
    with pytest.raises(DistillConfigError, match=r"rollout.tasks: task 'math/x' has domain 'math'"):
        check_routable(load_grid(cfg, root), {"math/x": "math"}, cfg)
    result = CliRunner().invoke(app, ["distill", str(tmp_path / "distill.yaml")])  # the CLI: exit 2, the same line
    assert result.exit_code == 2 and "'max' has no teachers in the grid" in result.output


@pytest.mark.parametrize(("effort", "message"), [
    ({"tau": {"low": 0.5, "high": 1.0, "max": 3.0}, "budgets": "b.json"},
     r"effort.tau: 3.0 for level 'max' conflicts with the teacher grid's efforts.max.tau: 2.0 \(distill.teachers\)"),
    ({"max_thinking_tokens": {"low": 8}},
     r"effort.max_thinking_tokens: 8 for level 'low' conflicts with the teacher grid's efforts.low.max_thinking_tokens: 4"),
])
def test_an_effort_setting_given_by_the_run_and_the_grid_must_agree(tmp_path: Path, effort: dict[str, Any], message: str) -> None:
    grid = {**GRID, "efforts": {"low": {"tau": 0.5, "max_thinking_tokens": 4}, "high": {"tau": 1.0}, "max": {"tau": 2.0}}}
    tasks = {"general/answer_number": "general"}
    agreeing = {"tau": {"low": 0.5, "high": 1.0, "max": 2.0}, "budgets": "b.json", "max_thinking_tokens": {"low": 4}}
    for given, ok in ((agreeing, True), ({}, True), (effort, False)):
        cfg, root = load_distill_config(_write(tmp_path, distill={"teachers": grid}, effort=given,
                                               rollout={"tasks": {"ids": list(tasks)}, "efforts": {"levels": ["low", "high", "max"]}}))
        if ok:
            check_routable(load_grid(cfg, root), tasks, cfg)
        else:
            with pytest.raises(DistillConfigError, match=message):
                check_routable(load_grid(cfg, root), tasks, cfg)
