"""The grid demo's config: the adaptation's demonstrations styled by effort only when asked, for both runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from distill.grid_demo import GridDemoConfig, _phase_config
from learner.types import LossConfig
from rollout.config import ConfigError

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grid_demo.yaml"


def _config(tmp_path: Path, **changes: object) -> tuple[GridDemoConfig, object]:
    data = {**yaml.safe_load(EXAMPLE.read_text()), **changes}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(data))
    return GridDemoConfig.load(path)


@pytest.mark.parametrize("styles", [False, True])
def test_adapt_styles_reaches_the_adaptation_of_student_and_baseline_only(tmp_path: Path, styles: bool) -> None:
    cfg, tcfg = _config(tmp_path, adapt_styles=styles)
    for run in ("student", "baseline"):
        adapted = _phase_config(cfg, tcfg, run, "warm", tmp_path / "b0.json", loss=LossConfig(), lr=1e-4, adapt=True)
        assert adapted["effort"]["oracle_styles"] is styles and adapted["effort"]["message"] is True
        assert adapted["sft"]["episodes"] == cfg.adapt.episodes
        plain = _phase_config(cfg, tcfg, run, "warm", tmp_path / "b0.json", loss=LossConfig(), lr=1e-4)
        assert plain["effort"]["oracle_styles"] is False and plain["sft"]["episodes"] == 0


def test_adapt_styles_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"grid\.yaml: adapt_styles: "):
        _config(tmp_path, adapt_styles="sometimes")
