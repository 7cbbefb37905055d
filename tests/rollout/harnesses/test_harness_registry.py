"""``list_harnesses`` / ``get_harness`` with broken third-party entry-point metadata."""

from __future__ import annotations

import pytest

import rollout.harnesses as harnesses

pytestmark = pytest.mark.unit


def test_unreadable_entry_point_metadata_is_logged_and_keeps_the_builtins(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(group: str | None = None) -> list[object]:
        raise ValueError("malformed entry_points.txt in some_dist-1.0.dist-info")

    monkeypatch.setattr(harnesses, "entry_points", boom)
    with caplog.at_level("WARNING", logger="rollout.harnesses"):
        names = harnesses.list_harnesses()
    assert names == sorted(harnesses.BUILTIN_HARNESSES)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("agentenv.harnesses" in m and "malformed entry_points.txt" in m for m in warnings), warnings
