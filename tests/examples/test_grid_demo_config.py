"""The grid demo's config: the adaptation's demonstrations styled by effort only when asked, for both runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from examples.grid_demo.run import GridDemoConfig, phase_config
from learner.types import LossConfig
from rollout.config import ConfigError

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grid_demo" / "config.yaml"


def _config(tmp_path: Path, **changes: object) -> tuple[GridDemoConfig, object]:
    data = {**yaml.safe_load(EXAMPLE.read_text()), **changes}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(data))
    return GridDemoConfig.load(path)


@pytest.mark.parametrize("styles", [False, True])
def test_adapt_styles_reaches_the_adaptation_of_student_and_baseline_only(tmp_path: Path, styles: bool) -> None:
    cfg, tcfg = _config(tmp_path, adapt_styles=styles)
    for run in ("student", "baseline"):
        adapted = phase_config(cfg, tcfg, run, "warm", tmp_path / "b0.json", loss=LossConfig(), lr=1e-4, adapt=True)
        assert adapted["effort"]["oracle_styles"] is styles and adapted["effort"]["message"] is True
        assert adapted["sft"]["episodes"] == cfg.adapt.episodes
        plain = phase_config(cfg, tcfg, run, "warm", tmp_path / "b0.json", loss=LossConfig(), lr=1e-4)
        assert plain["effort"]["oracle_styles"] is False and plain["sft"]["episodes"] == 0


@pytest.mark.parametrize("moments", [False, True])
def test_adapt_moments_carry_the_adaptations_adam_into_both_runs(tmp_path: Path, moments: bool) -> None:
    # attempt 6's student and baseline started MOPD / RL from a fresh Adam after the adaptation SFT
    cfg, tcfg = _config(tmp_path, adapt_moments=moments)
    for run in ("student", "baseline"):
        adapted = phase_config(cfg, tcfg, run, "warm", tmp_path / "b0.json", loss=LossConfig(), lr=1e-4, adapt=True)
        assert adapted["rl"]["continue_sft_optimizer"] is moments
        plain = phase_config(cfg, tcfg, run, "warm", tmp_path / "b0.json", loss=LossConfig(), lr=1e-4)
        assert plain["rl"]["continue_sft_optimizer"] is False  # no adaptation, no moments to carry
    assert GridDemoConfig.model_fields["adapt_moments"].default is True


def test_adapt_styles_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"grid\.yaml: adapt_styles: "):
        _config(tmp_path, adapt_styles="sometimes")


def test_the_ablation_drops_the_message_and_the_thinking_cap_and_nothing_else() -> None:
    """A cap tells the level too (low's 4 thinking tokens): the ablation must take both away, the student keep both."""
    from examples.grid_demo.run import model_requests
    from rollout.episode import EpisodeRequest

    requests = [EpisodeRequest(episode_id=f"run/cell-general-{e}-0", run_id="run", task_id="general/count_lines", seed=10000,
                               harness="codex", effort=e, thinking_budget=cap, show_effort=True)
                for e, cap in (("low", 4), ("high", 32), ("max", None))]
    shown = model_requests(requests, "run", "student", True)
    ablated = model_requests(requests, "run", "student_no_message", False)
    assert [r.thinking_budget for r in shown] == [4, 32, None] and all(r.show_effort for r in shown)
    assert [r.thinking_budget for r in ablated] == [None, None, None] and not any(r.show_effort for r in ablated)
    assert [r.episode_id for r in ablated] == [f"run/student_no_message/cell-general-{e}-0" for e in ("low", "high", "max")]
    for a, r in zip(ablated, requests):  # the same episodes otherwise: seeds, harnesses, levels
        assert (a.task_id, a.seed, a.harness, a.effort) == (r.task_id, r.seed, r.harness, r.effort)
