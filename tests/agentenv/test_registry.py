"""Registry: folders at any depth, Python tasks, duplicates, unknown ids, paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentenv.errors import AgentEnvError, TaskNotFound
from agentenv.registry import Registry, default_registry, get_task
from agentenv.scaffold import scaffold
from agentenv.task import FolderTask, PythonTask
from agentenv.types import Domain

pytestmark = pytest.mark.unit


class Hello(PythonTask):
    id = "general/hello"
    domain = Domain.GENERAL
    instruction = "Say hello."
    verifiers = [{"type": "answer", "expected": "hello"}]

    def oracle(self, sandbox, variant):
        return "hello"


def test_folders_classes_domains_and_broken_folders(tmp_path: Path) -> None:
    scaffold("alpha", "coding", tmp_path / "coding")
    scaffold("beta", "agent", tmp_path / "agent")
    (tmp_path / "coding" / "broken").mkdir()
    (tmp_path / "coding" / "broken" / "task.yaml").write_text("domain: nope\n")
    reg = Registry()
    reg.add(str(tmp_path), "test")
    reg.add(Hello, "test")
    assert reg.ids() == ["alpha", "beta", "general/hello"]
    assert reg.ids("agent") == ["beta"]
    assert isinstance(reg.get("alpha"), FolderTask) and isinstance(reg.get("general/hello"), Hello)
    assert len(reg.errors) == 1
    with pytest.raises(ValueError, match="domain: expected one of"):
        reg.get("broken")  # a broken folder reports its own error when asked for


def test_unknown_id_suggests_the_closest(tmp_path: Path) -> None:
    reg = Registry()
    reg.add(lambda: tmp_path, "test")  # a callable folder provider, like an entry point value
    scaffold("gamma", "general", tmp_path)
    reg.add(lambda: tmp_path, "test")
    with pytest.raises(TaskNotFound, match=r"no task 'gama' \(did you mean 'gamma'\?\)") as info:
        reg.get("gama")
    assert isinstance(info.value, LookupError)


def test_duplicate_ids_name_both_sources(tmp_path: Path) -> None:
    scaffold("same", "coding", tmp_path / "a")
    scaffold("same", "coding", tmp_path / "b")
    reg = Registry()
    reg.add(tmp_path / "a", "first")
    with pytest.raises(AgentEnvError, match="defined twice"):
        reg.add(tmp_path / "b", "second")


def test_get_task_accepts_a_folder_path(tmp_path: Path) -> None:
    folder = scaffold("delta", "coding", tmp_path)
    task = get_task(str(folder))
    assert task.id == "delta" and task.variant(1) == task.variant(1)


def test_default_registry_loads_builtins_without_errors() -> None:
    reg = default_registry(refresh=True)
    assert not reg.errors, reg.errors


def test_broken_entry_points_are_logged_and_kept_as_errors(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import importlib.metadata as md

    import agentenv.registry as registry

    broken = [
        md.EntryPoint("missing_pkg", "no_such_pkg_for_agentenv.tasks:TASKS", registry.ENTRY_POINT_GROUP),
        md.EntryPoint("bad_value", "not a valid value :: here", registry.ENTRY_POINT_GROUP),
        md.EntryPoint("not_a_task", "builtins:len", registry.ENTRY_POINT_GROUP),  # a callable returning no folder
    ]
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group=None: broken if group == registry.ENTRY_POINT_GROUP else [])
    with caplog.at_level("WARNING", logger="agentenv.registry"):
        reg = default_registry(refresh=True)
    try:
        logged = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
        assert "missing_pkg" in logged and "ModuleNotFoundError" in logged and "no_such_pkg_for_agentenv" in logged
        assert "bad_value" in logged and "not_a_task" in logged
        assert {"entry point missing_pkg", "entry point bad_value", "entry point not_a_task"} <= set(reg.errors)
        assert reg.ids(), "the built-ins still load"
    finally:
        monkeypatch.undo()
        default_registry(refresh=True)


def test_unreadable_entry_point_metadata_is_logged(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import agentenv.registry as registry

    def boom(group: str | None = None) -> list[object]:
        raise ValueError("malformed entry_points.txt in some_dist-1.0.dist-info")

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", boom)
    with caplog.at_level("WARNING", logger="agentenv.registry"):
        reg = default_registry(refresh=True)
    try:
        assert any("malformed entry_points.txt" in r.getMessage() for r in caplog.records)
        assert reg.ids() and reg.errors
    finally:
        monkeypatch.undo()
        default_registry(refresh=True)
