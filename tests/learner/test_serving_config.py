"""``serving:`` in train and distill configs: what is accepted, what is refused and how the refusal reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from distill.types import load_distill_config
from learner.errors import LearnerConfigError
from learner.serving import DiskServerPublisher, make_server_publisher
from learner.train_config import TrainConfig, load_train_config
from learner.types import ServingConfig

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SERVING = {"urls": ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002"], "model": "student"}


def _cfg(**extra: object) -> dict[str, object]:
    return {"run_id": "s", "rollout": {"tasks": {"ids": ["general/answer_number"]}}, "serving": SERVING, **extra}


def test_a_train_config_takes_a_served_policy() -> None:
    cfg = TrainConfig.model_validate(_cfg())
    assert cfg.serving is not None and cfg.serving.transport == "disk" and cfg.serving.urls == SERVING["urls"]


def test_the_old_refusal_now_points_to_serving() -> None:
    with pytest.raises(ValueError, match="rollout.policy: .*serving:"):
        TrainConfig.model_validate(_cfg(rollout={"policy": {"kind": "openai", "url": "http://x:1/v1", "model": "m"}}))


@pytest.mark.parametrize(("serving", "field"), [
    ({"urls": []}, "urls"),
    ({"urls": ["127.0.0.1:8001"]}, "urls"),
    ({"urls": ["http://a:1", "http://a:1/v1"]}, "urls"),
    ({"urls": ["http://a:1"], "transport": "smoke"}, "transport"),
    ({"urls": ["http://a:1"], "timeout_s": 0}, "timeout_s"),
    ({"urls": ["http://a:1"], "bogus": 1}, "bogus"),
])
def test_a_bad_serving_section_is_refused_naming_the_field(tmp_path: Path, serving: dict[str, object], field: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(_cfg(serving=serving)))
    with pytest.raises(LearnerConfigError, match=rf"serving\.{field}"):
        load_train_config(path)


def test_serving_runs_episodes_in_process_only() -> None:
    with pytest.raises(ValueError, match="serving: .*runner: 'ray'"):
        TrainConfig.model_validate(_cfg(runner="ray"))


def test_a_named_key_variable_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    serving = ServingConfig(urls=["http://a:1"], api_key_env="AGENTENV_TEST_SERVING_KEY")
    monkeypatch.delenv("AGENTENV_TEST_SERVING_KEY", raising=False)
    with pytest.raises(LearnerConfigError, match="serving.api_key_env: .*AGENTENV_TEST_SERVING_KEY"):
        serving.api_key()
    monkeypatch.setenv("AGENTENV_TEST_SERVING_KEY", "k")
    assert serving.api_key() == "k"


def test_each_transport_gets_its_publisher_and_ipc_is_refused_naming_the_field(tmp_path: Path) -> None:
    from learner.weight_transfer import BroadcastPublisher

    disk = make_server_publisher(ServingConfig(urls=["http://a:1"]), tmp_path)
    assert isinstance(disk, DiskServerPublisher)
    for backend in ("gloo", "nccl"):
        pub = make_server_publisher(ServingConfig(urls=["http://a:1", "http://b:2/v1"], transport=backend), tmp_path)
        try:
            assert isinstance(pub, BroadcastPublisher) and pub.backend == backend
            assert pub.urls == ["http://a:1", "http://b:2"]
        finally:
            pub.close()
    # CUDA IPC handles never travel over HTTP: a config asking for them is refused at load, naming the field
    with pytest.raises(ValidationError, match="transport"):
        ServingConfig(urls=["http://a:1"], transport="ipc")  # type: ignore[arg-type]


def test_a_distill_config_takes_a_served_student(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "distill.yaml").read_text())
    data["serving"] = SERVING
    data["distill"]["teachers"] = str((EXAMPLES / data["distill"]["teachers"]).resolve())
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg, _ = load_distill_config(path)
    assert cfg.serving is not None and cfg.serving.model == "student"


def test_disk_writes_each_run_under_weights_dir_when_given(tmp_path: Path) -> None:
    from learner.serving import DiskServerPublisher

    default = make_server_publisher(ServingConfig(urls=["http://a:1"]), tmp_path / "run" / "served-2026")
    given = make_server_publisher(ServingConfig(urls=["http://a:1"], weights_dir=str(tmp_path / "shared")),
                                  tmp_path / "run" / "served-2026")
    assert isinstance(default, DiskServerPublisher) and isinstance(given, DiskServerPublisher)
    assert default.checkpoint.root == tmp_path / "run" / "served-2026"
    assert given.checkpoint.root == tmp_path / "shared" / "served-2026"


def test_the_initial_checkpoint_from_a_shell_is_the_learners_architecture(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "init"
    subprocess.run([sys.executable, "-m", "learner.serving", str(EXAMPLES / "served.yaml"), str(out)], cwd=root,
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(root)})
    config = json.loads((out / "config.json").read_text())
    model = load_train_config(EXAMPLES / "served.yaml").model
    assert (config["hidden_size"], config["num_hidden_layers"]) == (model.hidden_size, model.num_layers)
    assert (out / "tokenizer.json").is_file()
