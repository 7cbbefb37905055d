"""The import graph stays a tree where it should: no circle in ``rollout/``, no borrowed private name anywhere.

Read from the source (``ast``), not from ``sys.modules``, so an import inside a
function or under ``if TYPE_CHECKING:`` counts like any other: those are how a
circle used to be held apart (``rollout.episode``, ``rollout.cli_episode`` and
``rollout.policy.scripted`` imported each other that way), and a circle held
apart is still one. Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``
first, so the packages above an imported module are edges too.

Private names: ``from X import _name`` across modules, in the library packages
and the tests. A name another module
needs is public: give it a name without the underscore where it is defined.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("sandboxes", "agentenv", "rollout", "learner", "teachers", "distill")
CHECKED = (*LIBRARY, "benches", "examples", "tests")
NO_CYCLES = ("rollout",)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources(packages: tuple[str, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an ``from ... import`` names (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(path: Path, module: str) -> Iterator[tuple[ast.AST, str, str | None]]:
    """(node, imported module, imported name or None) for every import in the file, at any depth."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, is_package)
            for alias in node.names:
                yield node, source, alias.name


def import_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of ``packages`` it imports (module level, in functions, under TYPE_CHECKING)."""
    modules = _sources(packages)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _node, source, name in _imports(path, module):
            target = resolve(f"{source}.{name}" if name and f"{source}.{name}" in modules else source)
            if target is None or target == module:
                continue
            graph[module].add(target)
            parent = target.rpartition(".")[0]
            while parent:  # the packages above run first; a module's own packages are already importing
                if parent in modules and not module.startswith(parent + "."):
                    graph[module].add(parent)
                parent = parent.rpartition(".")[0]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def borrowed_private_names(packages: tuple[str, ...]) -> list[str]:
    """``path:line: module._name`` for every ``from module import _name`` that takes another module's private name."""
    found: list[str] = []
    for module, path in _sources(packages).items():
        for node, source, name in _imports(path, module):
            if name is None or source == module:
                continue
            if name.startswith("_") and not name.startswith("__"):
                found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}: {source}.{name}")
    return found


@pytest.mark.parametrize("package", NO_CYCLES)
def test_the_package_imports_in_no_circle(package: str) -> None:
    assert cycles(import_graph((package,))) == [], "modules importing each other (at any depth, TYPE_CHECKING included)"


def test_no_module_takes_another_modules_private_names() -> None:
    assert borrowed_private_names(CHECKED) == [], "make the name public where it is defined"


def test_the_checks_see_a_circle_held_apart_and_a_borrowed_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.c import _hidden\n")
    (pkg / "c.py").write_text("import pkg.a\n_hidden = 1\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert cycles(import_graph(("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert borrowed_private_names(("pkg",)) == ["pkg/b.py:2: pkg.c._hidden"]
