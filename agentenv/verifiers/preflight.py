"""What the grading sandbox holds that could steer pytest, looked at before any of it runs (runs in the sandbox).

Staged by the unit-tests verifier and run as ``python3 -I -S preflight.py WORKDIR
[--scan]`` ahead of pytest in the same exec: no ``site`` processing, no
``PYTHON*`` variables, so no ``.pth`` file or ``sitecustomize`` of the
workspace or of a writable site directory runs in it. Self contained
(standard library only, Python 3.8+). It prints one JSON line:

``hooks``
    start-up hook files (``*.pth``, ``sitecustomize*``, ``usercustomize*``) in
    the interpreter's start-up directories, each with its sha256 and whether
    the sandbox user owns it or can write it or its directory ("reachable").
``writable``
    start-up directories and test-runner packages (``pytest``, ``_pytest``,
    ``pluggy``) the sandbox user can write: what a hook-file scan cannot vouch for.
``neutralised``
    pytest configuration and start-up hooks in the workspace (``conftest.py``,
    ``pytest.ini``, ``tox.ini``, a ``setup.cfg`` / ``pyproject.toml`` pytest
    section, ``sitecustomize.py``, ``*.pth``): our invocation ignores them, and
    the verifier records them.
``tampering`` (with ``--scan``)
    places in the workspace's Python files that inspect their caller or the
    test runner (see ``scan_source``). This cannot be closed in principle, so it
    is a detector, and its findings are flags for a person or a spec option.

``scan_source`` is importable on the host for tests.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys

#: dotted call / attribute names that look at the caller, the runner or the process around the code
SUSPECT_ATTRS = {
    "sys._getframe": "inspects its caller's frame",
    "sys._current_frames": "inspects other frames",
    "sys.settrace": "installs a tracer",
    "sys.setprofile": "installs a profiler",
    "sys.addaudithook": "installs an audit hook",
    "threading.settrace": "installs a tracer",
    "threading.setprofile": "installs a profiler",
    "inspect.stack": "inspects the call stack",
    "inspect.currentframe": "inspects its caller's frame",
    "inspect.getouterframes": "inspects the call stack",
    "inspect.trace": "inspects the call stack",
    "inspect.getframeinfo": "inspects a frame",
    "gc.get_objects": "walks every live object",
    "gc.get_referrers": "walks live objects",
    "gc.get_referents": "walks live objects",
    "os._exit": "ends the process without cleanup",
    "posix._exit": "ends the process without cleanup",
    "atexit.register": "runs code after the tests",
    "os.getppid": "looks at its parent process",
}
SUSPECT_IMPORTS = {"_pytest": "imports pytest internals", "ctypes": "can patch the interpreter", "pytest": "imports pytest"}
SUSPECT_STRINGS = {
    "/proc/self": "reads its own process from /proc",
    "/dev/fd": "reaches its file descriptors",
    "PYTEST_CURRENT_TEST": "detects that a test is running",
    "PYTEST_": "reads pytest's environment",
    "_pytest": "names pytest internals",
    "junit": "names the test report",
    "agentenv": "names the grader",
}
SUSPECT_EXACT_STRINGS = {"pytest", "_getframe", "settrace", "get_objects", "_exit", "stack", "currentframe"}
_HOOK_PREFIXES = ("sitecustomize", "usercustomize")
_RUNNER_PACKAGES = ("pytest", "_pytest", "pluggy")
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "dist-packages"}
MAX_FILES = 3000
MAX_FILE_BYTES = 1 << 20
MAX_FINDINGS = 50


def is_test_file(name: str) -> bool:
    base = os.path.basename(name)
    return base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py"


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, test_file: bool) -> None:
        self.path, self.test_file = path, test_file
        self.aliases: dict[str, str] = {}  # local name -> module or dotted name it stands for
        self.found: list[dict[str, object]] = []

    def _flag(self, node: ast.AST, what: str, why: str) -> None:
        self.found.append({"path": self.path, "line": getattr(node, "lineno", 0), "what": what, "why": why})

    def _import(self, node: ast.AST, module: str) -> None:
        top = module.split(".")[0]
        if top in SUSPECT_IMPORTS and not (top == "pytest" and self.test_file):
            self._flag(node, f"import {module}", SUSPECT_IMPORTS[top])

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
            self._import(node, alias.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self._import(node, module)
        for alias in node.names:
            dotted = f"{module}.{alias.name}"
            self.aliases[alias.asname or alias.name] = dotted
            if dotted in SUSPECT_ATTRS:
                self._flag(node, dotted, SUSPECT_ATTRS[dotted])
        self.generic_visit(node)

    def _dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self._dotted(node)
        if dotted in SUSPECT_ATTRS:
            self._flag(node, dotted, SUSPECT_ATTRS[dotted])
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        dotted = self.aliases.get(node.id)
        if dotted in SUSPECT_ATTRS and isinstance(node.ctx, ast.Load):  # ``from sys import _getframe`` then a call
            self._flag(node, dotted, SUSPECT_ATTRS[dotted])
        self.generic_visit(node)

    def _builtins_target(self, target: ast.AST) -> bool:
        base = target.value if isinstance(target, (ast.Attribute, ast.Subscript)) else None
        name = self._dotted(base) if base is not None else None
        return name in ("builtins", "__builtins__", "__builtin__")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if self._builtins_target(target):
                self._flag(node, "builtins assignment", "monkeypatches builtins")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if self._builtins_target(node.target):
            self._flag(node, "builtins assignment", "monkeypatches builtins")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = self._dotted(node.func)
        if func in ("setattr", "delattr") and node.args and self._dotted(node.args[0]) in ("builtins", "__builtins__"):
            self._flag(node, f"{func}(builtins, ...)", "monkeypatches builtins")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            text = node.value
            if text in SUSPECT_EXACT_STRINGS and not (text == "pytest" and self.test_file):
                self._flag(node, repr(text), "names the test runner or a frame/exit function by string")
            else:
                for needle, why in SUSPECT_STRINGS.items():
                    if needle in text:
                        self._flag(node, repr(text[:60]), why)
                        break
        self.generic_visit(node)


def scan_source(source: str, path: str = "<string>") -> list[dict[str, object]]:
    """Findings (``path``, ``line``, ``what``, ``why``) in one Python file; [] when it does not parse."""
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError):
        return []
    scanner = _Scanner(path, is_test_file(path))
    scanner.visit(tree)
    return scanner.found


def scan_tree(workdir: str) -> dict[str, object]:
    findings: list[dict[str, object]] = []
    files = 0
    truncated = False
    for top, dirs, names in os.walk(workdir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = os.path.join(top, name)
            files += 1
            if files > MAX_FILES:
                truncated = True
                break
            try:
                if not os.path.isfile(path) or os.path.getsize(path) > MAX_FILE_BYTES:
                    continue
                with open(path, "rb") as handle:
                    text = handle.read().decode("utf-8", "replace")
            except OSError:
                continue
            findings.extend(scan_source(text, os.path.relpath(path, workdir)))
        if truncated:
            break
    return {"findings": findings[:MAX_FINDINGS], "count": len(findings), "files": min(files, MAX_FILES), "truncated": truncated}


def _sha256(path: str) -> str:
    try:
        if os.path.isdir(path):
            return "dir:" + ",".join(sorted(os.listdir(path)))
        if not os.path.isfile(path):  # a FIFO would block the read
            return "special"
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return f"size:{os.path.getsize(path)}"
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError as exc:
        return f"error:{type(exc).__name__}"


def startup_dirs() -> list[str]:
    import site
    import sysconfig

    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # some virtualenvs' site module
        pass
    paths = sysconfig.get_paths()
    dirs += [paths.get("purelib", ""), paths.get("platlib", "")]
    seen: list[str] = []
    for d in dirs:
        if d and os.path.isdir(d) and d not in seen:
            seen.append(d)
    return seen


def scan_startup() -> dict[str, object]:
    uid = os.getuid()
    hooks: list[dict[str, object]] = []
    writable: list[str] = []
    for d in startup_dirs():
        dir_writable = os.access(d, os.W_OK)
        if dir_writable:
            writable.append(d)
        for pkg in _RUNNER_PACKAGES:
            candidate = os.path.join(d, pkg)
            if os.path.isdir(candidate) and os.access(candidate, os.W_OK):
                writable.append(candidate)
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if not (name.endswith(".pth") or name.startswith(_HOOK_PREFIXES)):
                continue
            path = os.path.join(d, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            reachable = dir_writable or st.st_uid == uid or os.access(path, os.W_OK)
            hooks.append({"path": path, "sha256": _sha256(path), "reachable": bool(reachable)})
    return {"hooks": hooks, "writable": writable}


def _has_pytest_section(path: str) -> bool:
    if not os.path.isfile(path):  # a FIFO named setup.cfg must not block the preflight
        return False
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    return "[tool:pytest]" in text or "[tool.pytest" in text or "[pytest]" in text


def neutralised(workdir: str) -> list[str]:
    """pytest configuration and start-up hooks the workspace carries (our invocation ignores every one)."""
    out: list[str] = []
    try:
        top = sorted(os.listdir(workdir))
    except OSError:
        return out
    for name in top:
        path = os.path.join(workdir, name)
        if name in ("pytest.ini", "tox.ini", "sitecustomize.py", "usercustomize.py") or name.endswith(".pth"):
            out.append(path)
        elif name in ("setup.cfg", "pyproject.toml") and _has_pytest_section(path):
            out.append(path)
    for root, dirs, names in os.walk(workdir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
        if "conftest.py" in names:
            out.append(os.path.join(root, "conftest.py"))
        if len(out) > MAX_FINDINGS:
            break
    return out[:MAX_FINDINGS]


def main(argv: list[str]) -> int:
    workdir = argv[0] if argv else "."
    report: dict[str, object] = {"preflight": 1, **scan_startup(), "neutralised": neutralised(workdir)}
    if "--scan" in argv[1:]:
        report["tampering"] = scan_tree(workdir)
    sys.stdout.write(json.dumps(report, sort_keys=True, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
