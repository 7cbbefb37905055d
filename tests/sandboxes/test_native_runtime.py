"""The Python native-program runtime recipe (no Docker): the lock file pins everything, and the hash follows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxes import native_runtime
from sandboxes.native_images import RECIPES
from sandboxes.native_runtime import PythonRecipe
from sandboxes.images import ImageBuildError

pytestmark = pytest.mark.unit


def test_the_kimi_lock_pins_every_distribution_with_a_sha256() -> None:
    recipe = RECIPES["kimi"]
    assert isinstance(recipe, PythonRecipe)
    pins = [line for line in recipe.lock_text().splitlines() if line and not line.startswith("#")]
    assert "kimi-cli==1.51.0" in [p.split()[0] for p in pins]
    assert all("==" in p and "--hash=sha256:" in p for p in pins)
    assert recipe.tag().startswith("agentenv-cli-runtime-kimi:")


def test_a_lock_without_the_pin_or_a_hash_is_refused_naming_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(native_runtime, "LOCK_DIR", tmp_path)
    recipe = PythonRecipe("x", "x-cli", "1.0", "x.txt", "x")
    with pytest.raises(ImageBuildError, match="x.txt: the lock file"):
        recipe.lock_text()
    (tmp_path / "x.txt").write_text("other==2 --hash=sha256:00\n")
    with pytest.raises(ImageBuildError, match=r"x.txt: expected a line pinning x-cli==1.0"):
        recipe.lock_text()
    (tmp_path / "x.txt").write_text("x-cli==1.0 --hash=sha256:00\nloose==3\n")
    with pytest.raises(ImageBuildError, match="needs --hash=sha256"):
        recipe.lock_text()
    (tmp_path / "x.txt").write_text("x-cli==1.0 --hash=sha256:00\n")
    first = recipe.tag()
    (tmp_path / "x.txt").write_text("x-cli==1.0 --hash=sha256:01\n")
    assert recipe.tag() != first  # a changed lock is a new runtime image
