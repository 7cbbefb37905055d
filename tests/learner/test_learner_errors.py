"""The exception tree of ``learner``: one base, a built-in under each class, all exported (like httpx's
test_exported_members), and the raise sites use it with messages naming the argument."""

from __future__ import annotations

import builtins
import inspect
from pathlib import Path

import pytest

import learner.errors as errors
from learner.errors import CheckpointNotFound, LearnerConfigError, LearnerError, ShapeError
from learner.packing import first_fit_decreasing
from learner.train_config import load_train_config
from learner.types import TrainItem
from rollout.errors import ConfigError

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


@pytest.mark.parametrize("name", sorted(set(errors.__all__) - {"LearnerError"}))
def test_every_exception_has_the_base_and_a_builtin(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, LearnerError)
    builtin = [b.__name__ for b in cls.__mro__ if b in _BUILTIN_ERRORS]
    assert builtin, f"{name}: expected a built-in exception base besides Exception, got MRO {cls.__mro__}"
    assert cls.__doc__, f"{name}: expected a docstring saying when it is raised"


def test_config_error_is_also_rollouts() -> None:
    """The CLI catches ``rollout.errors.ConfigError`` for both kinds of config."""
    assert issubclass(LearnerConfigError, ConfigError)
    assert issubclass(LearnerConfigError, ValueError)


def test_raise_sites_use_the_tree_and_name_the_argument(tmp_path: Path) -> None:
    with pytest.raises(ShapeError, match=r"'s0': expected 2 entries .* got lengths \{'loss_mask': 1\}"):
        TrainItem((1, 2), (0.0, 0.0), (1,), 1.0, sample_id="s0")
    with pytest.raises(LearnerConfigError, match="capacity must be >= 1, got 0"):
        first_fit_decreasing([1], 0)
    with pytest.raises(ShapeError, match="sample 0 has 9 tokens but a micro-batch holds 8"):
        first_fit_decreasing([9], 8)
    with pytest.raises(LearnerConfigError, match=r"missing.yaml: cannot read the config file \(no such file\); expected a readable YAML file"):
        load_train_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_id: r\nno_such_field: 1\n")
    with pytest.raises(ConfigError, match="bad.yaml: no_such_field"):
        load_train_config(bad)
    from learner.trainer import Trainer

    with pytest.raises(CheckpointNotFound) as info:
        Trainer.load(object.__new__(Trainer), tmp_path)  # type: ignore[arg-type]
    assert isinstance(info.value, FileNotFoundError) and str(tmp_path) in str(info.value)
