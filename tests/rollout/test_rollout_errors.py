"""The exception tree of ``rollout``: one base, a built-in under each class, all exported (like httpx's
test_exported_members), and the raise sites use it with messages naming the argument."""

from __future__ import annotations

import builtins
import inspect

import pytest

import rollout.errors as errors
from rollout.config import ConfigError as ReExportedConfigError
from rollout.errors import ConfigError, RecordError, RolloutError, StalenessError, StoreError, UnknownFilter
from rollout.scheduler import Scheduler
from rollout.scheduler import WorkerLost as ReExportedWorkerLost
from rollout.store import TrajectoryStore
from rollout.types import Sample, Trajectory

pytestmark = pytest.mark.unit

_BUILTIN_ERRORS = tuple(
    v for v in vars(builtins).values()
    if isinstance(v, type) and issubclass(v, Exception) and v is not Exception
)


def _classes() -> dict[str, type[BaseException]]:
    return {
        name: obj for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }


def test_all_lists_exactly_the_public_exceptions() -> None:
    public = {name for name in _classes() if not name.startswith("_")}
    assert set(errors.__all__) == public
    assert all(hasattr(errors, name) for name in errors.__all__)


@pytest.mark.parametrize("name", sorted(set(errors.__all__) - {"RolloutError"}))
def test_every_exception_has_the_base_and_a_builtin(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, RolloutError)
    builtin = [b.__name__ for b in cls.__mro__ if b in _BUILTIN_ERRORS]
    assert builtin, f"{name}: expected a built-in exception base besides Exception, got MRO {cls.__mro__}"
    assert cls.__doc__, f"{name}: expected a docstring saying when it is raised"


def test_modules_reexport_the_tree_classes_not_copies() -> None:
    assert ReExportedConfigError is ConfigError
    assert ReExportedWorkerLost is errors.WorkerLost


def test_raise_sites_use_the_tree_and_name_the_argument(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="workers: expected at least one worker, got none"):
        Scheduler([], [], None)  # type: ignore[arg-type]
    with pytest.raises(RecordError, match=r"loss_mask: expected only 0 and 1, got \[2\]"):
        Sample((1, 2), (0.0, 0.0), (0, 2))
    with pytest.raises(RecordError, match="episode_id: expected a non-empty id, got ''"):
        Trajectory(
            episode_id="", run_id="r", task_id="t", domain="d", seed=0, harness="h", effort="low",
            policy_version=0, status="ok", reward=0.0,  # type: ignore[arg-type]
        )
    store = TrajectoryStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    with pytest.raises(StoreError, match="size must be >= 1, got 0"):
        store.groups("r", size=0)
    with pytest.raises(UnknownFilter) as info:
        store.export(tmp_path / "x.jsonl", format="jsonl", colour="red")  # type: ignore[call-arg]
    assert isinstance(info.value, TypeError) and "colour" in str(info.value)
    with pytest.raises(ValueError):  # callers that only know the built-in still catch it
        TrajectoryStore("mysql://nowhere/db")
    assert issubclass(StalenessError, ValueError)
