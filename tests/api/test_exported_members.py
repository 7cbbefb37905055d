"""Every library package's public face, pinned: ``__all__`` changes only on purpose, every name in it
resolves to the module the face names, and importing the faces stays cheap (no torch, Ray, Docker or
transformers until a name is used)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PUBLIC = {
    "sandboxes": [
        "DockerBackend", "ExecResult", "FileEntry", "LocalBackend", "Sandbox", "SandboxBackend",
        "SandboxError", "SandboxLost", "SandboxPool", "SandboxSpec", "SandboxTimeout", "SnapshotError",
        "SnapshotKind", "SnapshotRef", "SpecError", "UnknownBackend", "ensure_base_image", "make_backend",
    ],
    "agentenv": [
        "AgentEnvError", "BackendNotFound", "ConfigError", "Domain", "Episode", "FolderTask",
        "HarnessNotFound", "Limits", "PythonTask", "Task", "TaskNotFound", "TaskSpec", "TaskSpecError",
        "Variant", "Verifier", "VerifierResult", "check_task", "format_loc", "get_task", "list_tasks",
        "load_yaml_config", "make", "register",
    ],
    "learner": [
        "CheckpointPublisher", "LearnerError", "LearnerGroup", "LossConfig", "PolicyModel", "ServerReloadPublisher",
        "TrainBatch", "TrainConfig", "TrainItem", "TrainLoop", "Trainer", "TrainerConfig", "WeightPublisher",
        "group_advantages", "load_train_config", "policy_loss", "run_training",
    ],
    "rollout": [
        "EpisodeContext", "EpisodeLost", "EpisodeRequest", "EpisodeRunner", "FleetConfig", "Generation",
        "InProcessRunner", "Policy", "PolicyError", "RayRunner", "RolloutConfig", "RolloutError",
        "RolloutRunner", "RolloutSettings", "Sample", "SamplingParams", "Status", "Trajectory",
        "TrajectoryStore", "Turn", "get_harness", "list_harnesses", "load_config", "run_rollout",
    ],
    "teachers": [
        "DOMAINS", "EFFORTS", "EndpointScorer", "HFScorer", "LoRAScorer", "RoutingScorer", "ScoreRequest",
        "ScoreResult", "TeacherError", "TeacherGridConfig", "TeacherScorer", "build_scorer", "cell_key",
    ],
    "distill": [
        "DistillConfig", "DistillError", "MOPDConfig", "load_distill_config", "mopd_advantage", "route",
        "run_distill", "score_samples", "token_advantages",
    ],
}

@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_all_is_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__all__ == PUBLIC[package], f"{package}.__all__ changed: update PUBLIC on purpose"
    assert dir(module) == PUBLIC[package]


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_every_name_resolves_to_its_defining_module(package: str) -> None:
    module = importlib.import_module(package)
    for name in PUBLIC[package]:
        obj = getattr(module, name)
        source = module._EXPORTS[name]
        assert name in importlib.import_module(source).__all__, f"{package}.{name}: not in {source}.__all__"
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__.split(".")[0] == package, f"{package}.{name} is defined in {obj.__module__}"


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    import rollout

    with pytest.raises(AttributeError, match="'rollout' has no attribute 'EpisodeRuner'"):
        rollout.EpisodeRuner  # noqa: B018


def test_importing_the_faces_loads_no_heavy_dependency() -> None:
    heavy = ["torch", "ray", "docker", "transformers"]
    code = (
        "import sys\n"
        f"import {', '.join(sorted(PUBLIC))}\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
