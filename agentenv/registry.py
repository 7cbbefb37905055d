"""Where tasks are found: the built-in suite, third-party packages, and plain folders.

Sources, in order (an id found twice is an error naming both places):

1. every folder under ``agentenv/tasks/builtin/`` holding a ``task.yaml`` (at any depth);
2. Python tasks the built-in package lists in ``agentenv.tasks.builtin.PYTHON_TASKS``;
3. the ``agentenv.tasks`` entry-point group. A value is either a folder (a
   ``str``/``Path``, or a callable returning one: a task folder, or a folder of
   task folders) or a ``Task`` subclass. In a package's ``pyproject.toml``::

       [project.entry-points."agentenv.tasks"]
       my_tasks = "my_pkg.tasks:TASKS_DIR"

4. tasks registered in-process with ``register``.

A task folder that fails to load does not hide the others: its error is kept
and raised when that id is asked for (and ``agentenv check --all`` reports it).
``get_task`` also accepts a path to a task folder, so every command takes
``PATH|ID``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv.errors import AgentEnvError, TaskNotFound, TaskSpecError, did_you_mean
from agentenv.spec import SPEC_FILE, load_spec
from agentenv.task import FolderTask
from agentenv.types import Domain, Task

ENTRY_POINT_GROUP = "agentenv.tasks"
BUILTIN_PACKAGE = "agentenv.tasks.builtin"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One known task: how to build it and where it came from (for messages)."""

    id: str
    domain: Domain | None
    source: str
    factory: Callable[[], Task]


class Registry:
    """An index of task ids. ``default_registry()`` is the one the CLI and ``make`` use."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self.errors: dict[str, TaskSpecError] = {}  # source (folder) -> why it did not load

    # ---------------------------------------------------------------- adding

    def add_folder_tree(self, root: Path, source: str) -> None:
        """Register ``root`` if it is a task folder, else every task folder below it."""
        root = Path(root)
        folders = [root] if (root / SPEC_FILE).is_file() else sorted(p.parent for p in root.rglob(SPEC_FILE))
        for folder in folders:
            if any(part.startswith((".", "_")) for part in folder.relative_to(root).parts):
                continue  # __pycache__, hidden folders, templates
            try:
                spec = load_spec(folder)
            except TaskSpecError as exc:
                self.errors[str(folder)] = exc
                continue
            self._add(Entry(spec.id, spec.domain, f"{source}: {folder}", _folder_factory(folder, spec)))

    def add_class(self, cls: type[Task], source: str) -> None:
        task_id = getattr(cls, "id", None)
        if not isinstance(task_id, str):
            raise TypeError(f"{source}: {cls.__qualname__} has no string class attribute 'id'")
        domain = getattr(cls, "domain", None)
        self._add(Entry(task_id, Domain(domain) if domain else None, f"{source}: {cls.__module__}.{cls.__qualname__}", cls))

    def add(self, obj: Any, source: str) -> None:
        """A ``Task`` subclass, a folder, or a callable returning a folder."""
        if isinstance(obj, type) and issubclass(obj, Task):
            self.add_class(obj, source)
        elif isinstance(obj, (str, Path)):
            self.add_folder_tree(Path(obj), source)
        elif callable(obj):
            self.add(obj(), source)
        elif isinstance(obj, Iterable):
            for item in obj:
                self.add(item, source)
        else:
            raise TypeError(f"{source}: expected a Task subclass or a folder path, got {type(obj).__name__}")

    def _add(self, entry: Entry) -> None:
        old = self._entries.get(entry.id)
        if old is not None and old.source != entry.source:
            raise AgentEnvError(f"task id {entry.id!r} is defined twice: {old.source} and {entry.source}")
        self._entries[entry.id] = entry

    # ---------------------------------------------------------------- reading

    def ids(self, domain: Domain | str | None = None) -> list[str]:
        want = Domain(domain) if domain is not None else None
        return sorted(i for i, e in self._entries.items() if want is None or e.domain == want)

    def entry(self, task_id: str) -> Entry:
        try:
            return self._entries[task_id]
        except KeyError:
            pass
        for folder, exc in self.errors.items():
            if Path(folder).name == task_id.rsplit("/", 1)[-1]:
                raise exc
        raise TaskNotFound(
            f"no task {task_id!r}{did_you_mean(task_id, self._entries)}; "
            f"{len(self._entries)} known (agentenv list shows them), or give a path to a task folder"
        )

    def get(self, task_id: str) -> Task:
        return self.entry(task_id).factory()


def _folder_factory(folder: Path, spec: Any) -> Callable[[], Task]:
    return lambda: FolderTask(folder, spec)


_DEFAULT: Registry | None = None
_EXTRA: list[tuple[Any, str]] = []


def default_registry(*, refresh: bool = False) -> Registry:
    """Built-ins, entry points and ``register``-ed tasks, discovered once per process."""
    global _DEFAULT
    if _DEFAULT is None or refresh:
        reg = Registry()
        _add_builtins(reg)
        _add_entry_points(reg)
        for obj, source in _EXTRA:
            reg.add(obj, source)
        _DEFAULT = reg
    return _DEFAULT


def _add_entry_points(reg: Registry) -> None:
    """Tasks of other packages. A broken entry point is kept as that source's error and logged,
    never silently dropped (its tasks would just be missing) and never fatal to the others."""
    try:
        eps = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # noqa: BLE001 - unreadable metadata of some installed package
        log.warning("cannot read the %r entry points (broken package metadata): %s: %s", ENTRY_POINT_GROUP, type(exc).__name__, exc)
        reg.errors[f"entry points {ENTRY_POINT_GROUP}"] = TaskSpecError(f"entry points {ENTRY_POINT_GROUP}: {type(exc).__name__}: {exc}")
        return
    for ep in eps:
        source = f"entry point {ep.name} = {ep.value}"
        try:
            obj = ep.load()
            reg.add(obj, source)
        except (TaskSpecError, TypeError) as exc:  # loaded, but not a task, a folder or a provider of one
            _broken_entry_point(reg, ep.name, source, exc)
        except AgentEnvError:
            raise  # an id defined twice: an error naming both places, as for any source
        except Exception as exc:  # noqa: BLE001 - importing third-party code can raise anything
            _broken_entry_point(reg, ep.name, source, exc)


def _broken_entry_point(reg: Registry, name: str, source: str, exc: BaseException) -> None:
    log.warning("agentenv.tasks %s cannot be loaded, its tasks are skipped: %s: %s", source, type(exc).__name__, exc)
    reg.errors[f"entry point {name}"] = TaskSpecError(f"{source}: {type(exc).__name__}: {exc}")


def _add_builtins(reg: Registry) -> None:
    try:
        package = importlib.import_module(BUILTIN_PACKAGE)
        root = Path(next(iter(package.__path__)))
    except (ImportError, StopIteration):
        root = Path(__file__).parent / "tasks" / "builtin"
        package = None
    if root.is_dir():
        reg.add_folder_tree(root, "built-in")
    for cls in getattr(package, "PYTHON_TASKS", ()) if package is not None else ():
        reg.add_class(cls, "built-in")


def register(obj: Any, source: str = "registered") -> Any:
    """Add a ``Task`` subclass or a folder to the default registry; usable as a class decorator."""
    _EXTRA.append((obj, source))
    if _DEFAULT is not None:
        _DEFAULT.add(obj, source)
    return obj


def get_task(task_id: str | Path) -> Task:
    """The task with this id, or the task folder at this path.

    Usage::

        task = get_task("coding/fix_bug")      # or get_task("./my_task")
    """
    path = Path(task_id)
    if (path / SPEC_FILE).is_file():
        return FolderTask(path)
    return default_registry().get(str(task_id))


def list_tasks(domain: Domain | str | None = None) -> list[Task]:
    """Every registered task (optionally of one domain), sorted by id."""
    reg = default_registry()
    return [reg.get(i) for i in reg.ids(domain)]


__all__ = ["ENTRY_POINT_GROUP", "Entry", "Registry", "default_registry", "get_task", "list_tasks", "register"]
