"""``agentenv image build-native`` and its older name ``build-cli``, kept working but not listed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentenv.cli.image import app

pytestmark = pytest.mark.unit


def test_build_native_is_listed_and_build_cli_is_its_hidden_alias() -> None:
    runner = CliRunner()
    listing = runner.invoke(app, ["--help"])
    assert listing.exit_code == 0 and "build-native" in listing.output and "build-cli" not in listing.output
    for name in ("build-native", "build-cli"):
        refused = runner.invoke(app, [name, "nope"])  # refused before Docker is asked: both name the same command
        assert refused.exit_code == 2, (name, refused.output)
        assert "expected one of claude, codex, kimi, got 'nope'" in refused.output, (name, refused.output)
