"""Worker pieces that need neither Ray nor Docker: what crosses to Ray pickles, versions apply between
episodes, and the CLI routes a config path to `run` and reports bad configs with exit code 2."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rollout.config import load_config
from rollout.episode import EpisodeRequest
from rollout.policy.scripted import ScriptedPolicy
from rollout.scheduler import RolloutReport, WorkerLost
from rollout.types import Sample, Status, Trajectory, Turn
from rollout.worker import WorkerSpec, apply_version

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollout.yaml"


def test_everything_sent_through_ray_pickles() -> None:
    """Arguments and results of actor calls, with pickle and with Ray's cloudpickle."""
    import ray.cloudpickle as cloudpickle

    cfg = load_config(EXAMPLE)
    traj = Trajectory(
        episode_id="e", run_id="r", task_id="t", domain="general", seed=1, harness="codex", effort="low",
        policy_version=3, status=Status.OK, reward=1.0, samples=(Sample((1, 2), (0.0, -0.5), (0, 1)),),
        turns=(Turn(index=0, policy_version=3, tool_calls=1),), verifier={"passed": True},
    )
    payloads: list[Any] = [
        cfg, WorkerSpec.from_config(cfg), EpisodeRequest("e", "r", "t", 1, "codex", "low", "g", 2), traj,
        RolloutReport(planned=3, stored=3), WorkerLost("gone"),
    ]
    for obj in payloads:
        for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
            back = loads(dumps(obj))
            assert type(back) is type(obj)
            if not isinstance(obj, Exception):
                assert back == obj


class FakeModelPolicy:
    name = "fake"

    def __init__(self) -> None:
        self.version = 0
        self.swaps: list[tuple[Any, int]] = []

    def set_weights(self, weights: Any, version: int) -> None:
        self.swaps.append((weights, version))
        self.version = version


def test_apply_version_swaps_model_weights_in_place_and_renumbers_the_oracle() -> None:
    model = FakeModelPolicy()
    assert apply_version(model, 2, {"w": 1}) is model and model.swaps == [({"w": 1}, 2)]
    assert apply_version(model, 3, None) is model and model.version == 2  # a number alone relabels nothing
    old = ScriptedPolicy()
    new = apply_version(old, 4)
    assert new is not old and new.version == 4 and old.version == 0  # running episodes keep theirs
    with pytest.raises(TypeError):
        apply_version(object(), 1)


def test_cli_routes_config_to_run_and_bad_config_exits_2(tmp_path: Path) -> None:
    import typer

    from agentenv.cli.rollout import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps `rollout` a group, as in the real CLI
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_id: r\nstaleness: {policy: keep}\n")
    result = CliRunner().invoke(app, ["rollout", str(bad)])
    assert result.exit_code == 2, result.output
    assert "staleness.policy" in result.output
    help_out = CliRunner().invoke(app, ["rollout", "--help"]).output
    assert "run" in help_out and "bench" in help_out
