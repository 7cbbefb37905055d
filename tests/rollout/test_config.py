"""RolloutConfig: the example loads, errors name the field path, shorthands expand, configs pickle."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from rollout.config import ConfigError, RolloutConfig, StalePolicy, load_config, parse_config

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollout.yaml"


def test_example_loads() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.run_id == "quickstart-rollout" and cfg.group_size == 2 and cfg.policy.kind == "scripted"
    assert cfg.tasks.tags == ("quickstart",)
    assert cfg.staleness.policy is StalePolicy.ABORT_AND_RESUME
    assert cfg.ray.address is None and cfg.ray.num_cpus == 2


def test_defaults_are_a_small_embedded_run() -> None:
    cfg = parse_config({"run_id": "r"})
    assert cfg.store == "sqlite:///runs/agentenv.db"
    assert cfg.seeds == (0,) and cfg.retries.sandbox_lost == 1 and cfg.ray.worker_resource == "docker_daemon"


def test_errors_name_the_file_and_field_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "run_id: r\nworkers: 0\nrotation: {kind: weighted, harnesses: [codex]}\n"
        "staleness: {policy: keep}\npolicy: {kind: openai}\nefforts: {levels: [medium]}\nbogus: 1\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    for where in ("workers:", "rotation:", "staleness.policy:", "policy:", "efforts:", "bogus:"):
        assert f"{path}: {where}" in msg, msg
    assert "medium" in msg and "url/model" in msg


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope.yaml: cannot read the config file \(no such file\)"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_id: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)


def test_seed_count_shorthand_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("run_id: r\nseeds: 3\n")
    cfg = load_config(path, store="sqlite:////tmp/x.db", run_id=None)
    assert cfg.seeds == (0, 1, 2) and cfg.store == "sqlite:////tmp/x.db" and cfg.run_id == "r"
    assert cfg.planned_per_task == 3 * cfg.group_size
    with pytest.raises(ConfigError, match="seeds"):
        parse_config({"run_id": "r", "seeds": [1, 1]})


def test_effort_draw_weights_and_none() -> None:
    cfg = parse_config({"run_id": "r", "efforts": {"levels": ["low", "max"], "weights": [0, 1]}})
    assert {cfg.efforts.pick(i) for i in range(50)} == {"max"}
    assert parse_config({"run_id": "r", "efforts": {"levels": []}}).efforts.pick(0) is None


def test_policy_kinds_need_their_fields() -> None:
    with pytest.raises(ConfigError, match="checkpoint"):
        parse_config({"run_id": "r", "policy": {"kind": "hf"}})
    ok = parse_config({"run_id": "r", "policy": {"kind": "openai", "url": "http://h:8000/v1", "model": "m"}})
    assert ok.policy.url == "http://h:8000/v1"


def test_config_pickles_for_ray() -> None:
    cfg = load_config(EXAMPLE)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert isinstance(RolloutConfig.model_validate(cfg.model_dump(mode="json")), RolloutConfig)


def test_runs_sweeps_and_training_share_one_fleet_model_and_its_defaults() -> None:
    from learner.train_config import TrainConfig
    from rollout.config import FleetConfig, RolloutSettings, WorkerRetries
    from rollout.eval.config import SweepConfig

    fleet = set(FleetConfig.model_fields)
    assert fleet == {"backend", "workers", "concurrency", "pool_size", "warm", "grading", "ray"}
    sweep = SweepConfig.model_validate({"sweep_id": "s", "policies": [{"name": "o", "kind": "oracle"}]})
    train = TrainConfig(run_id="t")
    run = parse_config({"run_id": "r"})
    assert isinstance(train.rollout, RolloutSettings) and isinstance(sweep, FleetConfig) and isinstance(run, FleetConfig)
    for name in fleet:  # one default each, pool_size 2 everywhere
        assert getattr(sweep, name) == getattr(train.rollout, name) == getattr(run, name) == FleetConfig.model_fields[name].get_default(
            call_default_factory=True), name
    assert run.pool_size == 2
    for retries in (sweep.retries, train.rollout.retries, run.retries):
        assert isinstance(retries, WorkerRetries) and (retries.worker_lost, retries.worker_restarts, retries.sandbox_acquire) == (3, 3, 1)


def test_a_training_run_gives_its_rollout_job_its_id_store_and_defaults() -> None:
    from learner.train_config import TrainConfig

    job = TrainConfig(run_id="t", store="sqlite:///x.db", rollout={"workers": 3}).rollout_job("t-phase")
    assert isinstance(job, RolloutConfig)
    assert (job.run_id, job.store, job.workers, job.seeds, job.policy.kind) == ("t-phase", "sqlite:///x.db", 3, (0,), "scripted")
    assert TrainConfig(run_id="t").rollout_job().store == "sqlite:///runs/agentenv.db"
